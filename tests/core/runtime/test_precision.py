"""bf16 only where the CPU runs it faster than fp32: the kernel probe against the CPU's flags, the timed probe's
rule (with fake timings) and the fallback rule."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest
import torch

from core.runtime import precision
from core.runtime.precision import (
    cpu_has_bf16_kernels,
    cpu_has_fast_bf16,
    cpu_precision_fallback,
    quantize_int8,
    runs_on_cpu,
)


def _cpu_flags() -> set[str] | None:
    info = Path("/proc/cpuinfo")
    if platform.machine() not in ("x86_64", "AMD64") or not info.is_file():
        return None
    line = next((ln for ln in info.read_text().splitlines() if ln.startswith("flags")), None)
    return None if line is None else set(line.split(":", 1)[1].split())


def test_kernel_probe_agrees_with_the_cpu_flags():
    """oneDNN's bf16 kernels need AVX-512 (BW/VL/DQ at least); native bf16 units always qualify."""
    flags = _cpu_flags()
    if flags is None:
        pytest.skip("needs Linux on x86-64 to read the CPU flags")
    if {"avx512_bf16", "amx_bf16"} & flags:
        assert cpu_has_bf16_kernels()
    if "avx512f" not in flags:
        assert not cpu_has_bf16_kernels() and not cpu_has_fast_bf16()


def test_speedup_is_the_ratio_of_the_best_timed_matmuls(monkeypatch):
    """Best of each precision's runs (noise only adds time), fp32 over bf16: a hand computation."""
    times = {torch.float32: iter([3.0, 2.0]), torch.bfloat16: iter([5.0, 4.0])}
    monkeypatch.setattr(precision, "cpu_has_bf16_kernels", lambda: True)
    monkeypatch.setattr(precision, "_matmul_seconds", lambda dtype: next(times[dtype]))
    precision.cpu_bf16_speedup.cache_clear()
    try:
        assert precision.cpu_bf16_speedup() == pytest.approx(2.0 / 4.0)
    finally:
        precision.cpu_bf16_speedup.cache_clear()


@pytest.mark.parametrize(("kernels", "speedup", "fast"), [
    (True, 4.0, True), (True, precision.FAST_BF16_MIN_SPEEDUP, True), (True, 1.05, False), (True, 0.52, False),
    (False, 4.0, False),
])
def test_bf16_is_fast_only_with_kernels_that_beat_fp32(monkeypatch, kernels, speedup, fast):
    monkeypatch.setattr(precision, "cpu_has_bf16_kernels", lambda: kernels)
    monkeypatch.setattr(precision, "cpu_bf16_speedup", lambda: speedup)
    assert cpu_has_fast_bf16() is fast
    if not fast:
        reason = precision.no_fast_bf16_reason()
        assert "\n" not in reason
        assert (f"{speedup:.2f}x the fp32 rate" in reason) if kernels else reason == precision.NO_BF16_KERNELS


def test_the_real_probe_times_both_precisions():
    if not cpu_has_bf16_kernels():
        pytest.skip("no bf16 kernels on this CPU")
    for dtype in (torch.float32, torch.bfloat16):
        assert 0 < precision._matmul_seconds(dtype) < 1.0
    assert precision.cpu_bf16_speedup() > 0


@pytest.fixture
def slow_bf16(monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.parametrize("value", ["bf16-mixed", "bf16-true", "bf16"])
@pytest.mark.parametrize("accelerator", ["cpu", "auto"])
def test_bf16_on_a_slow_cpu_falls_back_to_fp32_and_says_why(slow_bf16, value, accelerator):
    new, reason = cpu_precision_fallback(value, accelerator)
    assert new == "32-true"
    assert value in reason and "32-true" in reason and "\n" not in reason


@pytest.mark.parametrize("value", ["32-true", 32, "16-mixed", None])
def test_other_precisions_are_kept(slow_bf16, value):
    assert cpu_precision_fallback(value, "cpu") is None


def test_gpus_and_fast_cpus_keep_bf16(slow_bf16, monkeypatch):
    assert cpu_precision_fallback("bf16-mixed", "gpu") is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cpu_precision_fallback("bf16-mixed", "auto") is None  # auto picks the GPU
    monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda: True)
    assert cpu_precision_fallback("bf16-mixed", "cpu") is None


def test_runs_on_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert runs_on_cpu("cpu") and runs_on_cpu("auto") and not runs_on_cpu("gpu") and not runs_on_cpu("cuda")


def test_quantize_int8_replaces_every_linear_and_stays_close_to_float32():
    """The int8 copy against the float32 original: every nn.Linear replaced, the original untouched,
    outputs within ~1% of the output scale (int8 per-row weights, per-call activations)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 32)).eval()
    x = torch.randn(100, 64)
    quantized = quantize_int8(model)
    assert not any(type(m) is torch.nn.Linear for m in quantized.modules())
    assert type(model[0]) is torch.nn.Linear  # a copy: the float model still works as before
    with torch.no_grad():
        want, got = model(x), quantized(x)
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert (got - want).abs().max() <= 0.02 * want.abs().max()
    assert (got - want).abs().max() > 0  # really int8 arithmetic, not the float path
