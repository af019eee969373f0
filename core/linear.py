"""Dense layers whose fp32 CPU matmuls run in oneDNN rather than MKL.

PyTorch's fp32 `F.linear` on CPU calls MKL's sgemm. On the AMD Zen 5 cores these machines have
(AVX-512), MKL takes an AVX2 path: ~100 GFLOP/s a core, where oneDNN's GEMM (the op torch's
inductor calls for frozen CPU linears, `torch.ops.mkldnn._linear_pointwise`) reaches 210-245 at
the decoder's and training shapes, with MKL's results to ~1e-6 relative (`benchmarks/linear.py`).
bf16 matmuls already go through oneDNN. So `Linear` sends fp32 CPU inputs there on AVX-512 CPUs,
the forward, the input gradient and (below `ONEDNN_MAX_GRAD_ROWS` outputs) the weight gradient;
inference reuses each weight in oneDNN's blocked layout. Elsewhere (GPUs, autocast, other dtypes,
AVX2-only CPUs, where this was not measured) it is `F.linear`.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.weak import WeakIdKeyDictionary

_enabled = True

# Widest layer (output features) whose weight gradient goes to oneDNN, as (x.T @ grad).T: 1.3-2x MKL's
# grad.T @ x up to 1,024 outputs, but 0.89x for the whole forward + backward of an 8,000-way output
# layer with 2 threads (`benchmarks/linear.py`), so wider layers keep MKL for it.
ONEDNN_MAX_GRAD_ROWS = 4096


@functools.cache
def onednn_available() -> bool:
    """True on CPUs where routing fp32 linears to oneDNN was measured to pay (AVX-512) and the op exists."""
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        and torch.backends.cpu.get_cpu_capability().startswith(("AVX512", "AMX"))
    )


@contextlib.contextmanager
def onednn_linear(enabled: bool) -> Iterator[None]:
    """Turn the oneDNN route on or off inside the block (benchmarks and tests compare the two)."""
    global _enabled
    before, _enabled = _enabled, enabled
    try:
        yield
    finally:
        _enabled = before


def _uses_onednn(x: Tensor, weight: Tensor) -> bool:
    return (
        _enabled
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and x.numel() > 0  # oneDNN cannot build the weight gradient's GEMM for zero rows
        and not torch.is_autocast_enabled("cpu")
        and onednn_available()
    )


def _onednn(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


# weight -> (its version counter, data pointer, oneDNN's blocked copy of it). Outside the modules:
# a blocked tensor can be neither deep-copied nor pickled, and a copied model gets new weights anyway.
_packed = WeakIdKeyDictionary()  # by identity: a tensor's == compares elements

# Rows oneDNN is told to expect when packing: the first call's, but at least this many. Packed for
# 160 rows, the 8,000-way output layer ran 1.07x its unpacked speed at 32 and 160 rows
# (`benchmarks/linear.py --threads 2`, "packed" column); packed for 1 row it ran no faster than
# unpacked at 160 rows (2,174 against 2,035 us, torch.ops.mkldnn called directly, 2 threads).
PACK_ROWS = 128


def _packed_weight(weight: Tensor, rows: int) -> Tensor:
    """`weight` in oneDNN's blocked layout, packed once and reused until the weight changes.

    Inference only (no gradient flows through it). An in-place update bumps the version counter
    and replacing `.data` moves the pointer, so either repacks.
    """
    key = (weight._version, weight.data_ptr())
    hit = _packed.get(weight)
    if hit is not None and hit[:2] == key:
        return hit[2]
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), max(rows, PACK_ROWS))
    _packed[weight] = (*key, packed)
    return packed


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
            if weight.shape[0] <= ONEDNN_MAX_GRAD_ROWS:  # (x.T @ grad).T in oneDNN
                grad_w = _onednn(x_rows.t(), rows.t(), None).t().contiguous()
            else:
                grad_w = rows.t() @ x_rows
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = rows.sum(0)
        return grad_x, grad_w, grad_b


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """`F.linear(x, weight, bias)`, through oneDNN where that is faster (module docstring).

    Args:
        x: (..., K) inputs.
        weight: (N, K).
        bias: (N,) or None.
    """
    if not _uses_onednn(x, weight):
        return F.linear(x, weight, bias)
    needs_grad = torch.is_grad_enabled() and (
        x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    )
    if needs_grad:
        return _OneDNNLinear.apply(x, weight, bias)
    return _onednn(x, _packed_weight(weight, x.numel() // x.shape[-1]), bias)


class Linear(nn.Linear):
    """`nn.Linear` (same parameters and state dict) computed by `linear`.

    Args:
        in_features: input width K.
        out_features: output width N.
        bias: whether to add a learned bias.
        device: where the parameters live.
        dtype: the parameters' dtype.
    """

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)


def as_plain_linear(module: nn.Module) -> nn.Module:
    """Turn every `Linear` in `module` into an `nn.Linear` in place (torch.ao quantisation matches exact types)."""
    for m in module.modules():
        if type(m) is Linear:
            m.__class__ = nn.Linear
    return module
