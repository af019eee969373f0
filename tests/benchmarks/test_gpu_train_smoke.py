"""Smoke test of benchmarks/gpu_train.py on the CPU: the tiny preset end to end, eager only, without HF.

It checks the figures' shape and what does not depend on the machine (FLOP counts, sizes, MFU when a peak is
given); no timing is compared with another.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow  # end-to-end: real processes, servers or training; `pytest -m "not slow"` skips them

TINY = ("--preset", "tiny", "--device", "cpu", "--steps", "1", "--warmup", "1", "--rounds", "1", "--threads", "1",
        "--no-hf", "--peak-tflops", "1")
SYSTEM_FIGURES = {"translate": ("step_ms", "tok_s", "tflops", "peak_mib", "mfu"),
                  "streamrec": ("step_ms", "seq_s", "tflops", "peak_mib", "mfu")}


def test_tiny_preset_on_cpu_writes_every_figure(run_benchmark) -> None:
    run = run_benchmark("gpu_train.py", *TINY, timeout=180, in_process=True)
    f = run.figures
    for section, figures in SYSTEM_FIGURES.items():
        for figure in figures:
            value = f[f"{section}_ours_eager_{figure}"]
            assert value >= 0 if figure == "peak_mib" else value > 0, (section, figure)
        assert f"{section}_ours_compile_default_step_ms" not in f  # no compiled rows on CPU by default
        assert f[f"{section}_ours_flops_per_step"] > 0
    assert f["translate_mfu_best"] > 0
    assert "translate_speedup_vs_hf" not in f and f["hf_available"] == 0
    assert (f["d_model"], f["batch_size"], f["length"], f["streamrec_num_items"], f["cuda"]) == (32, 4, 8, 50, 0)
    assert "HF MarianMTModel: left out (--no-hf)" in run.stdout and "target met" in run.stdout


def test_bad_arguments_are_refused_in_one_line(benchmark_refuses) -> None:
    assert "--steps must be >= 1, got 0" in benchmark_refuses("gpu_train.py", "--steps", "0")
