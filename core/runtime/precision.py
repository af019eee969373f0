"""bf16 "where the hardware has it": whether this CPU runs bf16 matmuls fast, and what to train in if not.

PyTorch runs CPU bf16 matmuls through oneDNN only on cores with AVX-512 (natively with AVX512-BF16
or AMX). Elsewhere it falls back to a reference loop two orders of magnitude slower than fp32
(docs/results.md, "Precision and the fp32 fallback"): a config that asks for bf16-mixed would then
train far slower, so the CLIs fall back to fp32 there and say so.
"""

from __future__ import annotations

import copy
import functools
import warnings

import torch
from torch import nn

# What the CLIs, `translate.infer` and the benchmarks say when they do not use bf16.
NO_FAST_BF16 = "this CPU has no fast bf16 matmul (no AVX-512/AMX; bf16 runs in a reference loop, far slower than fp32)"


@functools.cache
def cpu_has_fast_bf16() -> bool:
    """True where PyTorch's CPU bf16 matmuls go through oneDNN (AVX-512 / AMX cores), not a slow fallback."""
    # The same probe torch._inductor uses (`is_mkldnn_bf16_supported`); absent in some builds.
    probe = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    try:
        return bool(probe()) if probe is not None else False
    except RuntimeError:  # a build without oneDNN
        return False


def runs_on_cpu(accelerator: str) -> bool:
    """Whether a Lightning `trainer.accelerator` value ("cpu", "gpu", "auto", ...) trains on the CPU."""
    if accelerator == "cpu":
        return True
    if accelerator == "auto":
        return not torch.cuda.is_available() and not torch.backends.mps.is_available()
    return False


def cpu_precision_fallback(precision: str | int | None, accelerator: str) -> tuple[str, str] | None:
    """(precision to train in, one-line reason) instead of a bf16 one this CPU cannot run fast; None keeps it.

    Args:
        precision: Lightning's `trainer.precision` ("bf16-mixed", "bf16-true", "32-true", 32, ...).
        accelerator: Lightning's `trainer.accelerator` ("auto", "cpu", "gpu", ...).
    """
    if not str(precision).startswith("bf16") or not runs_on_cpu(str(accelerator)) or cpu_has_fast_bf16():
        return None
    return "32-true", (f"trainer.precision {precision}: {NO_FAST_BF16}, so training runs in 32-true; "
                       "pass --trainer.precision 32-true to say so yourself")


def quantize_int8(model: nn.Module, inplace: bool = False) -> nn.Module:
    """`model` (a copy, unless `inplace`) with its `nn.Linear` layers running in int8 on the CPU, for inference.

    Dynamic quantisation: weights are stored in int8 with one scale per output row, activations are
    quantised per call from their own range, and the matmuls run in fbgemm/oneDNN int8 kernels.
    Embeddings, norms and attention stay float32. CPU only; the BLEU cost and the speed-up are in
    docs/results.md, "Precision and the fp32 fallback". torch.ao's eager quantisation is deprecated in
    favour of torchao (not a dependency here); with torch pinned at 2.13 it works, and its deprecation
    warnings are silenced.
    """
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    from core.nn.cpu_fastpath import disable_cpu_fastpath

    if not inplace:
        model = copy.deepcopy(model)

    with warnings.catch_warnings():
        for category in (DeprecationWarning, FutureWarning, UserWarning):  # the deprecation notices
            warnings.filterwarnings("ignore", ".*deprecat.*", category)
        spec = {nn.Linear: per_channel_dynamic_qconfig}
        disable_cpu_fastpath(model)  # quantize_dynamic matches exact types: FastLinear would stay float
        return quantize_dynamic(model, spec, dtype=torch.qint8, inplace=True)
