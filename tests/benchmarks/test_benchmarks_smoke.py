"""Smoke test of benchmarks/attention.py: `--quick` runs end to end and writes flat JSON figures."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

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
