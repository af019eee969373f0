"""Exact resume: `fit` killed with SIGKILL mid-epoch and resumed from last.ckpt ends with the weights of an
uninterrupted fit, bit for bit (CPU); checkpoint saves never stage files in $TMPDIR; last.ckpt is never
older than best.ckpt."""

from __future__ import annotations

import shutil
import signal
import sys
import tempfile
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from core.runtime.checkpoint import load_checkpoint
from streamrec.cli import main

sys.path.insert(0, str(Path(__file__).parents[1]))
import forks  # noqa: E402 (by name: one fork server and its module list for this file and test_exit_status)

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


def _args(cwd: Path, log: Path, *extra: str) -> list[str]:
    """The demo config's fit, with a tiny model for 3 epochs: killed inside the last one, it has a last.ckpt
    of a whole epoch and a step checkpoint inside an epoch to resume from. No loggers: what resumes is in the
    checkpoints, and drawing curves.png at each fit's end would cost more than its training."""
    return ["fit", "--config", str(REPO / "configs/streamrec/demo.yaml"), "--config", str(cwd.parent / "step.yaml"),
            "--data.path", str(log), "--data.batch_size", "8", "--data.max_len", "8", "--model.d_model", "16",
            "--model.d_ff", "32", "--model.n_layers", "1", "--trainer.max_epochs", "3",
            "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
            "--trainer.precision", "32-true", "--trainer.logger", "false", *extra]


# A child of the tests' fork server (tests/forks.py), which imports the program once per test process.
forks.preload("streamrec.cli")

def start_program(cwd: Path, args: list[str], logs: Path, env: dict[str, str] | None = None) -> BaseProcess:
    """`python -m streamrec ARGS` in `cwd`, a process of its own (`forks.start_program`)."""
    return forks.start_program("streamrec", cwd, args, logs, env)


def finished(child: BaseProcess, seconds: float = 300) -> int:
    return forks.exit_status(child, seconds)


def _killed_fit(cwd: Path, log: Path, tmpdir: Path) -> tuple[int, str]:
    """The one fit that needs a process of its own: SIGKILL ends the process, not only the fit."""
    logs = cwd.parent / "killed_fit"
    child = start_program(cwd, _args(cwd, log, "--trainer.callbacks+=killer.KillMidEpoch"), logs,
                          {"TMPDIR": str(tmpdir)})
    return finished(child), Path(f"{logs}.err").read_text()


def _fit_here(cwd: Path, log: Path, tmpdir: Path, *extra: str) -> None:
    """A fit in this test process (one thread, as the killed child's OMP_NUM_THREADS=1): a child would only
    import torch and Lightning again. `tempfile` caches $TMPDIR, so its cache is pointed there as well."""
    with pytest.MonkeyPatch.context() as m:
        m.chdir(cwd)
        m.setenv("TMPDIR", str(tmpdir))
        m.setattr(tempfile, "tempdir", str(tmpdir))
        main(_args(cwd, log, *extra))


STEP_CKPT = """
trainer:
  callbacks+:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {dirpath: runs/streamrec_demo/checkpoints, filename: step, every_n_train_steps: 5,
                  enable_version_counter: false}
"""


@pytest.fixture(scope="session")
def runs(tiny_log: Path, built_once) -> SimpleNamespace:
    """An uninterrupted fit and one SIGKILLed in the middle of its last epoch, both with a $TMPDIR of their own;
    built once per run for both resume tests, which resume copies of the killed run."""
    def build(root: Path) -> None:
        (root / "killer.py").write_text(KILLER)
        (root / "step.yaml").write_text(STEP_CKPT)
        for folder in ("whole", "killed", "tmpdir"):
            (root / folder).mkdir()
        _fit_here(root / "whole", tiny_log, root / "tmpdir")
        status, err = _killed_fit(root / "killed", tiny_log, root / "tmpdir")
        assert status == 128 + signal.SIGKILL, err[-2000:]

    root = built_once(f"streamrec resume {tiny_log}", build)
    return SimpleNamespace(whole=root / "whole", killed=root / "killed", tmpdir=root / "tmpdir")


def _resume(runs: SimpleNamespace, tmp_path: Path, log: Path, ckpt: str) -> Path:
    """Resume a copy of the killed run folder (in tmp_path) from its checkpoint `ckpt`; returns the copy."""
    (tmp_path / "step.yaml").write_text(STEP_CKPT)
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    folder = shutil.copytree(runs.killed, tmp_path / "killed")
    _fit_here(folder, log, tmpdir, "--ckpt_path", str(folder / CKPTS / ckpt))
    return folder


@pytest.mark.slow
def test_killed_and_resumed_fit_equals_uninterrupted(tiny_log: Path, runs: SimpleNamespace, tmp_path: Path) -> None:
    last, best = runs.killed / CKPTS / "last.ckpt", runs.killed / CKPTS / "best.ckpt"
    assert load_checkpoint(last, "fit")["epoch"] == 1  # epochs 0 and 1 finished, killed inside epoch 2
    assert load_checkpoint(last, "fit")["global_step"] >= load_checkpoint(best, "fit")["global_step"]

    killed = _resume(runs, tmp_path, tiny_log, "last.ckpt")

    a = load_checkpoint(runs.whole / CKPTS / "last.ckpt", "fit")
    b = load_checkpoint(killed / CKPTS / "last.ckpt", "fit")
    assert a["global_step"] == b["global_step"] > 0
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key
    for sa, sb in zip(a["optimizer_states"][0]["state"].values(), b["optimizer_states"][0]["state"].values(),
                      strict=True):
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    for tmpdir in (runs.tmpdir, tmp_path / "tmpdir"):  # the fits' and the resumed fit's
        staged = [p for p in tmpdir.rglob("*") if p.is_file() and "torchinductor_" not in str(p)]  # torch's cache
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


@pytest.mark.slow
def test_resume_from_a_mid_epoch_checkpoint_equals_uninterrupted(tiny_log: Path, runs: SimpleNamespace,
                                                                 tmp_path: Path) -> None:
    """A checkpoint written every 5 steps, mid-epoch: the resumed run skips the batches it already trained on."""
    state = load_checkpoint(runs.killed / CKPTS / "step.ckpt", "fit")
    per_epoch = load_checkpoint(runs.killed / CKPTS / "last.ckpt", "fit")["global_step"] // 2
    assert state["global_step"] % per_epoch != 0, "the step checkpoint must fall inside an epoch"
    killed = _resume(runs, tmp_path, tiny_log, "step.ckpt")
    a, b = (load_checkpoint(folder / CKPTS / "last.ckpt", "fit") for folder in (runs.whole, killed))
    assert a["global_step"] == b["global_step"]
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key
