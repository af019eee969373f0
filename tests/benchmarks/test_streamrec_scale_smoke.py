"""Smoke test of benchmarks/streamrec_scale.py at tiny sizes: both trees score, agree, give flat JSON and a PNG."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# --in-process: today's tree runs in the script's own process, the old tree in one child (it imports torch and
# Lightning); a child per point is what a real run does, and that path runs here for the old points.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_scale_benchmark_compares_old_and_new_and_writes_json_and_plot(run_benchmark, benchmark_refuses,
                                                                       tmp_path: Path) -> None:
    png = tmp_path / "scale.png"
    run = run_benchmark("streamrec_scale.py", "--items", "600,2000", "--rows", "400", "--users", "10",
                        "--log-items", "500", "--item-chunk", "256", "--skip-old-above", "1000", "--bf16",
                        "--threads", "1", "--plot", png, "--in-process", timeout=600)
    figures = run.figures
    assert figures["threads"] == 1
    for key in ("users_per_s", "peak_rss_mib", "total_s", "score_s"):
        for kind in ("old", "new"):
            assert figures[f"N600_R400_{kind}_{key}"] > 0, (kind, key)
        assert figures[f"N2000_R400_new_{key}"] > 0
    assert "N2000_R400_old_users_per_s" not in figures  # above --skip-old-above: not run
    # The old full matrix and the new item chunks rank every user alike (random weights: no ties).
    assert figures["N600_R400_same_topk_share"] == 1.0
    assert figures["N600_R400_speedup"] > 0 and figures["N600_R400_rss_ratio"] > 0
    assert figures["N600_R400_bf16_speedup"] > 0 and figures["N2000_R400_bf16_users_per_s"] > 0
    assert figures["N2000_R400_bf16_same_topk_share"] >= 0.9  # against new's exact lists where old did not run
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "skipped" in run.stdout
    assert "must hold the log's --log-items" in benchmark_refuses("streamrec_scale.py", "--items", "500",
                                                                  "--log-items", "1000")


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


def test_training_memory_mode_measures_both_item_optimizers_and_writes_flat_json(run_benchmark) -> None:
    run = run_benchmark("streamrec_scale.py", "--train-items", "1000,4000", "--d-model", "16", "--train-steps", "2",
                        "--threads", "1", "--in-process", timeout=600)
    figures = run.figures
    assert figures["train_N4000_table_mib"] == pytest.approx(4001 * 16 * 4 / 2**20)
    for n in (1000, 4000):
        for opt in ("adamw", "rowwise_adagrad"):
            # RSS above the built model's: 0 MiB when the step fits in memory the allocator already holds.
            assert figures[f"train_N{n}_{opt}_peak_above_model_mib"] >= 0, (n, opt)
            assert figures[f"train_N{n}_{opt}_s_per_step"] > 0 and figures[f"train_N{n}_{opt}_first_step_s"] > 0
        assert figures[f"train_N{n}_rowwise_adagrad_step_speedup"] > 0
    assert "train_adamw_tables_per_table" in figures and "train_rowwise_adagrad_tables_per_table" in figures
    assert "rowwise_adagrad: each item table" in run.stdout
