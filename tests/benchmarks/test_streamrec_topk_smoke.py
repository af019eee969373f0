"""Smoke test of benchmarks/streamrec_topk.py: tiny catalogues, every figure written, the paths agree."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_topk_benchmark_writes_flat_json(tmp_path: Path) -> None:
    out = tmp_path / "topk.json"
    cmd = [sys.executable, "benchmarks/streamrec_topk.py", "--items", "3000,7001", "--users", "40", "--batch-size",
           "16", "--item-chunk", "1000", "--repeats", "1", "--threads", "1", "--bf16", "--json", str(out)]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    figures = json.loads(out.read_text())
    for name, value in figures.items():
        assert type(value) in (int, float) and math.isfinite(value), (name, value)
    for n in (3000, 7001):
        for path in ("full", "chunked", "bf16"):
            assert figures[f"N{n}_{path}_users_per_s"] > 0 and figures[f"N{n}_{path}_peak_rss_mib"] > 0
        assert figures[f"N{n}_chunked_same_topk_share"] == 1.0  # exact: the same lists as the full matrix
        assert 0.9 <= figures[f"N{n}_bf16_recall"] <= 1.0
    assert figures["item_chunk"] == 1000 and "N7001_chunked_speedup" in figures
    bad = subprocess.run([*cmd[:2], "--item-chunk", "0"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "must be positive" in bad.stderr
