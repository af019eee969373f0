"""Preemption: `fit` sent SIGTERM in the middle of an epoch saves a checkpoint after the step in progress, prints
the command that resumes it and exits 143; resumed with that command, it ends with the weights of an
uninterrupted fit, bit for bit (CPU), as a fit killed with SIGKILL and resumed does (`test_resume`)."""

from __future__ import annotations

import importlib.util
import shlex
import signal
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from core.runtime.checkpoint import load_checkpoint
from streamrec.cli import main


def _load(path: Path, name: str) -> ModuleType:
    """A test module by path (pytest's importlib mode puts no test folder on sys.path)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))
import signalled  # noqa: E402 (by name, as tests/forks.py: the signalled fit both apps' preemption tests run)

resume = _load(TESTS / "streamrec/test_resume.py", "_streamrec_test_resume")
signals = _load(TESTS / "core/runtime/test_signals.py", "_core_test_signals")  # the signalling helpers
runs = resume.runs  # the uninterrupted fit (and a SIGKILLed one), built once per test run
CKPTS, STEP_CKPT = resume.CKPTS, resume.STEP_CKPT
EPOCH, BATCH = 1, 4  # where the signal arrives: inside the middle epoch of three


@pytest.mark.slow
def test_sigterm_mid_epoch_saves_prints_the_resume_command_and_exits_143(tiny_log: Path, runs, tmp_path: Path,
                                                                          monkeypatch) -> None:
    (tmp_path / "waiter.py").write_text(signals.WAITER.format(epoch=EPOCH, batch=BATCH))
    (tmp_path / "step.yaml").write_text(STEP_CKPT)
    (tmp_path / "tmpdir").mkdir()
    cwd = tmp_path / "stopped"
    cwd.mkdir()
    args = resume._args(cwd, tiny_log, "--trainer.callbacks+=waiter.WaitForSignal")
    status, err = signalled.signalled_fit("streamrec", cwd, args, signal.SIGTERM)

    assert status == 128 + signal.SIGTERM, err[-3000:]
    line = signals.stop_line(err)
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


EARLY = '''
import signal
from lightning.pytorch import Callback

class TermAtSanityCheck(Callback):
    def on_sanity_check_start(self, trainer, pl_module):
        signal.raise_signal(signal.SIGTERM)
'''


def test_sigterm_before_training_exits_143_saying_nothing_was_saved(tiny_log: Path, tmp_path: Path) -> None:
    """Before the training steps Lightning's handler holds, whose exit status would be 0: ours says so and gives 143.

    In a process of its own: the signal handlers a test process already holds (pytest's, earlier fits') must not
    decide it.
    """
    (tmp_path / "early.py").write_text(EARLY)
    (tmp_path / "step.yaml").write_text(STEP_CKPT)
    cwd = tmp_path / "run"
    cwd.mkdir()
    args = resume._args(cwd, tiny_log, "--trainer.callbacks+=early.TermAtSanityCheck")
    status = resume.finished(resume.start_program(cwd, args, tmp_path / "early"))
    err = (tmp_path / "early.err").read_text()
    assert status == 128 + signal.SIGTERM, err[-3000:]
    line = err.strip().splitlines()[-1]
    assert line.startswith("fit stopped by SIGTERM outside a training step: no checkpoint saved; rerun: python -m "
                           "streamrec fit --config"), line
    assert not (cwd / CKPTS / "stopped.ckpt").exists()


INTERRUPT = '''
import signal
from lightning.pytorch import Callback

class InterruptAt(Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if (trainer.current_epoch, batch_idx) == (0, 2):
            signal.raise_signal(signal.SIGINT)
'''


@pytest.mark.slow
def test_ctrl_c_mid_epoch_saves_and_exits_130(tiny_log: Path, tmp_path: Path, monkeypatch, capfd) -> None:
    """SIGINT takes the same way out as SIGTERM, not Lightning's KeyboardInterrupt one (no checkpoint, status 1).

    In this process, SIGINT raised at the batch's end as Ctrl-C delivers it: the way out is the CLI's, the same in
    a child, which would only import torch and Lightning again."""
    (tmp_path / "_interrupt_at_batch.py").write_text(INTERRUPT)
    (tmp_path / "step.yaml").write_text(STEP_CKPT)
    (tmp_path / "tmpdir").mkdir()
    cwd = tmp_path / "stopped"
    cwd.mkdir()
    args = resume._args(cwd, tiny_log, "--trainer.callbacks+=_interrupt_at_batch.InterruptAt")
    before = signal.getsignal(signal.SIGINT)
    with monkeypatch.context() as m, pytest.raises(SystemExit) as exit_:
        m.chdir(cwd)
        m.setenv("TMPDIR", str(tmp_path / "tmpdir"))
        m.syspath_prepend(str(tmp_path))
        main(args)
    err = capfd.readouterr().err
    assert exit_.value.code == 128 + signal.SIGINT, err[-3000:]
    assert signal.getsignal(signal.SIGINT) == before  # the test process's own handler is back
    line = signals.stop_line(err)
    assert (line.group(1), line.group(2), line.group(3)) == ("SIGINT", "0", "3")
    assert load_checkpoint(cwd / line.group(4), "fit")["global_step"] == 3
