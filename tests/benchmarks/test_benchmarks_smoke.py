"""Smoke tests of the benchmark scripts: each runs end to end and writes flat JSON figures."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # end-to-end: real processes, servers or training; `pytest -m "not slow"` skips them

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ("sdpa_ms", "explicit_ms", "time_ratio", "sdpa_mem_mib", "explicit_mem_mib", "mem_ratio", "repeats")


def test_attention_quick_writes_flat_json(run_benchmark) -> None:
    # One thread: with other jobs on the 2 shared cores, 2 spinning threads can run 100x slower.
    figures = run_benchmark("attention.py", "--quick", "--lengths", "128", "--device", "cpu", "--threads", "1",
                            timeout=120).figures
    expected = {
        f"cpu_fp32{mode}_T{t}_{figure}" for mode in ("", "_causal") for t in (128,) for figure in FIGURES
    }
    assert expected <= figures.keys(), sorted(expected - figures.keys())
    assert figures["cpu_threads"] == 1
    for name in expected:
        assert figures[name] >= 0 if "mem" in name else figures[name] > 0, name  # a peak may be 0 MiB above the base


def test_long_attention_quick_times_every_path_against_full(run_benchmark, benchmark_refuses) -> None:
    figures = run_benchmark("long_attention.py", "--quick", "--device", "cpu", "--threads", "1", timeout=120).figures
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


def _tiny_sequences(path: Path, users: int = 60, items: int = 25) -> None:
    """A per-user lines file in the Amazon sets' format: `user item item ...`, each user 5-9 items."""
    path.parent.mkdir(parents=True)
    lines = [" ".join([str(u)] + [str((u * 7 + 3 * t) % items + 1) for t in range(5 + u % 5)]) for u in range(1, users)]
    path.write_text("\n".join(lines) + "\n")


def test_recipe_benchmark_compares_variants_on_validation_and_resumes(run_benchmark, benchmark_refuses,
                                                                      benchmark_module, tmp_path: Path) -> None:
    _tiny_sequences(tmp_path / "data" / "amazon-beauty" / "Beauty.txt")
    _tiny_sequences(tmp_path / "data" / "yelp" / "Yelp.txt", users=40)
    args = ("--data-dir", tmp_path / "data", "--datasets", "beauty", "yelp", "--variants", "base:",
            "wide:d_model=32,lr=3e-3,ema_decay=0.9", "--set", "d_model=16,n_heads=1,d_ff=16", "--max-epochs", "2",
            "--limit-batches", "2", "--batch-size", "8", "--max-len", "10", "--precision", "32",
            "--out", tmp_path / "trials")
    figures = run_benchmark("streamrec_recipe.py", *args, in_process=True).figures
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
    assert json.loads(trials[1])["key"]["module"] == {"d_model": 32, "n_heads": 1, "d_ff": 16, "lr": 3e-3,
                                                      "ema_decay": 0.9}  # validated on Lightning's EMA weights

    # The rerun in this process (a child would import torch and Lightning again): every trial is read back.
    streamrec_recipe = benchmark_module("streamrec_recipe.py")
    rerun, threads = tmp_path / "rerun.json", torch.get_num_threads()
    try:
        streamrec_recipe.main([*map(str, args), "--json", str(rerun)])
    finally:
        torch.set_num_threads(threads)  # main sets its --threads for this whole process
    assert json.loads(rerun.read_text()) == figures
    assert len((tmp_path / "trials" / "trials.jsonl").read_text().splitlines()) == 4  # nothing trained twice

    assert "NAME:key=value" in benchmark_refuses("streamrec_recipe.py", "--variants", "lr=3e-3")


def test_batching_benchmark_trains_both_orders_and_counts_positions(run_benchmark, tmp_path: Path) -> None:
    rows = [f"u{u},i{(u * 7 + t) % 30},{t}" for u in range(60) for t in range(3 + u * 37 % 38)]  # 3..40 items
    log = tmp_path / "log.csv"
    log.write_text("user_id,item_id,timestamp\n" + "\n".join(rows) + "\n")
    figures = run_benchmark("streamrec_batching.py", "--data", log, "--max-len", "32", "--batch-size", "8",
                            "--precision", "32", "--repeats", "1", in_process=True).figures
    for name in ("grouped_seq_per_s", "free_seq_per_s", "speedup"):
        assert type(figures[name]) is float and figures[name] > 0, name
    # Windows of 1..32 inputs against max_len 32: the free order pads most batches to 32, the grouped one far less.
    assert figures["grouped_positions"] < 0.8 * figures["free_positions"] <= 0.8


def test_streamrec_long_growth_and_phases(benchmark_module, benchmark_refuses) -> None:
    """The growth figure by hand, a real training step and scoring at a tiny size, and the refusals (the timed
    run forks a process per memory point, so it is left to the command line)."""
    bench = benchmark_module("streamrec_long.py")
    figures = {"T100_train_full_ms": 10.0, "T400_train_full_ms": 160.0, "T100_train_linear_mem_mib": 8.0,
               "T400_train_linear_mem_mib": 32.0}
    got = bench.growth(figures, [400, 100])
    assert got == {"train_full_time_growth": 4.0, "train_linear_mem_growth": 1.0}  # 16x in 4x the length; 4x
    args = bench.parse_args(["--quick"])
    for attention in bench.ATTENTIONS:
        module, opt, batch = bench.build(args, attention, 32)
        before = module.model.item_vectors.detach().clone()
        bench.run_phase("train", module, opt, batch)
        assert not torch.equal(before, module.model.item_vectors), attention  # the step updated the table
        scores = module.model.recommend_scores(batch.inputs)
        assert scores.shape == (2, bench.NUM_ITEMS + 1) and torch.isfinite(scores[:, 1:]).all(), attention
    assert "two or more different lengths" in benchmark_refuses("streamrec_long.py", "--lengths", "512")


def test_hot_path_times_a_case_on_both_trees(run_benchmark, benchmark_refuses) -> None:
    args = ("--baseline", "HEAD", "--cases", "streamrec_beauty", "--rounds", "1", "--number", "1", "--quick")
    figures = run_benchmark("hot_path.py", *args, timeout=240).figures
    assert figures["streamrec_beauty_baseline_ms"] > 0 and figures["streamrec_beauty_today_ms"] > 0
    assert figures["streamrec_beauty_ratio"] > 0 and figures["rounds"] == 1
    assert "must be >= 1" in benchmark_refuses("hot_path.py", "--baseline", "HEAD", "--rounds", "0")
