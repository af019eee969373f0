"""Opt-in CPU fast paths (`enable_cpu_fastpath`; docs/core.md): oneDNN's GEMM for fp32 linear layers, and a cheaper
dropout mask. Off by default: what they gain depends on the CPU (`benchmarks/cpu_fastpath.py`).

Linear: fp32 `F.linear` on CPU calls MKL's sgemm, which takes an AVX2 path on AMD's AVX-512 CPUs; oneDNN's
GEMM (`torch.ops.mkldnn._linear_pointwise`, what inductor calls for frozen CPU linears) uses AVX-512 there and
agrees with MKL to float rounding. `FastLinear` sends fp32 CPU inputs there outside autocast: the forward, the
input gradient and, below `ONEDNN_MAX_GRAD_ROWS` outputs and where MKL is on its AVX2 path, the weight gradient
(on Intel, MKL's own is the better one: oneDNN needs a transposed copy of the inputs). Anything else is `F.linear`.

Dropout: `F.dropout` on CPU draws one random number per element (`bernoulli_`). `dropout_mask` takes four
15-bit integers from each 64-bit draw (`random_` on int64 fills [0, 2**63), so each 16-bit lane is masked to
15 bits) and keeps an element when its integer is at least round(p * 2**15): Bernoulli(1 - p) with p rounded to
a multiple of 1/32768. It takes other draws than `bernoulli_`: a seeded run is reproducible from its own seed,
not draw for draw equal to one with the switch off. Off the CPU it is `F.dropout`.

Attention-weight dropout: the switch sets `cheap_dropout` on core's attention modules (`sdpa_math_with_cheap_dropout`).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# Widest layer (output features) whose weight gradient goes to oneDNN, as (x.T @ grad).T: faster than MKL's
# grad.T @ x for narrow layers, slower for a vocabulary-sized output layer (`benchmarks/linear.py`), so wider
# layers keep MKL for it.
ONEDNN_MAX_GRAD_ROWS = 4096

_BITS = 15
_LEVELS = 1 << _BITS


def enable_cpu_fastpath(model: nn.Module) -> int:
    """Turn every plain `nn.Linear` / `nn.Dropout` in `model` into `FastLinear` / `FastDropout` in place, and give
    core's attention modules the cheap weight-dropout mask; returns how many layers were swapped. Exact types only
    (subclasses such as `nn.MultiheadAttention`'s projection are left alone). The parameters stay the same objects, so
    an optimizer built before still holds them."""
    return _swap(model, {nn.Linear: FastLinear, nn.Dropout: FastDropout}, cheap=True)


def disable_cpu_fastpath(model: nn.Module) -> int:
    """The inverse of `enable_cpu_fastpath`, for where exact types matter (torch.ao's int8 quantisation) or oneDNN's
    op cannot go (ONNX export); returns the count."""
    return _swap(model, {FastLinear: nn.Linear, FastDropout: nn.Dropout}, cheap=False)


@contextlib.contextmanager
def cpu_fastpath_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """`model` with plain layers inside the block and its fast ones restored after (the ONNX exporter traces it)."""
    fast = [m for m in model.modules() if type(m) in (FastLinear, FastDropout)]
    cheap = [m for m in model.modules() if getattr(m, "cheap_dropout", False)]
    disable_cpu_fastpath(model)
    try:
        yield model
    finally:
        for m in fast:
            m.__class__ = FastLinear if isinstance(m, nn.Linear) else FastDropout
        for m in cheap:
            m.cheap_dropout = True


def _swap(model: nn.Module, classes: dict[type, type], cheap: bool) -> int:
    swapped = 0
    for m in model.modules():
        if hasattr(m, "cheap_dropout"):  # core's attention modules
            m.cheap_dropout = cheap
        new = classes.get(type(m))
        if new is not None:
            m.__class__ = new  # no new state on either side: the same module, another forward
            swapped += 1
    return swapped


@functools.cache
def onednn_available() -> bool:
    """True where this torch build has oneDNN's fp32 linear op (else `FastLinear` is `nn.Linear`)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


@functools.cache
def mkl_takes_avx2_path() -> bool:
    """False on Intel CPUs with AVX-512, where MKL's sgemm runs its AVX-512 kernels; True elsewhere. MKL picks its
    kernels by the CPU's vendor, oneDNN by instruction set. Without /proc/cpuinfo (not Linux) it says True, which keeps
    oneDNN for the weight gradient, the choice measured on AMD."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            head = info.read(1 << 16)
    except OSError:
        return True
    fields = dict(line.split(":", 1) for line in head.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    return not (fields.get("vendor_id") == "GenuineIntel" and "avx512f" in fields.get("flags", "").split())


def _uses_onednn(x: Tensor, weight: Tensor) -> bool:
    # x.numel() > 0: oneDNN cannot build the weight gradient's GEMM for zero rows.
    return (x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32 and x.numel() > 0
            and not torch.is_autocast_enabled("cpu") and onednn_available())


def _onednn(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class _OneDNNLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _onednn(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        x, weight = ctx.saved_tensors
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = _onednn(grad, weight.t(), None)  # grad @ weight
        rows = grad.reshape(-1, grad.shape[-1])
        if ctx.needs_input_grad[1]:
            x_rows = x.reshape(-1, x.shape[-1])
            onednn = weight.shape[0] <= ONEDNN_MAX_GRAD_ROWS and mkl_takes_avx2_path()  # (x.T @ grad).T in oneDNN
            grad_w = _onednn(x_rows.t(), rows.t(), None).t().contiguous() if onednn else rows.t() @ x_rows
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = rows.sum(0)
        return grad_x, grad_w, grad_b


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """`F.linear(x, weight, bias)`, through oneDNN for fp32 CPU inputs outside autocast (module docstring)."""
    if not _uses_onednn(x, weight):
        return F.linear(x, weight, bias)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias)):
        return _OneDNNLinear.apply(x, weight, bias)
    return _onednn(x, weight, bias)


class FastLinear(nn.Linear):
    """`nn.Linear` (same parameters and state dict) computed by `linear` above.

    Args:
        in_features: input width.
        out_features: output width.
        bias: whether to add a learned bias.
        device: where the parameters live.
        dtype: the parameters' dtype."""

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)


def dropout_mask(shape: torch.Size | tuple[int, ...], p: float, device: torch.device | str = "cpu") -> Tensor:
    """A bool tensor that is True (keep) with probability 1 - round(p * 2**15) / 2**15, from the default generator."""
    n = math.prod(shape)
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_()
    lanes = words.view(torch.int16)[:n].view(shape)
    return (lanes & (_LEVELS - 1)) >= round(p * _LEVELS)


def effective_p(p: float) -> float:
    """The drop probability `dropout_mask` realises for `p`."""
    return round(p * _LEVELS) / _LEVELS


class _KeepScale(torch.autograd.Function):
    """y = x * keep * scale, saving the bool mask (1 byte an element) for the backward pass."""

    @staticmethod
    def forward(ctx, x: Tensor, keep: Tensor, scale: float) -> Tensor:
        if x.dtype in (torch.bfloat16, torch.float16):
            keep = keep.view(torch.uint8)  # mul casts uint8 to bf16 about twice as fast as bool (same bytes)
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return torch.mul(x, keep).mul_(scale)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        (keep,) = ctx.saved_tensors
        return torch.mul(grad, keep).mul_(ctx.scale), None, None


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """`F.dropout(x, p, training)`, with the fast mask on CPU (p rounded to a multiple of 1/32768 there)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    q = effective_p(p)
    if not training or q == 0.0:  # p < 1/65536 rounds to no dropout
        return x
    if x.device.type != "cpu" or q == 1.0:
        return F.dropout(x, p, training)
    return _KeepScale.apply(x, dropout_mask(x.shape, p), 1.0 / (1.0 - q))


class FastDropout(nn.Dropout):
    """`nn.Dropout` (same arguments and state) computed by `dropout` above.

    Args:
        p: probability of zeroing an element (on CPU rounded to a multiple of 1/32768).
        inplace: zero in place (PyTorch's own in-place kernel; the fast mask is out of place)."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x) if self.inplace else dropout(x, self.p, self.training)


def sdpa_math_with_cheap_dropout(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, dropout_p: float,
                                 is_causal: bool, enable_gqa: bool) -> Tensor:
    """SDPA's math kernel (the one SDPA runs for CPU dropout) given a `dropout_mask` instead of drawing its own;
    it keeps an element with probability 1 - effective_p(dropout_p) and scales by 1 / (1 - that), as F.dropout."""
    p = effective_p(dropout_p)
    if p >= 1.0:  # everything dropped: the math kernel would divide by zero
        return q.new_zeros(*q.shape[:-1], v.shape[-1])
    keep = dropout_mask((*q.shape[:-1], k.shape[-2]), dropout_p, q.device)
    if attn_mask is not None and attn_mask.dtype == torch.bool:  # SDPA converts before its kernels; this one adds
        attn_mask = torch.zeros(attn_mask.shape, dtype=q.dtype).masked_fill_(~attn_mask, float("-inf"))
    _spend_mask_warning()
    return torch.ops.aten._scaled_dot_product_attention_math(q, k, v, attn_mask, p, is_causal, keep,
                                                             enable_gqa=enable_gqa)[0]


@functools.cache
def _spend_mask_warning() -> None:
    """Call the math kernel with a mask once with stderr closed: its C++ warning (once a process) says a given
    mask is for tests only, and would print on every training run."""
    x = torch.zeros(1, 1, 1, 1)
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            torch.ops.aten._scaled_dot_product_attention_math(x, x, x, None, 0.5, False, x.bool())
    finally:
        os.dup2(saved, 2)
        os.close(saved)
