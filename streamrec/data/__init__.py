"""StreamRec data: interaction logs -> item vocabulary -> splits -> padded causal batches, and the DataModule."""
