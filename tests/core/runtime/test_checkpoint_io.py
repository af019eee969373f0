"""SafeCheckpointIO writes atomically beside the checkpoint and reads through the safe loader; AppCLI saves
last.ckpt before best.ckpt."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

import core.runtime.checkpoint_io as checkpoint_io
from core.runtime.checkpoint_io import SafeCheckpointIO
from core.runtime.cli import checkpoints_last_first
from core.runtime.errors import UnsafeCheckpointError


def test_round_trip_and_refusal(tmp_path: Path, hostile, assert_refused) -> None:
    io = SafeCheckpointIO("python -m streamrec fit")
    state = {"state_dict": {"w": torch.arange(3.0)}, "epoch": 2, "hyper_parameters": {"lr": 1e-3}}
    io.save_checkpoint(state, tmp_path / "sub" / "last.ckpt")  # the folder is made
    loaded = io.load_checkpoint(tmp_path / "sub" / "last.ckpt")
    assert torch.equal(loaded["state_dict"]["w"], state["state_dict"]["w"]) and loaded["epoch"] == 2
    bad, marker = hostile("legacy")
    with pytest.raises(UnsafeCheckpointError) as err:
        io.load_checkpoint(bad)
    assert_refused(str(err.value), bad, marker)


def test_a_failed_save_keeps_the_previous_checkpoint(tmp_path: Path, monkeypatch) -> None:
    io = SafeCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"epoch": 1}, path)

    def disk_full(obj, f, *a, **kw):
        f.write(b"half a checkpoint")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint_io.torch, "save", disk_full)
    with pytest.raises(OSError):
        io.save_checkpoint({"epoch": 2}, path)
    monkeypatch.undo()
    assert io.load_checkpoint(path)["epoch"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_unmonitored_checkpoints_save_first() -> None:
    best = ModelCheckpoint(monitor="val_loss", filename="best")
    last = ModelCheckpoint(filename="last")
    stop = EarlyStopping(monitor="val_loss")
    assert checkpoints_last_first([stop, best, last]) == [stop, last, best]
    assert checkpoints_last_first([last, stop, best]) == [last, stop, best]
