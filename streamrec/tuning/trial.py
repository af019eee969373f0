"""One trial: `fit`'s settings plus the trial's proposal, trained on the training split and scored on validation."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import lightning as L
import optuna
from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint
from optuna.trial import FrozenTrial, TrialState

from core.runtime.errors import InputError
from streamrec.lightning_cli import build_cli
from streamrec.model.module import StreamRecModule
from streamrec.tuning.options import TuneOptions
from streamrec.tuning.space import overrides, suggest

METRIC = "val_ndcg@10"
Progress = Callable[[str], None]


class ReportToStudy(Callback):
    """Reports validation NDCG@10 after each epoch to Optuna and stops a trial the pruner gives up on (ours: the
    optuna-integration callback pins its own Lightning import path and adds a dependency for a few lines)."""

    def __init__(self, trial: optuna.Trial, progress: Progress):
        self.trial, self.progress = trial, progress
        self.values: list[float] = []

    def on_validation_end(self, trainer: L.Trainer, pl_module: StreamRecModule) -> None:
        if trainer.sanity_checking or METRIC not in trainer.callback_metrics:
            return
        value = float(trainer.callback_metrics[METRIC])
        self.values.append(value)
        epoch = len(self.values)
        self.trial.report(value, epoch)
        self.progress(f"trial {self.trial.number}: epoch {epoch}, {METRIC} {value:.4f} (best {max(self.values):.4f})")
        if self.trial.should_prune():
            raise optuna.TrialPruned(f"{METRIC} {value:.4f} at epoch {epoch}")


def run_trial(trial: optuna.Trial, options: TuneOptions, n_heads: int, progress: Progress) -> float:
    """Train one proposal with `fit`'s settings; the best validation NDCG@10 over its epochs."""
    values = suggest(trial, options.params, n_heads)
    cli = build_cli([*options.config_args, *overrides(values)], run=False)  # fit's parser, links and checks
    base = cli.config["trainer"]
    report = ReportToStudy(trial, progress)
    stop = EarlyStopping(monitor=METRIC, mode="max", patience=options.patience, check_finite=False)
    keep = ModelCheckpoint(dirpath=options.trial_dir(trial.number), filename="best", monitor=METRIC, mode="max",
                           save_weights_only=True, enable_version_counter=False)
    trainer = L.Trainer(max_epochs=options.trial_epochs(base.max_epochs), max_time=base.max_time,
                        accelerator=base.accelerator, devices=1, precision=cli.trainer.precision,
                        callbacks=[stop, report, keep], logger=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0,
                        limit_train_batches=base.limit_train_batches, limit_val_batches=base.limit_val_batches)
    start = time.perf_counter()
    try:
        trainer.fit(cli.model, datamodule=cli.datamodule)  # fit and validation only: never the test split
    except Exception:  # a pruned or failed trial's epochs still count in the report
        # Not after an interruption (KeyboardInterrupt, SystemExit): a signal can land inside a storage call, whose
        # lock its session then keeps, and one more write would wait out the busy timeout. The cut trial stays
        # RUNNING, and a resumed search runs it again.
        _record_length(trial, report, start)
        raise
    _record_length(trial, report, start)
    if not report.values:
        raise InputError(f"no {METRIC} was logged; tune needs validation every epoch and 10 in " "model.evaluation.ks")
    best = max(report.values)
    trial.set_user_attr("best_epoch", report.values.index(best) + 1)
    return best


def _record_length(trial: optuna.Trial, report: ReportToStudy, start: float) -> None:
    trial.set_user_attr("epochs", len(report.values))
    trial.set_user_attr("minutes", (time.perf_counter() - start) / 60)


def keep_if_best(study: optuna.Study, trial: FrozenTrial, out: Path, folder: Path) -> None:
    """The best trial's weights (in `folder`) become OUT/best.ckpt; others are deleted."""
    ckpt = folder / "best.ckpt"
    if trial.state == TrialState.COMPLETE and study.best_trial.number == trial.number and ckpt.is_file():
        os.replace(ckpt, out / "best.ckpt")  # one rename on the same disk: never half-written
    shutil.rmtree(folder, ignore_errors=True)
