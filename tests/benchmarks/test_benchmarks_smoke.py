"""Smoke tests of the benchmark scripts: each runs end to end and writes flat JSON figures."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # end-to-end: real processes, servers or training; `pytest -m "not slow"` skips them

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ("sdpa_ms", "explicit_ms", "time_ratio", "sdpa_mem_mib", "explicit_mem_mib", "mem_ratio", "repeats")


def test_attention_quick_writes_flat_json(run_benchmark) -> None:
    # One thread: with other jobs on the 2 shared cores, 2 spinning threads can run 100x slower.
    figures = run_benchmark("attention.py", "--quick", "--lengths", "128", "--device", "cpu", "--threads", "1",
                            in_process=True).figures
    expected = {
        f"cpu_fp32{mode}_T{t}_{figure}" for mode in ("", "_causal") for t in (128,) for figure in FIGURES
    }
    assert expected <= figures.keys(), sorted(expected - figures.keys())
    assert figures["cpu_threads"] == 1
    for name in expected:
        assert figures[name] >= 0 if "mem" in name else figures[name] > 0, name  # a peak may be 0 MiB above the base


def test_long_attention_quick_times_every_path_against_full(run_benchmark, benchmark_refuses) -> None:
    figures = run_benchmark("long_attention.py", "--quick", "--device", "cpu", "--threads", "1",
                            in_process=True).figures
    for t in (128,):
        for path in ("full", "full_nopad", "window", "linear"):
            assert figures[f"T{t}_{path}_ms"] > 0 and figures[f"T{t}_{path}_mem_mib"] >= 0, (t, path)
        for path in ("window", "linear"):
            assert figures[f"T{t}_{path}_time_ratio"] > 0 and figures[f"T{t}_{path}_mem_ratio"] > 0, (t, path)
    assert figures["window"] == 16
    assert "--window must be >= 1" in benchmark_refuses("long_attention.py", "--window", "0")


def test_dropout_benchmark_writes_flat_json(run_benchmark) -> None:
    figures = run_benchmark("dropout.py", "--widths", "16", "--repeats", "1", timeout=120, in_process=True).figures
    for mode in ("fwd", "train"):
        for figure in ("torch_ms", "core_ms", "speedup"):
            value = figures[f"{mode}_W16_{figure}"]
            assert type(value) is float and value > 0
    assert figures["p"] == 0.3 and figures["tokens"] == 4096


def test_loss_benchmark_times_a_baseline_chunk_size(run_benchmark, benchmark_refuses) -> None:
    args = ("--positions", "300", "--items", "500", "--d-model", "16", "--repeats", "1")
    figures = run_benchmark("streamrec_loss.py", *args, "--baseline-chunk-elements", "5000", timeout=120,
                            in_process=True).figures
    for name in ("naive_ms", "chunked_ms", "baseline_chunk_ms", "speedup", "speedup_vs_baseline_chunk"):
        assert type(figures[name]) is float and figures[name] > 0, name
    assert figures["loss_abs_diff"] < 1e-4  # the chunked loss is the plain cross-entropy
    assert "--baseline-chunk-elements must be positive" in benchmark_refuses(
        "streamrec_loss.py", "--baseline-chunk-elements", "0")


def test_rdrop_loss_benchmark_writes_flat_json(run_benchmark, benchmark_refuses) -> None:
    figures = run_benchmark("translate_rdrop_loss.py", "--positions", "300", "--vocab", "500", "--d-model", "16",
                            "--repeats", "1", timeout=120, in_process=True).figures
    for name in ("naive_ms", "chunked_ms", "speedup"):
        assert type(figures[name]) is float and figures[name] > 0, name
    # Peaks above the inputs' of two separate passes: either may be 0 MiB when the allocator reuses its memory.
    for name in ("naive_peak_mib", "chunked_peak_mib", "memory_ratio"):
        assert type(figures[name]) is float and figures[name] >= 0, name
    assert figures["loss_abs_diff"] < 1e-4  # the chunked loss is the paper's loss on logits
    assert "--alpha >= 0" in benchmark_refuses("translate_rdrop_loss.py", "--alpha", "-1")


def test_hot_path_times_a_case_on_both_trees(run_benchmark, benchmark_refuses, python3_shim, monkeypatch) -> None:
    # Each tree's child still imports core, streamrec and translate itself (and checks from where); only the
    # third-party modules (torch, lightning, ...) come imported, from the shim's fork server.
    monkeypatch.setattr(sys, "executable", str(python3_shim / "python3"))
    args = ("--baseline", "HEAD", "--cases", "streamrec_beauty", "--rounds", "1", "--number", "1", "--quick")
    figures = run_benchmark("hot_path.py", *args, in_process=True).figures
    assert figures["streamrec_beauty_baseline_ms"] > 0 and figures["streamrec_beauty_today_ms"] > 0
    assert figures["streamrec_beauty_ratio"] > 0 and figures["rounds"] == 1
    assert "must be >= 1" in benchmark_refuses("hot_path.py", "--baseline", "HEAD", "--rounds", "0")


def test_linear_benchmark_writes_flat_json(run_benchmark) -> None:
    figures = run_benchmark("linear.py", "--repeats", "1", "--number", "1", timeout=180, in_process=True).figures
    speedups = [name for name in figures if name.endswith("_speedup")]
    assert {name.split("_")[0] for name in speedups} == {"fwd", "train"}
    for name in speedups:
        assert figures[name] > 0, name
        assert figures[name.replace("_speedup", "_mkl_gflops")] > 0, name
    assert figures["threads"] == 1 and figures["onednn"] in (0, 1)


def test_sdpa_cpu_backend_benchmark_writes_flat_json(run_benchmark) -> None:
    figures = run_benchmark("sdpa_cpu_backend.py", "--lengths", "16", "--repeats", "1", "--heads", "2",
                            "--head-dim", "8", timeout=180, in_process=True).figures
    for mode in ("fwd", "train"):
        for figure in ("flash_ms", "math_ms", "flash_over_math"):
            assert figures[f"fp32_{mode}_T16_{figure}"] > 0, (mode, figure)
