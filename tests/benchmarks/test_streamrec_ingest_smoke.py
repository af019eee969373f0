"""Smoke test of benchmarks/streamrec_ingest.py at a tiny size: old and new readers run, agree, and give flat JSON."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # imports torch and Lightning


def test_ingest_benchmark_compares_old_and_new_and_writes_flat_json(run_benchmark, benchmark_refuses) -> None:
    # The script exits non-zero when old and new results differ. --in-process: every measurement in the script's
    # own process instead of a child each (today's read stage first, so its `torch` figure still tells).
    figures = run_benchmark("streamrec_ingest.py", "--rows", "400", "--formats", "csv", "parquet",
                            "--in-process").figures
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


def test_a_real_run_measures_each_reader_in_a_child_of_its_own(tmp_path: Path) -> None:
    """What the smoke run above does in its own process, a real run does in a fresh child per measurement (peak RSS
    from `os.wait4`): here today's read stage, which imports no torch, so the child is quick."""
    from streamrec.data.readers import read_interactions

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import streamrec_ingest
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    streamrec_ingest.generate(tmp_path, 400, 10, 50, seed=0, formats=("parquet",))
    log = tmp_path / "log.parquet"
    child = streamrec_ingest.measure("new", "read", log, tmp_path / "unused.py")
    items = read_interactions(log).items
    assert child["check"] == streamrec_ingest.digest(list(items), items)  # the child read the log we read here
    assert child["torch"] == 0.0 and child["peak_mib"] > 0 and child["imports_mib"] > 0 and child["cpu_s"] > 0
