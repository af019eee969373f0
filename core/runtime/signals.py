"""Stopping `fit` on SIGTERM, SIGINT or SIGUSR1 with a checkpoint that resumes exactly where it stopped. `StopOnSignal`
finishes the training step in progress, saves a checkpoint of the point after it, and ends `fit` with `StopRequested`, a
`SystemExit` of status 128 + the signal's number, so a scheduler does not read the run as finished. The fit is
abandoned, not stopped with `trainer.should_stop`: that would run the epoch's validation and end-of-epoch hooks, whose
`last.ckpt` would claim a partly trained epoch.

The handlers replace Lightning's own from the start of training, except under SLURM with `auto_requeue`
(Lightning saves an `hpc_ckpt` and requeues the job itself), with more than one process (each rank would
stop at its own step), or outside the main thread (Python allows handlers there only)."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch import Callback, LightningModule, Trainer

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
FILENAME = "stopped.ckpt"  # written beside the run's other checkpoints

log = logging.getLogger(__name__)


class StopRequested(SystemExit):
    """`fit` stopped on `signum` in `epoch` (from 0) after `step` optimizer steps, all saved in `ckpt_path`; its
    exit status is 128 + `signum`, as a shell's."""

    def __init__(self, signum: int, ckpt_path: str, epoch: int, step: int):
        super().__init__(128 + signum)
        self.signum, self.ckpt_path, self.epoch, self.step = signum, ckpt_path, epoch, step

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name


def slurm_requeues(trainer: Trainer) -> bool:
    """Whether Lightning requeues the SLURM job on the requeue signal (`SLURMEnvironment(auto_requeue=True)`)."""
    environment = trainer._accelerator_connector.cluster_environment  # what Lightning's signal connector reads too
    return isinstance(environment, SLURMEnvironment) and environment.auto_requeue


def handles_signals(trainer: Trainer) -> bool:
    """Whether `StopOnSignal` installs its handlers for `trainer`'s fit (see the module docstring)."""
    return (not slurm_requeues(trainer) and trainer.world_size == 1
            and threading.current_thread() is threading.main_thread())


class StopOnSignal(Callback):
    """On SIGTERM, SIGINT or SIGUSR1 during training: save `FILENAME` after the current step, raise `StopRequested`.

    Args:
        dirpath: where to save (default: the first checkpoint callback's folder, or `default_root_dir/checkpoints`)."""

    def __init__(self, dirpath: str | Path | None = None):
        self.dirpath = dirpath
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.received = None
        if not handles_signals(trainer):
            return
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum
            log.warning(f"{signal.Signals(signum).name} received: stopping after the current training step")
        else:  # the checkpoint may be being written: let it finish
            log.warning(f"{signal.Signals(signum).name} received again: already stopping, the checkpoint is saved "
                        "first")

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.received is None:
            return
        path = Path(self.dirpath) if self.dirpath is not None else self.checkpoint_folder(trainer)
        ckpt_path = str(path / FILENAME)
        trainer.save_checkpoint(ckpt_path, weights_only=False)
        raise StopRequested(self.received, ckpt_path, trainer.current_epoch, trainer.global_step)

    @staticmethod
    def checkpoint_folder(trainer: Trainer) -> Path:
        return next((Path(cb.dirpath) for cb in trainer.checkpoint_callbacks if getattr(cb, "dirpath", None)),
                    Path(trainer.default_root_dir) / "checkpoints")

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._restore()

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._restore()

    def _restore(self) -> None:
        # Only where ours is still installed: Lightning's teardown may already have put back the ones before it.
        for signum, previous in self._previous.items():
            if signal.getsignal(signum) == self._handle:
                signal.signal(signum, previous)
        self._previous = {}
