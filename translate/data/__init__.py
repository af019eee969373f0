"""Translate data: parallel text, the subword vocabulary, token-bucketed batches and the DataModule."""
