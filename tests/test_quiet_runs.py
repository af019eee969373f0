"""A normal run prints nothing its user cannot act on: no library tips, no deprecation notices of Lightning's own
helpers, no note that an epoch is shorter than the logging interval."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.runtime.logs import NOISE_MESSAGES

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_a_demo_fit_prints_no_library_noise(tiny_log, tmp_path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "streamrec", "fit", "--config", str(REPO / "configs/streamrec/demo.yaml"),
         "--data.path", str(tiny_log), "--data.max_len", "8", "--model.d_model", "16", "--model.d_ff", "32",
         "--trainer.max_epochs", "1", "--trainer.default_root_dir", str(tmp_path / "run"), "--threads", "1"],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    printed = run.stdout + run.stderr
    for words in ("Tip: For seamless cloud logging", "is deprecated", "smaller than the logging interval",
                  "args parameter is intended"):
        assert words not in printed, words


def test_the_noise_patterns_match_what_lightning_prints() -> None:
    import re

    lines = ["💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger]",
             "`isinstance(treespec, LeafSpec)` is deprecated, use `isinstance(treespec, TreeSpec)`",
             "The number of training batches (3) is smaller than the logging interval Trainer(log_every_n_steps=50)."]
    for line, pattern in zip(lines, NOISE_MESSAGES, strict=True):
        assert re.search(pattern, line)
    assert not any(re.search(p, "Epoch 0: val_ndcg@10 improved") for p in NOISE_MESSAGES)
