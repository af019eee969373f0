"""Lightning's checkpoint reading and writing, made safe: restricted unpickling, atomic files.

A kill or a full disk during a save leaves the previous checkpoint as it was, and nothing in `$TMPDIR`
(Lightning's own writer stages files there through fsspec)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from core.runtime.atomic import atomic_path
from core.runtime.checkpoint import load_checkpoint


class SafeCheckpointIO(TorchCheckpointIO):
    """Reads with `load_checkpoint` (weights only); writes atomically in the checkpoint's own folder.
    `written_by`: the command that writes this app's checkpoints, for error messages."""

    def __init__(self, written_by: str = "python -m <app> fit"):
        self.written_by = written_by

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError("SafeCheckpointIO takes no storage_options")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            torch.save(checkpoint, f)
            f.flush()
            os.fsync(f.fileno())  # the rename must not reach the disk before the data

    def load_checkpoint(self, path: Any, map_location: Any | None = None, weights_only: bool | None = None) -> Any:
        return load_checkpoint(path, self.written_by)
