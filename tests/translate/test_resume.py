"""Exact resume for Translate: a `fit` killed with SIGKILL mid-epoch and resumed from last.ckpt ends with the
weights of an uninterrupted fit, bit for bit (CPU). Without BPE-dropout: sentencepiece's sampling repeats
within a process only (see `translate.data.corpus.SampledSegmentations`)."""

from __future__ import annotations

import contextlib
import signal
import sys
from pathlib import Path

import pytest
import torch

from core.runtime.checkpoint import load_checkpoint
from translate.cli import main

sys.path.insert(0, str(Path(__file__).parents[1]))
import forks  # noqa: E402 (by name: the fork server test_exit_status and streamrec's test_resume use too)

forks.preload("translate.cli")

REPO = Path(__file__).resolve().parents[2]
CKPTS = Path("runs/translate_demo/checkpoints")  # where configs/translate/demo.yaml puts them, under the cwd
KILLER = '''
import os, signal
from lightning.pytorch import Callback

class KillMidEpoch(Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.current_epoch == 1 and batch_idx == 2:
            os.kill(os.getpid(), signal.SIGKILL)
'''


def _args(cwd: Path, demo_dir: Path, *extra: str) -> list[str]:
    return ["fit", "--config", str(REPO / "configs/translate/demo.yaml"),
            *(f"--data.{s}={demo_dir / s}" for s in ("train", "val", "test")), "--data.max_len", "32",
            "--data.max_tokens", "400", "--data.cache_dir", str(cwd / "spm"),
            "--model.d_model", "16", "--model.n_heads", "2", "--model.n_encoder_layers", "1",
            "--model.n_decoder_layers", "1", "--model.d_ff", "32", "--model.optimizer.warmup_steps", "5",
            "--trainer.max_epochs", "2", "--trainer.limit_val_batches", "2", "--trainer.logger", "false",
            "--trainer.precision", "32-true", "--trainer.enable_progress_bar", "false",
            "--trainer.enable_model_summary", "false", *extra]


def uninterrupted_fit(built_once, demo_dir: Path) -> Path:
    """The folder of the fit `_args` describes, run to its end in this process (one thread, as OMP_NUM_THREADS=1)
    once per test run: this file's test and test_preemption's compare their resumed fits with it."""
    def build(folder: Path) -> None:
        with contextlib.chdir(folder):
            main(_args(folder, demo_dir))

    return built_once(f"translate uninterrupted fit {demo_dir}", build)


def _killed_fit(cwd: Path, demo_dir: Path, *extra: str) -> tuple[int, str]:
    """`python -m translate fit`, SIGKILLed mid-epoch: a process of its own (a child of the tests' fork server,
    tests/forks.py, which has imported the program), since SIGKILL ends the process, not only the fit."""
    logs = cwd.parent / "killed_fit"
    child = forks.start_program("translate", cwd, _args(cwd, demo_dir, *extra), logs)
    return forks.exit_status(child, 600), Path(f"{logs}.err").read_text()


@pytest.mark.slow
def test_killed_and_resumed_fit_equals_uninterrupted(built_once, demo_dir: Path, tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "killer.py").write_text(KILLER)
    whole, killed = uninterrupted_fit(built_once, demo_dir), tmp_path / "killed"
    killed.mkdir()
    status, err = _killed_fit(killed, demo_dir, "--trainer.callbacks+=killer.KillMidEpoch")
    assert status == 128 + signal.SIGKILL, err[-2000:]
    last = killed / CKPTS / "last.ckpt"
    assert load_checkpoint(last, "fit")["epoch"] == 0
    with monkeypatch.context() as m:  # resumed in this process as well: only the killed fit needs its own
        m.chdir(killed)
        main(_args(killed, demo_dir, "--ckpt_path", str(last)))
    a, b = (load_checkpoint(folder / CKPTS / "last.ckpt", "fit") for folder in (whole, killed))
    assert a["global_step"] == b["global_step"] > 0
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key
