"""Smoke test of benchmarks/streamrec_ingest.py at a tiny size: old and new readers run, agree, and give flat JSON."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow  # four child processes per stage, each importing torch


def test_ingest_benchmark_compares_old_and_new_and_writes_flat_json(run_benchmark, benchmark_refuses) -> None:
    # The script exits non-zero when old and new results differ.
    figures = run_benchmark("streamrec_ingest.py", "--rows", "400", "--formats", "csv", "parquet").figures
    for stage in ("read", "setup"):
        for fmt in ("csv", "parquet"):
            for key in ("old_s", "new_s", "old_cpu_s", "new_cpu_s", "old_peak_mib", "new_peak_mib", "old_imports_mib",
                        "new_imports_mib", "speedup", "cpu_speedup", "memory_ratio"):  # whole-process figures
                assert figures[f"{stage}_{fmt}_{key}"] > 0, (stage, fmt, key)
            # The old reader's module imports torch; today's read step does not, its DataModule does.
            assert figures[f"{stage}_{fmt}_old_torch"] == 1.0
            assert figures[f"{stage}_{fmt}_new_torch"] == (1.0 if stage == "setup" else 0.0)
    assert figures["rows"] == 400 and figures["users"] == 10
    assert "--rows must be at least 100" in benchmark_refuses("streamrec_ingest.py", "--rows", "5")
