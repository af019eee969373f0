"""Smoke test of benchmarks/cpu_fastpath.py: every case runs at tiny sizes, off and on (and fp32 against bf16), and
writes flat JSON figures with each step's FLOP/s and MFU."""

from __future__ import annotations

import pytest

from core.runtime.precision import cpu_has_bf16_kernels

pytestmark = pytest.mark.slow  # a real process; `pytest -m "not slow"` skips it

CASES = ("streamrec_ml1m", "streamrec_beauty", "translate_multi30k_fp32", "translate_decode")


def test_quick_run_times_each_case_off_and_on(run_benchmark, benchmark_refuses) -> None:
    run = run_benchmark("cpu_fastpath.py", "--quick", "--repeats", "1", "--number", "1", "--cases", *CASES,
                        in_process=True)
    assert "speed-up" in run.stdout and "MFU" in run.stdout
    for case in CASES:
        for figure in ("off_ms", "on_ms", "speedup", "off_flop_s", "on_flop_s", "gflop"):
            value = run.figures[f"{case}_{figure}"]
            assert type(value) is float and value > 0, (case, figure)
        for label in ("off", "on"):
            assert 0 < run.figures[f"{case}_{label}_mfu"] < 5, (case, label)  # > 1 only if the peak probe were wrong
    assert run.figures["quick"] == 1 and run.figures["threads"] == 1 and run.figures["peak_flop_s_fp32"] > 0
    assert "must be >= 1" in benchmark_refuses("cpu_fastpath.py", "--repeats", "0")


@pytest.mark.skipif(not cpu_has_bf16_kernels(), reason="--compare precision refuses a CPU without bf16 kernels")
def test_quick_precision_run_checks_the_probe(run_benchmark) -> None:
    run = run_benchmark("cpu_fastpath.py", "--compare", "precision", "--quick", "--repeats", "1", "--number", "1",
                        in_process=True)
    assert "the probe" in run.stdout
    for case in ("streamrec_ml1m", "streamrec_beauty", "translate_multi30k_fp32"):
        for figure in ("fp32_ms", "bf16_ms", "speedup", "fp32_flop_s", "bf16_flop_s"):
            assert run.figures[f"{case}_{figure}"] > 0, (case, figure)
        assert 0 < run.figures[f"{case}_bf16_mfu"] < 5
        assert run.figures[f"{case}_agrees"] in (0, 1)
    assert run.figures["probe_speedup"] > 0 and run.figures["probe_fast_bf16"] in (0, 1)
    assert run.figures["peak_flop_s_bf16"] > 0
