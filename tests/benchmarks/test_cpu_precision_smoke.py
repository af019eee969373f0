"""Smoke test of benchmarks/cpu_precision.py: each case runs at tiny sizes in both precisions and writes JSON."""

from __future__ import annotations

import pytest

from core.runtime.precision import cpu_has_bf16_kernels

pytestmark = pytest.mark.slow  # a real process; `pytest -m "not slow"` skips it


@pytest.mark.skipif(not cpu_has_bf16_kernels(), reason="the benchmark refuses a CPU without bf16 kernels")
def test_quick_run_times_each_case_in_both_precisions(run_benchmark, benchmark_refuses) -> None:
    run = run_benchmark("cpu_precision.py", "--quick", "--repeats", "1", "--number", "1", in_process=True)
    assert "the probe" in run.stdout
    for case in ("streamrec_ml1m", "streamrec_beauty", "translate_multi30k_fp32"):
        for figure in ("fp32_ms", "bf16_ms", "speedup"):
            value = run.figures[f"{case}_{figure}"]
            assert type(value) is float and value > 0, (case, figure)
        assert run.figures[f"{case}_agrees"] in (0, 1)
    assert run.figures["probe_speedup"] > 0 and run.figures["probe_fast_bf16"] in (0, 1)
    assert "must be >= 1" in benchmark_refuses("cpu_precision.py", "--repeats", "0")
