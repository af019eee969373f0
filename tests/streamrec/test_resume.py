"""Exact resume: `fit` killed with SIGKILL mid-epoch and resumed from last.ckpt ends with the weights of an
uninterrupted fit, bit for bit (CPU); checkpoint saves never stage files in $TMPDIR; last.ckpt is never
older than best.ckpt."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from core.runtime.checkpoint import load_checkpoint

REPO = Path(__file__).resolve().parents[2]
CKPTS = Path("runs/streamrec_demo/checkpoints")  # where configs/streamrec/demo.yaml puts them, under the cwd

KILLER = '''
import os, signal
from lightning.pytorch import Callback

class KillMidEpoch(Callback):
    """SIGKILL this process in the middle of epoch `epoch`: no handler, no cleanup runs."""

    def __init__(self, epoch: int = 2, batch: int = 3):
        self.epoch, self.batch = epoch, batch

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.current_epoch == self.epoch and batch_idx == self.batch:
            os.kill(os.getpid(), signal.SIGKILL)
'''


def _fit(cwd: Path, log: Path, *extra: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(cwd.parent)]), **(env_extra or {})}
    cmd = [sys.executable, "-m", "streamrec", "fit", "--config", str(REPO / "configs/streamrec/demo.yaml"),
           "--data.path", str(log), "--data.batch_size", "8", "--trainer.max_epochs", "4",
           "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
           "--trainer.precision", "32-true", *extra]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_killed_and_resumed_fit_equals_uninterrupted(tiny_log: Path, tmp_path: Path) -> None:
    (tmp_path / "killer.py").write_text(KILLER)
    whole, killed, tmpdir = tmp_path / "whole", tmp_path / "killed", tmp_path / "tmpdir"
    for folder in (whole, killed, tmpdir):
        folder.mkdir()
    env = {"TMPDIR": str(tmpdir)}

    done = _fit(whole, tiny_log, env_extra=env)
    assert done.returncode == 0, done.stderr[-2000:]

    crash = _fit(killed, tiny_log, "--trainer.callbacks+=killer.KillMidEpoch", env_extra=env)
    assert crash.returncode == -signal.SIGKILL, crash.stderr[-2000:]
    last, best = killed / CKPTS / "last.ckpt", killed / CKPTS / "best.ckpt"
    assert load_checkpoint(last, "fit")["epoch"] == 1  # epochs 0 and 1 finished, killed inside epoch 2
    assert load_checkpoint(last, "fit")["global_step"] >= load_checkpoint(best, "fit")["global_step"]

    resumed = _fit(killed, tiny_log, "--ckpt_path", str(last), env_extra=env)
    assert resumed.returncode == 0, resumed.stderr[-2000:]

    a = load_checkpoint(whole / CKPTS / "last.ckpt", "fit")
    b = load_checkpoint(last, "fit")
    assert a["global_step"] == b["global_step"] > 0
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key
    for sa, sb in zip(a["optimizer_states"][0]["state"].values(), b["optimizer_states"][0]["state"].values(),
                      strict=True):
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    staged = [p for p in tmpdir.rglob("*") if p.is_file() and "torchinductor_" not in str(p)]  # torch's own cache
    assert staged == []  # no checkpoint staged in $TMPDIR
    assert not list((killed / CKPTS).glob(".*.tmp"))
    assert not (killed / "runs/streamrec_demo/fit.lock").exists()  # released at the end of the resumed fit


def test_without_restored_states_the_resumed_run_differs(tiny_log: Path, tmp_path: Path) -> None:
    """The reference above can fail: a resume that skips the stored RNG states gives other weights."""
    import lightning as L

    from core.runtime.resume import ExactResume, collect_rng_states, set_rng_states

    before = collect_rng_states()
    first = torch.rand(3)
    set_rng_states(before)
    assert torch.equal(torch.rand(3), first)
    L.seed_everything(0, verbose=False)
    state = ExactResume().state_dict()
    assert set(state["rng"]) >= {"torch", "numpy", "python"}
    torch.save(state, tmp_path / "s.pt")
    assert load_checkpoint(tmp_path / "s.pt", "fit")["rng"]["numpy"]["pos"] == state["rng"]["numpy"]["pos"]


STEP_CKPT = """
trainer:
  callbacks+:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {dirpath: runs/streamrec_demo/checkpoints, filename: step, every_n_train_steps: 5,
                  enable_version_counter: false}
"""


@pytest.mark.slow
def test_resume_from_a_mid_epoch_checkpoint_equals_uninterrupted(tiny_log: Path, tmp_path: Path) -> None:
    """A checkpoint written every 5 steps, mid-epoch: the resumed run skips the batches it already trained on."""
    (tmp_path / "killer.py").write_text(KILLER)
    (tmp_path / "step.yaml").write_text(STEP_CKPT)
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    whole.mkdir()
    killed.mkdir()
    steps = ["--config", str(tmp_path / "step.yaml")]
    assert _fit(whole, tiny_log, *steps).returncode == 0
    crash = _fit(killed, tiny_log, *steps, "--trainer.callbacks+=killer.KillMidEpoch")
    assert crash.returncode == -signal.SIGKILL
    step = killed / CKPTS / "step.ckpt"
    state = load_checkpoint(step, "fit")
    per_epoch = load_checkpoint(killed / CKPTS / "last.ckpt", "fit")["global_step"] // 2
    assert state["global_step"] % per_epoch != 0, "the step checkpoint must fall inside an epoch"
    resumed = _fit(killed, tiny_log, *steps, "--ckpt_path", str(step))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a, b = (load_checkpoint(folder / CKPTS / "last.ckpt", "fit") for folder in (whole, killed))
    assert a["global_step"] == b["global_step"]
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key
