"""Smoke test of benchmarks/cpu_fastpath.py: every case runs at tiny sizes and writes flat JSON figures."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow  # a real process; `pytest -m "not slow"` skips it

CASES = ("streamrec_ml1m", "streamrec_beauty", "translate_multi30k_fp32", "translate_decode")


def test_quick_run_times_each_case_off_and_on(run_benchmark, benchmark_refuses) -> None:
    run = run_benchmark("cpu_fastpath.py", "--quick", "--repeats", "1", "--number", "1", "--cases", *CASES,
                        in_process=True)
    assert "speed-up" in run.stdout
    for case in CASES:
        for figure in ("off_ms", "on_ms", "speedup"):
            value = run.figures[f"{case}_{figure}"]
            assert type(value) is float and value > 0, (case, figure)
    assert run.figures["quick"] == 1 and run.figures["threads"] == 1
    assert "must be >= 1" in benchmark_refuses("cpu_fastpath.py", "--repeats", "0")
