"""Smoke test of benchmarks/gpu_train.py on the CPU: the tiny preset end to end, eager only, without HF; and
benchmarks/gpu/run_all.sh's dry run on a CPU.

They check the figures' shape and what does not depend on the machine (FLOP counts, sizes); no timing is compared
with another.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # end-to-end: real processes, servers or training; `pytest -m "not slow"` skips them

ROOT = Path(__file__).resolve().parents[2]
TINY = ("--preset", "tiny", "--device", "cpu", "--steps", "1", "--warmup", "1", "--rounds", "1", "--threads", "1",
        "--no-hf")
SYSTEM_FIGURES = {"translate": ("step_ms", "tok_s", "flop_s", "mfu", "peak_mib"),
                  "streamrec": ("step_ms", "seq_s", "flop_s", "mfu", "peak_mib")}


def test_tiny_preset_on_cpu_writes_every_figure(run_benchmark) -> None:
    run = run_benchmark("gpu_train.py", *TINY, timeout=180, in_process=True)
    f = run.figures
    for section, figures in SYSTEM_FIGURES.items():
        for figure in figures:
            value = f[f"{section}_ours_eager_{figure}"]
            assert value >= 0 if figure == "peak_mib" else value > 0, (section, figure)
        assert f[f"{section}_ours_eager_mfu"] < 5  # above 1 only if the peak probe were wrong; 5 leaves room for noise
        assert f"{section}_ours_compile_default_step_ms" not in f  # no compiled rows on CPU by default
        assert f[f"{section}_ours_flops_per_step"] > 0
    assert f["peak_flop_s"] > 0 and 0 < f["translate_mfu_best"] < 5
    assert "translate_speedup_vs_hf" not in f and f["hf_available"] == 0
    assert (f["d_model"], f["batch_size"], f["length"], f["streamrec_num_items"], f["cuda"]) == (32, 4, 8, 50, 0)
    assert "HF MarianMTModel: left out (--no-hf)" in run.stdout and "MFU" in run.stdout


def test_bad_arguments_are_refused_in_one_line(benchmark_refuses) -> None:
    assert "--steps must be >= 1, got 0" in benchmark_refuses("gpu_train.py", "--steps", "0")


def test_run_all_dry_run_on_cpu_summarises_the_tiny_preset(tmp_path: Path, python3_shim: Path) -> None:
    # python3: this venv's, each stage forked from a process that imported torch and lightning (conftest.py)
    # COMPILE is a word list: "--no-hf" keeps HF's rows (test_tiny_preset_on_cpu's business) and a peer venv out.
    env = {**os.environ, "ALLOW_CPU": "1", "PRESETS": "tiny", "COMPILE": "none --no-hf", "STEPS": "1",
           "OUT": str(tmp_path), "BUDGET_S": "400",
           "PATH": f"{python3_shim}:{Path(sys.executable).parent}:{os.environ['PATH']}"}
    res = subprocess.run(["bash", "benchmarks/gpu/run_all.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=500)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    summary = (tmp_path / "summary.txt").read_text()
    assert "environment: ok" in summary and "gpu_train tiny: ok" in summary, summary
    assert "MFU of ours, eager" in summary and "peak GEMM" in summary
    assert json.loads((tmp_path / "gpu_train_tiny.json").read_text())["streamrec_ours_eager_mfu"] > 0
