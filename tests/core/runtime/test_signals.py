"""`core.runtime.signals`: a signal during training saves a checkpoint after the step in progress and ends `fit` with
128 + the signal's number; a second signal while saving changes nothing; under SLURM's auto-requeue Lightning's
handling holds. Also what the apps' preemption tests share: the callback that holds a fit at one step until
signalled (`WAITER`) and the reading of the stop line."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch import Callback
from lightning.pytorch.demos.boring_classes import BoringModel

from core.runtime.checkpoint import load_checkpoint
from core.runtime.cli import overwrite_refusal, resume_command, resume_point, without_ckpt_path
from core.runtime.signals import FILENAME, STOP_SIGNALS, StopOnSignal, StopRequested, handles_signals

# Holds the fit at one batch's end until the test says it has sent the signal: the signal lands in that step,
# whatever the machine's speed. Waits only in the child the test starts (PREEMPT_MARKER set).
WAITER = '''
import os, time
from pathlib import Path
from lightning.pytorch import Callback

class WaitForSignal(Callback):
    def __init__(self, epoch: int = {epoch}, batch: int = {batch}):
        self.epoch, self.batch = epoch, batch

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        marker = os.environ.get("PREEMPT_MARKER")
        if marker and (trainer.current_epoch, batch_idx) == (self.epoch, self.batch):
            Path(marker).touch()
            while not Path(marker + ".sent").exists():
                time.sleep(0.01)
'''


def stop_line(stderr: str) -> re.Match:
    """The line a stopped fit ends with, in groups: signal, epoch, step, checkpoint, command; fails without one."""
    found = re.search(r"^fit stopped by (\w+) in epoch (\d+) at step (\d+): saved (\S+); resume with: (.+)$",
                      stderr, re.MULTILINE)
    assert found, stderr[-3000:]
    return found


class RaiseAt(Callback):
    """Sends this process `signum` at the end of training batch `batch` (and again while the checkpoint is saved)."""

    def __init__(self, signum: int, batch: int = 3, again_while_saving: bool = False):
        self.signum, self.batch, self.again = signum, batch, again_while_saving

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx == self.batch:
            signal.raise_signal(self.signum)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        if self.again:
            signal.raise_signal(self.signum)


def _fit(tmp_path: Path, *callbacks: Callback) -> L.Trainer:
    trainer = L.Trainer(max_epochs=1, limit_train_batches=10, limit_val_batches=0, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path, callbacks=[*callbacks, StopOnSignal()])
    trainer.fit(BoringModel())
    return trainer


@pytest.mark.parametrize("signum", STOP_SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_a_signal_saves_after_the_step_and_stops_with_128_plus_its_number(tmp_path: Path, signum: int) -> None:
    before = signal.getsignal(signum)
    with pytest.raises(StopRequested) as stop:
        _fit(tmp_path, RaiseAt(signum))
    assert stop.value.code == 128 + signum
    assert (stop.value.signal_name, stop.value.epoch, stop.value.step) == (signal.Signals(signum).name, 0, 4)
    assert Path(stop.value.ckpt_path) == tmp_path / "checkpoints" / FILENAME
    assert load_checkpoint(stop.value.ckpt_path, "fit")["global_step"] == 4  # the step the signal came in
    assert signal.getsignal(signum) == before  # put back once fit is over


def test_a_second_signal_while_saving_leaves_the_checkpoint_whole(tmp_path: Path) -> None:
    with pytest.raises(StopRequested) as stop:
        _fit(tmp_path, RaiseAt(signal.SIGTERM, again_while_saving=True))
    assert stop.value.code == 143
    state = load_checkpoint(stop.value.ckpt_path, "fit")
    assert state["global_step"] == 4 and all(torch.isfinite(v).all() for v in state["state_dict"].values())
    assert not list((tmp_path / "checkpoints").glob(".*.tmp"))


def test_without_a_signal_fit_ends_as_usual(tmp_path: Path) -> None:
    trainer = _fit(tmp_path)
    assert trainer.global_step == 10 and not (tmp_path / "checkpoints" / FILENAME).exists()


def test_slurm_auto_requeue_keeps_lightnings_handlers(tmp_path: Path) -> None:
    """Lightning's SLURM requeue (an hpc checkpoint and `scontrol requeue` on the requeue signal) is left alone."""
    def trainer(environment: SLURMEnvironment) -> L.Trainer:
        return L.Trainer(plugins=[environment], accelerator="cpu", devices=1, logger=False, default_root_dir=tmp_path)

    assert not handles_signals(trainer(SLURMEnvironment(auto_requeue=True)))
    assert handles_signals(trainer(SLURMEnvironment(auto_requeue=False)))
    assert handles_signals(L.Trainer(accelerator="cpu", devices=1, logger=False, default_root_dir=tmp_path))


def test_resume_command_replaces_the_ckpt_path_and_quotes() -> None:
    assert without_ckpt_path(["fit", "--ckpt_path", "a.ckpt", "-c", "x.yaml", "--ckpt_path=b.ckpt"]) == \
        ["fit", "-c", "x.yaml"]
    command = resume_command("python -m streamrec", ["fit", "--config", "my runs.yaml", "--ckpt_path", "old.ckpt"],
                             Path.cwd() / "runs" / "stopped.ckpt")
    assert command == "python -m streamrec fit --config 'my runs.yaml' --ckpt_path runs/stopped.ckpt"


def test_a_refused_fit_names_the_stopped_checkpoint_where_it_is_newer(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    assert resume_point(folder) is None
    (folder / "last.ckpt").write_bytes(b"")
    assert resume_point(folder) == folder / "last.ckpt"
    (folder / FILENAME).write_bytes(b"")
    os.utime(folder / "last.ckpt", (1, 1))  # stopped after the last whole epoch
    assert resume_point(folder) == folder / FILENAME
    assert overwrite_refusal([folder], tmp_path, None).endswith(
        f"resume it with --ckpt_path {folder / FILENAME}, or pass --overwrite to replace them")
    os.utime(folder / FILENAME, (0, 0))  # a stop of an earlier fit, epochs before last.ckpt
    assert resume_point(folder) == folder / "last.ckpt"
