"""bf16 "where the hardware has it": whether this CPU runs bf16 matmuls faster than fp32, and what to train in if not.

Without AVX-512, PyTorch runs CPU bf16 matmuls in a slow reference loop; with it, a CPU whose AMX units are
hidden (as hypervisors may) can still run them slower than fp32 (docs/core.md). Flags cannot tell, so
`cpu_has_fast_bf16` times one small matmul in each precision, once per process; where bf16 is not the
faster one, the CLIs train in fp32 and say so."""

from __future__ import annotations

import copy
import functools
import timeit
import warnings

import torch
from torch import nn

# What the benchmarks say when they will not time bf16; `no_fast_bf16_reason` adds the slower-than-fp32 case.
NO_BF16_KERNELS = "this CPU has no bf16 matmul kernels (no AVX-512: bf16 runs in a slow reference loop)"

# The probe: (PROBE_ROWS x PROBE_WIDTH) @ (PROBE_WIDTH x PROBE_ROWS), the shape class of a training step's
# projections; the best of 2 x PROBE_REPEATS runs in each precision (tens of milliseconds with kernel set-up).
PROBE_ROWS, PROBE_WIDTH, PROBE_REPEATS = 512, 256, 5
# bf16 must beat fp32 by this much to be used: near 1 the two are equally good and fp32 is exact.
FAST_BF16_MIN_SPEEDUP = 1.1


@functools.cache
def cpu_has_bf16_kernels() -> bool:
    """True where PyTorch's CPU bf16 matmuls go through oneDNN (AVX-512 / AMX cores), not a slow fallback."""
    # The same probe torch._inductor uses (`is_mkldnn_bf16_supported`); absent in some builds.
    probe = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    try:
        return bool(probe()) if probe is not None else False
    except RuntimeError:  # a build without oneDNN
        return False


def _matmul_seconds(dtype: torch.dtype) -> float:
    """Seconds of one warm probe matmul in `dtype` (the best of `PROBE_REPEATS`, so noise only adds)."""
    a = torch.randn(PROBE_ROWS, PROBE_WIDTH).to(dtype)
    b = torch.randn(PROBE_WIDTH, PROBE_ROWS).to(dtype)
    a @ b  # the first call builds oneDNN's kernel
    return min(timeit.repeat(lambda: a @ b, number=1, repeat=PROBE_REPEATS))


@functools.cache
def cpu_bf16_speedup() -> float:
    """fp32 matmul time / bf16 matmul time on this CPU at the current thread count (> 1: bf16 is faster)."""
    if not cpu_has_bf16_kernels():
        return 0.0
    fp32 = bf16 = float("inf")
    for _ in range(2):  # interleaved, so a burst of load hits both
        fp32 = min(fp32, _matmul_seconds(torch.float32))
        bf16 = min(bf16, _matmul_seconds(torch.bfloat16))
    return fp32 / max(bf16, 1e-12)


def cpu_has_fast_bf16() -> bool:
    """True where this CPU runs bf16 matmuls at least `FAST_BF16_MIN_SPEEDUP` times faster than fp32."""
    return cpu_has_bf16_kernels() and cpu_bf16_speedup() >= FAST_BF16_MIN_SPEEDUP


def no_fast_bf16_reason() -> str:
    """Why bf16 is not used on this CPU, in words for a one-line warning."""
    if not cpu_has_bf16_kernels():
        return NO_BF16_KERNELS
    return (f"bf16 matmuls on this CPU run at {cpu_bf16_speedup():.2f}x the fp32 rate, below the "
            f"{FAST_BF16_MIN_SPEEDUP}x that pays for bf16 (timed at start-up)")


def runs_on_cpu(accelerator: str) -> bool:
    """Whether a Lightning `trainer.accelerator` value ("cpu", "gpu", "auto", ...) trains on the CPU."""
    return accelerator == "cpu" or (
        accelerator == "auto" and not torch.cuda.is_available() and not torch.backends.mps.is_available())


def cpu_precision_fallback(precision: str | int | None, accelerator: str) -> tuple[str, str] | None:
    """(precision to train in, one-line reason) for a bf16 `trainer.precision` this CPU runs slowly; None: keep it."""
    if not str(precision).startswith("bf16") or not runs_on_cpu(str(accelerator)) or cpu_has_fast_bf16():
        return None
    return "32-true", (f"trainer.precision {precision}: {no_fast_bf16_reason()}, so training runs in 32-true; "
                       "pass --trainer.precision 32-true to say so yourself")


def quantize_int8(model: nn.Module, inplace: bool = False) -> nn.Module:
    """`model` (a copy, unless `inplace`) with its `nn.Linear` layers running in int8 on the CPU, for inference. Dynamic
    quantisation; embeddings, norms and attention stay float32. torch.ao's is deprecated in favour of torchao (not a
    dependency here): with the pinned torch it works, and its warnings are silenced."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    from core.nn.cpu_fastpath import disable_cpu_fastpath

    if not inplace:
        model = copy.deepcopy(model)
    with warnings.catch_warnings():
        for category in (DeprecationWarning, FutureWarning, UserWarning):  # the deprecation notices
            warnings.filterwarnings("ignore", ".*deprecat.*", category)
        disable_cpu_fastpath(model)  # quantize_dynamic matches exact types: FastLinear would stay float
        return quantize_dynamic(model, {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8, inplace=True)
