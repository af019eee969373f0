"""Smoke test of benchmarks/streamrec_ingest.py at a tiny size: old and new readers run, agree, and give flat JSON."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # four child processes per stage, each importing torch

ROOT = Path(__file__).resolve().parents[2]


def test_ingest_benchmark_compares_old_and_new_and_writes_flat_json(tmp_path: Path) -> None:
    out = tmp_path / "ingest.json"
    cmd = [sys.executable, "benchmarks/streamrec_ingest.py", "--rows", "2000", "--formats", "csv", "parquet",
           "--json", out]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]  # exits non-zero when old and new results differ
    figures = json.loads(out.read_text())
    for stage in ("read", "setup"):
        for fmt in ("csv", "parquet"):
            for key in ("old_s", "new_s", "old_cpu_s", "new_cpu_s", "old_peak_mib", "new_peak_mib", "old_imports_mib",
                        "new_imports_mib", "speedup", "cpu_speedup", "memory_ratio"):
                value = figures[f"{stage}_{fmt}_{key}"]
                assert type(value) is float and math.isfinite(value) and value > 0, (stage, fmt, key)
            # The old reader's module imports torch; today's read step does not, its DataModule does.
            assert figures[f"{stage}_{fmt}_old_torch"] == 1.0
            assert figures[f"{stage}_{fmt}_new_torch"] == (1.0 if stage == "setup" else 0.0)
    assert figures["rows"] == 2000 and figures["users"] == 50
    bad = subprocess.run([*cmd[:2], "--rows", "5"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "--rows must be at least 100" in bad.stderr
