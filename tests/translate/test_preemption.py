"""Preemption for Translate: `fit` sent SIGTERM in the middle of an epoch saves a checkpoint after the step in
progress, prints the command that resumes it and exits 143; resumed with that command, it ends with the weights of
an uninterrupted fit, bit for bit (CPU), as a fit killed with SIGKILL and resumed does (`test_resume`)."""

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
from translate.cli import main


def _load(path: Path, name: str) -> ModuleType:
    """A test module by path (pytest's importlib mode puts no test folder on sys.path)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))
import signalled  # noqa: E402 (by name, as tests/forks.py: the signalled fit both apps' preemption tests run)

resume = _load(TESTS / "translate/test_resume.py", "_translate_test_resume")
signals = _load(TESTS / "core/runtime/test_signals.py", "_core_test_signals")  # the signalling helpers
CKPTS = resume.CKPTS
EPOCH, BATCH = 1, 2  # where the signal arrives: inside the second (last) epoch


@pytest.mark.slow
def test_sigterm_mid_epoch_saves_prints_the_resume_command_and_exits_143(built_once, demo_dir: Path, tmp_path: Path,
                                                                          monkeypatch) -> None:
    (tmp_path / "waiter.py").write_text(signals.WAITER.format(epoch=EPOCH, batch=BATCH))
    (tmp_path / "tmpdir").mkdir()
    whole, cwd = resume.uninterrupted_fit(built_once, demo_dir), tmp_path / "stopped"
    cwd.mkdir()

    args = resume._args(cwd, demo_dir, "--trainer.callbacks+=waiter.WaitForSignal")
    status, err = signalled.signalled_fit("translate", cwd, args, signal.SIGTERM)

    assert status == 128 + signal.SIGTERM, err[-3000:]
    line = signals.stop_line(err)
    assert line.group(1) == "SIGTERM" and int(line.group(2)) == EPOCH
    assert cwd / line.group(4) == cwd / CKPTS / "stopped.ckpt"
    per_epoch = load_checkpoint(whole / CKPTS / "last.ckpt", "fit")["global_step"] // 2
    assert load_checkpoint(cwd / line.group(4), "fit")["global_step"] == int(line.group(3)) == per_epoch + BATCH + 1

    command = shlex.split(line.group(5))
    assert command[:3] == ["python", "-m", "translate"] and command[-2:] == ["--ckpt_path", line.group(4)]
    with monkeypatch.context() as m:  # the printed command, in this process
        m.chdir(cwd)
        m.syspath_prepend(str(tmp_path))
        main(command[3:])
    a, b = (load_checkpoint(folder / CKPTS / "last.ckpt", "fit") for folder in (whole, cwd))
    assert a["global_step"] == b["global_step"] > 0
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key
