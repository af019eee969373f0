"""Decoding: greedy and beam search, ensembles, and word alignments from cross-attention."""
