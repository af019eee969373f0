"""Every Translate entry point that reads a checkpoint refuses one whose pickle would run code: a non-zero
exit, one line naming the file and the global, and the code never runs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from core.runtime.errors import UnsafeCheckpointError
from translate import average, infer
from translate.api import Translator
from translate.cli import main as cli_main
from translate.model.module import TranslationModule

REPO = Path(__file__).resolve().parents[2]
KINDS = ("zip", "legacy", "in_hparams")
TINY_MODEL = ["--model.d_model", "16", "--model.n_heads", "2", "--model.n_encoder_layers", "1",
              "--model.n_decoder_layers", "1", "--model.d_ff", "32"]


@pytest.fixture(scope="module")
def tiny_ckpt(demo_dir, tmp_path_factory, train_tiny_checkpoint) -> Path:
    return train_tiny_checkpoint(demo_dir, tmp_path_factory.mktemp("safe_ckpt"))[0]


@pytest.mark.parametrize("kind", KINDS)
def test_infer_refuses_alone_and_in_an_ensemble(
    exit_line, kind, hostile, assert_refused, tiny_ckpt, demo_dir, tmp_path,
):
    bad, marker = hostile(kind, tiny_ckpt)
    out = tmp_path / "out.de"
    for ckpts in ([bad], [tiny_ckpt, bad]):
        message = exit_line(infer.main, ["--ckpt", *map(str, ckpts), "-i", str(demo_dir / "test.en"),
                                             "-o", str(out)])
        assert_refused(message, bad, marker)
        assert not out.exists() and not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("kind", KINDS)
def test_average_refuses_listed_and_found_in_a_folder(exit_line, kind, hostile, assert_refused, tiny_ckpt, tmp_path):
    bad, marker = hostile(kind, tiny_ckpt)
    out = tmp_path / "avg.ckpt"
    message = exit_line(average.main, ["--ckpts", str(tiny_ckpt), str(bad), "--output", str(out)])
    assert_refused(message, bad, marker)
    folder = tmp_path / "run"
    folder.mkdir()
    shutil.copy(tiny_ckpt, folder / "a.ckpt")
    shutil.copy(bad, folder / "b.ckpt")
    message = exit_line(average.main, ["--dir", str(folder), "--last", "2", "--output", str(out)])
    assert_refused(message, folder / "b.ckpt", marker)
    assert not out.exists() and not (tmp_path / "avg.ckpt.lock").exists()


@pytest.mark.parametrize("kind", KINDS)
def test_python_api_refuses(kind, hostile, assert_refused, tiny_ckpt):
    bad, marker = hostile(kind, tiny_ckpt)
    for load in (Translator.load, TranslationModule.load_from_checkpoint, average.read_checkpoint):
        with pytest.raises(UnsafeCheckpointError) as err:
            load(bad)
        assert_refused(str(err.value), bad, marker)


@pytest.mark.parametrize("sub", ["fit", "test"])
def test_ckpt_path_refuses(exit_line, sub, hostile, assert_refused, tiny_ckpt, demo_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bad, marker = hostile("in_hparams", tiny_ckpt)
    data = [f"--data.{s}" for s in ("train", "val", "test")]
    message = exit_line(cli_main, [
        sub, data[0], str(demo_dir / "train"), data[1], str(demo_dir / "val"), data[2], str(demo_dir / "test"),
        "--data.max_len", "32", *TINY_MODEL, "--ckpt_path", str(bad), "--trainer.logger", "false",
        "--trainer.enable_progress_bar", "false", "--trainer.max_epochs", "1"])
    assert_refused(message, bad, marker)


def test_command_line_exit_status_and_no_traceback(hostile, demo_dir, tmp_path):
    bad, marker = hostile("legacy")
    run = subprocess.run([sys.executable, "-m", "translate.infer", "--ckpt", str(bad), "-i",
                          str(demo_dir / "test.en")], capture_output=True, text=True, cwd=REPO)
    assert run.returncode == 1
    assert "Traceback" not in run.stderr and run.stdout == ""
    assert run.stderr.strip().splitlines()[-1].startswith(f"error: {bad}: refused: its pickle names the global")
    assert not marker.exists()


def test_what_fit_writes_needs_no_allow_list(tiny_ckpt, tmp_path):
    assert torch.serialization.get_unsafe_globals_in_checkpoint(tiny_ckpt) == []
    out = tmp_path / "avg.ckpt"
    average.main(["--ckpts", str(tiny_ckpt), str(tiny_ckpt), "--output", str(out)])
    assert torch.serialization.get_unsafe_globals_in_checkpoint(out) == []
    assert Translator.load(out).tgt_vocab == Translator.load(tiny_ckpt).tgt_vocab
