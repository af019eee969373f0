"""Smoke test of benchmarks/cpu_fastpath.py: every case runs at tiny sizes and writes flat JSON figures."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a real process; `pytest -m "not slow"` skips it

ROOT = Path(__file__).resolve().parents[2]
CASES = ("streamrec_ml1m", "streamrec_beauty", "translate_multi30k_fp32", "translate_decode")


def test_quick_run_times_each_case_off_and_on(tmp_path: Path) -> None:
    out = tmp_path / "fastpath.json"
    cmd = [sys.executable, "benchmarks/cpu_fastpath.py", "--quick", "--repeats", "1", "--number", "1",
           "--cases", *CASES, "--json", out]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "speed-up" in res.stdout
    figures = json.loads(out.read_text())
    for case in CASES:
        for figure in ("off_ms", "on_ms", "speedup"):
            value = figures[f"{case}_{figure}"]
            assert type(value) is float and math.isfinite(value) and value > 0, (case, figure)
    assert figures["quick"] == 1 and figures["threads"] == 1
    bad = subprocess.run([*cmd[:2], "--repeats", "0"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "must be >= 1" in bad.stderr
