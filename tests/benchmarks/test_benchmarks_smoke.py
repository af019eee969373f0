"""Smoke tests of the benchmark scripts: each runs end to end and writes flat JSON figures."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # end-to-end: real processes, servers or training; `pytest -m "not slow"` skips them

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ("sdpa_ms", "explicit_ms", "time_ratio", "sdpa_mem_mib", "explicit_mem_mib", "mem_ratio", "repeats")


def test_attention_quick_writes_flat_json(tmp_path: Path) -> None:
    out = tmp_path / "attention.json"
    # One thread: with other jobs on the 2 shared cores, 2 spinning threads can run 100x slower.
    cmd = [sys.executable, "benchmarks/attention.py", "--quick", "--device", "cpu", "--threads", "1", "--json", out]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]

    figures = json.loads(out.read_text())
    assert isinstance(figures, dict)
    for name, value in figures.items():
        assert type(value) in (int, float) and math.isfinite(value), (name, value)
    expected = {
        f"cpu_fp32{mode}_T{t}_{figure}" for mode in ("", "_causal") for t in (128, 512) for figure in FIGURES
    }
    assert expected <= figures.keys(), sorted(expected - figures.keys())
    assert figures["cpu_threads"] == 1
    # At T=512 the explicit path holds (B, H, T, T) matrices that SDPA never builds.
    assert figures["cpu_fp32_T512_mem_ratio"] > 2


def test_dropout_benchmark_writes_flat_json(tmp_path: Path) -> None:
    out = tmp_path / "dropout.json"
    cmd = [sys.executable, "benchmarks/dropout.py", "--widths", "16", "--repeats", "1", "--json", out]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    figures = json.loads(out.read_text())
    for mode in ("fwd", "train"):
        for figure in ("torch_ms", "core_ms", "speedup"):
            value = figures[f"{mode}_W16_{figure}"]
            assert type(value) is float and math.isfinite(value) and value > 0
    assert figures["p"] == 0.3 and figures["tokens"] == 4096


def test_loss_benchmark_times_a_baseline_chunk_size(tmp_path: Path) -> None:
    out = tmp_path / "loss.json"
    cmd = [sys.executable, "benchmarks/streamrec_loss.py", "--positions", "300", "--items", "500", "--d-model", "16",
           "--repeats", "1", "--baseline-chunk-elements", "5000", "--json", out]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    figures = json.loads(out.read_text())
    for name in ("naive_ms", "chunked_ms", "baseline_chunk_ms", "speedup", "speedup_vs_baseline_chunk"):
        assert type(figures[name]) is float and math.isfinite(figures[name]) and figures[name] > 0, name
    assert figures["loss_abs_diff"] < 1e-4  # the chunked loss is the plain cross-entropy
    bad = subprocess.run([*cmd[:2], "--baseline-chunk-elements", "0"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "--baseline-chunk-elements must be positive" in bad.stderr


def test_rdrop_loss_benchmark_writes_flat_json(tmp_path: Path) -> None:
    out = tmp_path / "rdrop.json"
    cmd = [sys.executable, "benchmarks/translate_rdrop_loss.py", "--positions", "300", "--vocab", "500",
           "--d-model", "16", "--repeats", "1", "--json", out]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    figures = json.loads(out.read_text())
    for name in ("naive_ms", "chunked_ms", "speedup", "memory_ratio"):
        assert type(figures[name]) is float and math.isfinite(figures[name]) and figures[name] > 0, name
    assert figures["loss_abs_diff"] < 1e-4  # the chunked loss is the paper's loss on logits
    bad = subprocess.run([*cmd[:2], "--alpha", "-1"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "--alpha >= 0" in bad.stderr


def _tiny_sequences(path: Path, users: int = 60, items: int = 25) -> None:
    """A per-user lines file in the Amazon sets' format: `user item item ...`, each user 5-9 items."""
    path.parent.mkdir(parents=True)
    lines = [" ".join([str(u)] + [str((u * 7 + 3 * t) % items + 1) for t in range(5 + u % 5)]) for u in range(1, users)]
    path.write_text("\n".join(lines) + "\n")


def test_recipe_benchmark_compares_variants_on_validation_and_resumes(tmp_path: Path) -> None:
    _tiny_sequences(tmp_path / "data" / "amazon-beauty" / "Beauty.txt")
    _tiny_sequences(tmp_path / "data" / "yelp" / "Yelp.txt", users=40)
    out = tmp_path / "recipe.json"
    cmd = [sys.executable, "benchmarks/streamrec_recipe.py", "--data-dir", tmp_path / "data", "--datasets", "beauty",
           "yelp", "--variants", "base:", "wide:d_model=32,lr=3e-3", "--set", "d_model=16,n_heads=1,d_ff=16",
           "--max-epochs", "2", "--limit-batches", "2", "--batch-size", "8", "--max-len", "10", "--precision", "32",
           "--out", tmp_path / "trials", "--json", out]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    figures = json.loads(out.read_text())
    for dataset in ("beauty", "yelp"):
        for variant in ("base", "wide"):
            value = figures[f"{dataset}_{variant}_val_ndcg@10"]
            assert type(value) is float and 0 <= value <= 1
            assert figures[f"{dataset}_{variant}_epochs"] == 2
    assert figures["base_geomean_ratio"] == 1.0
    wide = [figures[f"{d}_wide_val_ndcg@10"] / figures[f"{d}_base_val_ndcg@10"] for d in ("beauty", "yelp")]
    assert math.isclose(figures["wide_geomean_ratio"], math.sqrt(wide[0] * wide[1]), rel_tol=1e-9)
    trials = (tmp_path / "trials" / "trials.jsonl").read_text().splitlines()
    assert len(trials) == 4
    assert json.loads(trials[1])["key"]["module"] == {"d_model": 32, "n_heads": 1, "d_ff": 16, "lr": 3e-3}

    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert len((tmp_path / "trials" / "trials.jsonl").read_text().splitlines()) == 4  # nothing trained twice
    assert json.loads(out.read_text()) == figures

    bad = subprocess.run([*cmd[:2], "--variants", "lr=3e-3"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "NAME:key=value" in bad.stderr


def test_batching_benchmark_trains_both_orders_and_counts_positions(tmp_path: Path) -> None:
    rows = [f"u{u},i{(u * 7 + t) % 30},{t}" for u in range(60) for t in range(3 + u * 37 % 38)]  # 3..40 items
    log = tmp_path / "log.csv"
    log.write_text("user_id,item_id,timestamp\n" + "\n".join(rows) + "\n")
    out = tmp_path / "batching.json"
    cmd = [sys.executable, "benchmarks/streamrec_batching.py", "--data", log, "--max-len", "32", "--batch-size", "8",
           "--precision", "32", "--repeats", "1", "--json", out]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    figures = json.loads(out.read_text())
    for name in ("grouped_seq_per_s", "free_seq_per_s", "speedup"):
        assert type(figures[name]) is float and math.isfinite(figures[name]) and figures[name] > 0, name
    # Windows of 1..32 inputs against max_len 32: the free order pads most batches to 32, the grouped one far less.
    assert figures["grouped_positions"] < 0.8 * figures["free_positions"] <= 0.8
