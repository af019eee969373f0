"""Smoke test of benchmarks/streamrec_scale.py at tiny sizes: both trees score, agree, give flat JSON and a PNG."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a dozen child processes, each importing torch

ROOT = Path(__file__).resolve().parents[2]


def test_scale_benchmark_compares_old_and_new_and_writes_json_and_plot(tmp_path: Path) -> None:
    out, png = tmp_path / "scale.json", tmp_path / "scale.png"
    cmd = [sys.executable, "benchmarks/streamrec_scale.py", "--items", "3000,20000", "--rows", "8000", "--users", "150",
           "--log-items", "1000", "--item-chunk", "1000", "--skip-old-above", "10000", "--bf16", "--threads", "1",
           "--json", str(out), "--plot", str(png)]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    figures = json.loads(out.read_text())
    for name, value in figures.items():
        assert type(value) in (int, float) and math.isfinite(value), (name, value)
    assert figures["threads"] == 1
    for key in ("users_per_s", "peak_rss_mib", "total_s", "score_s"):
        for kind in ("old", "new"):
            assert figures[f"N3000_R8000_{kind}_{key}"] > 0, (kind, key)
        assert figures[f"N20000_R8000_new_{key}"] > 0
    assert "N20000_R8000_old_users_per_s" not in figures  # above --skip-old-above: not run
    # The old full matrix and the new item chunks rank every user alike (random weights: no ties).
    assert figures["N3000_R8000_same_topk_share"] == 1.0
    assert figures["N3000_R8000_speedup"] > 0 and figures["N3000_R8000_rss_ratio"] > 0
    assert figures["N3000_R8000_bf16_speedup"] > 0 and figures["N20000_R8000_bf16_users_per_s"] > 0
    assert figures["N20000_R8000_bf16_same_topk_share"] >= 0.9  # against new's exact lists where old did not run
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "skipped" in res.stdout
    bad = subprocess.run([*cmd[:2], "--items", "500", "--log-items", "1000"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "must hold the log's --log-items" in bad.stderr


def test_the_old_tree_is_the_baseline_commits(tmp_path: Path) -> None:
    """`old_tree` extracts core/ and streamrec/ at 323717e: a scorer without item chunks, unlike today's."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import streamrec_scale
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    tree = streamrec_scale.old_tree(streamrec_scale.BASELINE_COMMIT, tmp_path)
    old_score = (tree / "streamrec" / "score.py").read_text()
    assert "--item-chunk" not in old_score and "--item-chunk" in (ROOT / "streamrec" / "score.py").read_text()
    assert (tree / "core" / "__init__.py").is_file()


def test_training_memory_mode_measures_both_item_optimizers_and_writes_flat_json(tmp_path: Path) -> None:
    out = tmp_path / "train.json"
    cmd = [sys.executable, "benchmarks/streamrec_scale.py", "--train-items", "1000,40000", "--d-model", "16",
           "--train-steps", "2", "--threads", "1", "--json", str(out)]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    figures = json.loads(out.read_text())
    for name, value in figures.items():
        assert type(value) in (int, float) and math.isfinite(value), (name, value)
    assert figures["train_N40000_table_mib"] == pytest.approx(40001 * 16 * 4 / 2**20)
    for n in (1000, 40000):
        for opt in ("adamw", "rowwise_adagrad"):
            assert figures[f"train_N{n}_{opt}_peak_above_model_mib"] > 0, (n, opt)
            assert figures[f"train_N{n}_{opt}_s_per_step"] > 0 and figures[f"train_N{n}_{opt}_first_step_s"] > 0
        assert figures[f"train_N{n}_rowwise_adagrad_step_speedup"] > 0
    assert math.isfinite(figures["train_adamw_tables_per_table"])
    assert math.isfinite(figures["train_rowwise_adagrad_tables_per_table"])
    assert "rowwise_adagrad: each item table" in res.stdout
