"""Translate's network (`transformer`) and its training logic (`module`)."""
