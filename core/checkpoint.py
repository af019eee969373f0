"""Open a checkpoint file a user named, with one-line errors for the usual mistakes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def read_checkpoint_file(path: str | Path, written_by: str) -> Any:
    """`torch.load` of `path` on CPU; a missing or unreadable file is a ValueError/FileNotFoundError naming it.

    Args:
        path: the file the user passed.
        written_by: the command that writes such checkpoints (`python -m translate fit`), for the hint.

    The caller checks that the content is its own kind of checkpoint: only it knows which keys it needs.
    `weights_only=False` because Lightning checkpoints hold hyperparameters and vocabularies, not only
    tensors; load checkpoints you trust.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: checkpoint not found; pass the .ckpt written by `{written_by}`")
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # noqa: BLE001 - any unreadable file is the same user mistake
        raise ValueError(f"{path}: not a readable PyTorch checkpoint ({type(err).__name__})") from None
