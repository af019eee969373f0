"""StreamRec's constants and shared defaults, in one place so data, model, metrics and CLIs agree."""

PAD_ID = 0
"""Item id 0 is padding in every batch and never a recommendation; real items are 1..num_items."""

MAX_LEN = 50
"""Default history length T: the most recent items a session model sees (SASRec's setting on Amazon sets)."""
