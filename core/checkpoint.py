"""Open a checkpoint file a user named, with one-line errors for the usual mistakes; warn about a
ModelCheckpoint setting that would make last.ckpt a poor resume point."""

from __future__ import annotations

from collections.abc import Iterable
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


def stale_last_checkpoint_warnings(callbacks: Iterable[Any]) -> list[str]:
    """One line per `ModelCheckpoint(monitor=..., save_last=True or "link")` whose last.ckpt would go stale.

    Since Lightning 2.6 such a callback writes last.ckpt only when it also saves a top-k checkpoint,
    i.e. when the monitored metric improves; `fit --ckpt_path last.ckpt` would then restart from the
    best epoch and repeat the ones after it. The shipped configs keep a separate `filename: last`
    callback instead, which writes every epoch.
    """
    lines = []
    for cb in callbacks:
        # Read by attribute (a ModelCheckpoint or a subclass), so `core` needs no Lightning import.
        if getattr(cb, "save_last", None) and getattr(cb, "monitor", None) and getattr(cb, "save_top_k", -1) != -1:
            lines.append(
                f"ModelCheckpoint(monitor={cb.monitor!r}, save_last=true) rewrites last.ckpt only when "
                f"{cb.monitor} improves, so resuming from it repeats epochs; drop save_last and add a ModelCheckpoint "
                f"with filename: last (no monitor), as configs/*/demo.yaml do"
            )
    return lines
