"""Smoke test of benchmarks/translate_stream_memory.py: tiny inputs end to end, flat JSON, identical outputs."""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench(benchmark_module) -> ModuleType:
    return benchmark_module("translate_stream_memory.py")


def test_inputs_and_old_modules(bench: ModuleType, tmp_path: Path) -> None:
    path = bench.write_input(tmp_path / "in.en", 3, 4, ["a", "b"], seed=1)
    rows = path.read_text(encoding="utf-8").split("\n")
    assert rows[-1] == "" and len(rows) == 4 and all(len(r.split()) == 4 and set(r.split()) <= {"a", "b"}
                                                        for r in rows[:-1])
    folder = bench.old_modules(bench.BASELINE, tmp_path / "old")
    old_infer = (folder / "old_infer.py").read_text()
    assert "from old_api import" in old_infer and "from translate.api import" not in old_infer
    old_api = (folder / "old_api.py").read_text()
    assert "--chunk-size" in old_infer and "def encode_sources" in old_api
    assert not any(old in old_api for old in bench.COMPAT)  # calls rewritten for today's keyword-only signatures
    with pytest.raises(SystemExit):
        bench.parse_args(["--lines", "0"])
    with pytest.raises(SystemExit):  # a forked run must not use a thread pool its parent may have started
        bench.parse_args(["--fork", "--threads", "2"])


def test_each_real_run_is_a_fresh_interpreter(bench: ModuleType, tmp_path: Path) -> None:
    # What the real mode does for every run (the smoke run below forks instead): `python -c PROBE` imports the
    # module from the extra path, runs its main and reports the fresh process's own peak and seconds.
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "fake_infer.py").write_text(
        "import os\n"
        "def main(argv):\n"
        "    import torch\n"
        "    open(argv[0], 'w').write(f'{os.getpid()} {torch.get_num_threads()}')\n")
    got = bench.probe("fake_infer", [str(tmp_path / "out")], 2, tmp_path, str(tmp_path / "lib"))
    pid, threads = map(int, (tmp_path / "out").read_text().split())
    assert pid != os.getpid() and threads == 2  # its own process, with the requested threads
    assert set(got) == {"peak_mib", "s"} and got["peak_mib"] > 50 and got["s"] >= 0  # torch alone is more


@pytest.mark.slow
def test_tiny_run_writes_flat_json(run_benchmark, tmp_path: Path) -> None:
    # --fork: each run forked from the benchmark's process, not a fresh interpreter that imports torch and
    # Lightning again (the test above checks that path); the peaks then include the benchmark's own memory.
    run = run_benchmark("translate_stream_memory.py", "--lines", "3", "5", "--words", "8", "--max-len", "16",
                        "--chunk-lines", "2", "--workdir", tmp_path, "--fork", timeout=600)
    figures = run.figures
    for n in (3, 5):
        assert figures[f"outputs_equal_{n}"] == 1.0  # the old and the new script wrote the same translations
        for path in ("old", "new"):
            # whole-process peaks, each measured in its own process: compared with a constant, never each other
            assert figures[f"{path}_{n}_peak_mib"] > 50 and figures[f"{path}_floor_mib"] > 50  # torch alone is more
        assert figures[f"peak_ratio_{n}"] == pytest.approx(figures[f"old_{n}_peak_mib"] / figures[f"new_{n}_peak_mib"])
    assert figures["new_growth"] == pytest.approx(figures["new_5_peak_mib"] / figures["new_3_peak_mib"])
    assert (figures["smallest_lines"], figures["largest_lines"], figures["words"]) == (3, 5, 8)
    assert sorted(p.name for p in tmp_path.iterdir()) == [run.json.name]  # its temporary folder is gone
