"""Smoke test of benchmarks/streamrec_topk.py: tiny catalogues, every figure written, the paths agree."""

import pytest

pytestmark = pytest.mark.slow


def test_topk_benchmark_writes_flat_json(run_benchmark, benchmark_refuses) -> None:
    args = ("--items", "3000,7001", "--users", "40", "--batch-size", "16", "--repeats", "1", "--threads", "1", "--bf16")
    figures = run_benchmark("streamrec_topk.py", *args, "--item-chunk", "1000", in_process=True).figures
    for n in (3000, 7001):
        for path in ("full", "chunked", "bf16"):
            assert figures[f"N{n}_{path}_users_per_s"] > 0 and figures[f"N{n}_{path}_peak_rss_mib"] > 0
        assert figures[f"N{n}_chunked_same_topk_share"] == 1.0  # exact: the same lists as the full matrix
        assert 0.9 <= figures[f"N{n}_bf16_recall"] <= 1.0
    assert figures["item_chunk"] == 1000 and "N7001_chunked_speedup" in figures
    assert "must be positive" in benchmark_refuses("streamrec_topk.py", "--item-chunk", "0")
