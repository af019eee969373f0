"""StreamRec: the causal session recommender built on `core` (see issue "StreamRec")."""
