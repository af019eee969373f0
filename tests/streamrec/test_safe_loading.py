"""Every StreamRec entry point that reads a checkpoint refuses one whose pickle would run code: a non-zero
exit, one line naming the file and the global, and the code never runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from core.runtime.checkpoint import load_checkpoint
from core.runtime.errors import UnsafeCheckpointError
from streamrec import Recommender, explain, score
from streamrec.cli import main as cli_main
from streamrec.model.module import StreamRecModule

REPO = Path(__file__).resolve().parents[2]
KINDS = ("zip", "legacy", "in_hparams")


@pytest.mark.parametrize("kind", KINDS)
def test_score_and_explain_refuse(exit_line, kind, hostile, assert_refused, tiny_ckpt, tiny_log, tmp_path):
    bad, marker = hostile(kind, tiny_ckpt)
    message = exit_line(score.main, ["--ckpt", str(bad), "--input", str(tiny_log),
                                         "--output", str(tmp_path / "recs.parquet")])
    assert_refused(message, bad, marker)
    assert not (tmp_path / "recs.parquet").exists() and not (tmp_path / "recs.parquet.parts").exists()
    message = exit_line(explain.main, ["--ckpt", str(bad), "--input", str(tiny_log), "--user", "u0001",
                                           "--html", str(tmp_path / "why.html")])
    assert_refused(message, bad, marker)


@pytest.mark.parametrize("kind", KINDS)
def test_python_api_refuses(kind, hostile, assert_refused, tiny_ckpt):
    bad, marker = hostile(kind, tiny_ckpt)
    for load in (Recommender.load, StreamRecModule.load_from_checkpoint):
        with pytest.raises(UnsafeCheckpointError) as err:
            load(bad)
        assert_refused(str(err.value), bad, marker)


# Every kind through `fit --ckpt_path`; `test` reads the file with the same call, so one kind checks that it does.
@pytest.mark.parametrize(("sub", "kind"), [*(("fit", kind) for kind in KINDS), ("test", "in_hparams")])
def test_ckpt_path_refuses(exit_line, sub, kind, hostile, assert_refused, tiny_ckpt, tiny_log, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bad, marker = hostile(kind, tiny_ckpt)
    message = exit_line(cli_main, [
        sub, "--data.path", str(tiny_log), "--data.max_len", "8", "--model.d_model", "16", "--model.n_heads", "2",
        "--model.n_layers", "1", "--model.d_ff", "32", "--ckpt_path", str(bad), "--trainer.logger", "false",
        "--trainer.enable_progress_bar", "false", "--trainer.max_epochs", "1"])
    assert_refused(message, bad, marker)


def test_command_line_exit_status_and_no_traceback(hostile, tiny_log, tmp_path):
    bad, marker = hostile("zip")
    run = subprocess.run([sys.executable, "-m", "streamrec.score", "--ckpt", str(bad), "--input", str(tiny_log),
                          "--output", str(tmp_path / "r.parquet")], capture_output=True, text=True, cwd=REPO)
    assert run.returncode == 1
    assert "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines()[-1].startswith(f"error: {bad}: refused: its pickle names the global")
    assert not marker.exists()


def test_what_fit_writes_needs_no_allow_list(tiny_ckpt, tmp_path):
    """Our checkpoints hold tensors and plain data only, so they load without widening the allow-list."""
    assert torch.serialization.get_unsafe_globals_in_checkpoint(tiny_ckpt) == []
    state = load_checkpoint(tiny_ckpt, "python -m streamrec fit")
    legacy = tmp_path / "legacy.ckpt"  # as an older torch (or this product before the zip format) wrote it
    torch.save(state, legacy, _use_new_zipfile_serialization=False)
    model, reference = Recommender.load(legacy).model, Recommender.load(tiny_ckpt).model
    for (name, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
