"""Smoke test of benchmarks/gpu_train.py on the CPU: the tiny preset end to end, eager only, without HF.

It checks the figures' shape and what does not depend on the machine: ours and each plain-PyTorch reference,
started from the same weights, compute the same loss; their FLOP counts are of one order; MFU is there when a
peak is given. No timing is compared with another.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # end-to-end: real processes, servers or training; `pytest -m "not slow"` skips them

TINY = ("--preset", "tiny", "--device", "cpu", "--steps", "1", "--warmup", "1", "--rounds", "1", "--threads", "1",
        "--no-hf", "--peak-tflops", "1")
SYSTEM_FIGURES = {"translate": ("step_ms", "tok_s", "tflops", "peak_mib", "mfu"),
                  "streamrec": ("step_ms", "seq_s", "tflops", "peak_mib", "mfu")}
PEERS = {"translate": ("ours", "torch"), "streamrec": ("ours", "ref")}


def test_tiny_preset_on_cpu_writes_every_figure(run_benchmark) -> None:
    run = run_benchmark("gpu_train.py", *TINY, timeout=180, in_process=True)
    f = run.figures
    for section, figures in SYSTEM_FIGURES.items():
        for peer in PEERS[section]:
            for figure in figures:
                value = f[f"{section}_{peer}_eager_{figure}"]
                assert value >= 0 if figure == "peak_mib" else value > 0, (section, peer, figure)
            assert f"{section}_{peer}_compile_default_step_ms" not in f  # no compiled rows on CPU by default
        ours, ref = (f[f"{section}_{peer}_flops_per_step"] for peer in PEERS[section])
        assert ours > 0 and ref > 0 and 0.5 < ours / ref < 2, (section, ours, ref)  # one model, counted twice
    # Started from our weights, the references compute our loss (fp32, dropout off).
    assert f["translate_init_loss_abs_diff_torch"] < 1e-4
    assert f["streamrec_init_loss_abs_diff_ref"] < 1e-4
    for name in ("translate_speedup_vs_torch", "translate_eager_speedup_vs_torch", "translate_mfu_best",
                 "streamrec_speedup_vs_ref", "streamrec_eager_speedup_vs_ref"):
        assert f[name] > 0, name
    assert "translate_speedup_vs_hf" not in f and f["hf_available"] == 0
    assert (f["d_model"], f["batch_size"], f["length"], f["streamrec_num_items"], f["cuda"]) == (32, 4, 8, 50, 0)
    assert "HF MarianMTModel: left out (--no-hf)" in run.stdout and "target met" in run.stdout


def test_bad_arguments_are_refused_in_one_line(benchmark_refuses) -> None:
    assert "--steps must be >= 1, got 0" in benchmark_refuses("gpu_train.py", "--steps", "0")
