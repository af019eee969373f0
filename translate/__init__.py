"""Translate: the encoder-decoder translator built on `core` (see issue "Translate")."""
