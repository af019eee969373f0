"""Preemption: `fit` sent SIGTERM in the middle of an epoch saves a checkpoint after the step in progress, prints
the command that resumes it and exits 143; resumed with that command, it ends with the weights of an
uninterrupted fit, bit for bit (CPU), as a fit killed with SIGKILL and resumed does (`test_resume`)."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest
import torch

from core.runtime.checkpoint import load_checkpoint
from streamrec.cli import main


def _sibling(name: str) -> ModuleType:
    """The test module `name` beside this one (pytest's importlib mode puts no test folder on sys.path)."""
    spec = importlib.util.spec_from_file_location(f"_streamrec_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


resume = _sibling("test_resume")
runs = resume.runs  # the uninterrupted fit (and a SIGKILLed one), built once per test run
CKPTS, REPO, STEP_CKPT = resume.CKPTS, resume.REPO, resume.STEP_CKPT
EPOCH, BATCH = 1, 4  # where the signal arrives: inside the middle epoch of three

# Holds the fit at one batch's end until the test says it has sent the signal: the signal lands in that step,
# whatever the machine's speed. Waits only in the child the test starts (PREEMPT_MARKER set).
WAITER = '''
import os, time
from pathlib import Path
from lightning.pytorch import Callback

class WaitForSignal(Callback):
    def __init__(self, epoch: int = EPOCH, batch: int = BATCH):
        self.epoch, self.batch = epoch, batch

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        marker = os.environ.get("PREEMPT_MARKER")
        if marker and (trainer.current_epoch, batch_idx) == (self.epoch, self.batch):
            Path(marker).touch()
            while not Path(marker + ".sent").exists():
                time.sleep(0.01)
'''.replace("EPOCH", str(EPOCH)).replace("BATCH", str(BATCH))


def wait_for(path: Path, process: subprocess.Popen, timeout: float = 120.0) -> None:
    """Poll until `path` exists; fail at once if `process` ends first."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if process.poll() is not None:
            out, err = process.communicate()
            pytest.fail(f"fit ended (status {process.returncode}) before the marker:\n{err[-3000:]}")
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"no {path.name} after {timeout:.0f} s")
        time.sleep(0.05)


def signalled_fit(cwd: Path, args: list[str], program: str, signum: int, extra_path: Path) -> tuple[int, str]:
    """Run `python -m program args` in `cwd` and send `signum` while its fit is held at the marked step.

    Returns the exit status and stderr."""
    marker = cwd / "at_step"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(extra_path)]), "OMP_NUM_THREADS": "1",
           "PREEMPT_MARKER": str(marker), "TMPDIR": str(cwd.parent / "tmpdir")}
    process = subprocess.Popen([sys.executable, "-m", program, *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        wait_for(marker, process)
        process.send_signal(signum)
        Path(f"{marker}.sent").touch()
        _, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    return process.returncode, err


def stop_line(stderr: str) -> re.Match:
    """The line a stopped fit ends with; fails naming stderr's tail where there is none."""
    found = re.search(r"^fit stopped by (\w+) in epoch (\d+) at step (\d+): saved (\S+); resume with: (.+)$",
                      stderr, re.MULTILINE)
    assert found, stderr[-3000:]
    return found


@pytest.mark.slow
def test_sigterm_mid_epoch_saves_prints_the_resume_command_and_exits_143(tiny_log: Path, runs, tmp_path: Path,
                                                                          monkeypatch) -> None:
    (tmp_path / "waiter.py").write_text(WAITER)
    (tmp_path / "step.yaml").write_text(STEP_CKPT)
    (tmp_path / "tmpdir").mkdir()
    cwd = tmp_path / "stopped"
    cwd.mkdir()
    args = resume._args(cwd, tiny_log, "--trainer.callbacks+=waiter.WaitForSignal")
    status, err = signalled_fit(cwd, args, "streamrec", signal.SIGTERM, tmp_path)

    assert status == 128 + signal.SIGTERM, err[-3000:]
    line = stop_line(err)
    assert line.group(1) == "SIGTERM" and int(line.group(2)) == EPOCH
    saved = cwd / line.group(4)
    assert saved == cwd / CKPTS / "stopped.ckpt"
    state = load_checkpoint(saved, "fit")
    per_epoch = load_checkpoint(runs.whole / CKPTS / "last.ckpt", "fit")["global_step"] // 3
    assert state["global_step"] == int(line.group(3)) == EPOCH * per_epoch + BATCH + 1  # the held step is in it
    assert load_checkpoint(cwd / CKPTS / "last.ckpt", "fit")["epoch"] == EPOCH - 1  # last.ckpt: the last whole epoch
    assert not list((cwd / CKPTS).glob(".*.tmp"))

    command = shlex.split(line.group(5))
    assert command[:3] == ["python", "-m", "streamrec"] and command[-2:] == ["--ckpt_path", line.group(4)]
    with monkeypatch.context() as m:  # the printed command, in this process (one thread, as the child)
        m.chdir(cwd)
        m.setenv("TMPDIR", str(tmp_path / "tmpdir"))
        m.syspath_prepend(str(tmp_path))
        main(command[3:])
    a, b = (load_checkpoint(folder / CKPTS / "last.ckpt", "fit") for folder in (runs.whole, cwd))
    assert a["global_step"] == b["global_step"] > 0
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key
