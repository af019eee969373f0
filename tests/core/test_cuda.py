"""The core on an NVIDIA GPU: SDPA's fused kernels are the ones that run, and they agree with a naive reference.

Skipped where no CUDA GPU is (CI has none); run on a lent one with `pytest tests/core/test_cuda.py`.

Legend: B batch, H heads, T time, Dh head width, D model width.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor
from torch.profiler import ProfilerActivity, profile

from core.nn.attention import MultiHeadAttention, attend
from core.nn.kv_cache import DecoderCache
from core.nn.masks import lengths_mask
from core.nn.stacks import Decoder

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

B, H, T, DH = 4, 4, 96, 32
CUDA = torch.device("cuda")


def _naive(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
    """softmax(QK^T / sqrt(Dh)) V in float64 on the CPU, masked rows left at zero."""
    q, k, v = (t.detach().double().cpu() for t in (q, k, v))
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    allowed = torch.ones(scores.shape[-2:], dtype=torch.bool)
    if causal:
        allowed = allowed.tril()
    if mask is not None:
        allowed = allowed & mask.cpu()
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1).nan_to_num(0.0)
    return weights @ v


def _cuda_kernels(fn) -> list[str]:
    """Names of the CUDA kernels `fn()` launched."""
    fn()  # warm-up: kernel selection and lazy initialisation stay out of the profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.key for e in prof.key_averages() if e.device_type.name == "CUDA"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", ["causal", "padding", "causal+padding"])
def test_attend_matches_naive_attention(case: str, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, T, DH, device=CUDA, dtype=dtype) for _ in range(3))
    lengths = torch.tensor([T, T - 5, 17, 1], device=CUDA)
    mask = lengths_mask(lengths, T) if "padding" in case else None
    causal = "causal" in case
    out = attend(q, k, v, mask, is_causal=causal)
    tol = {"atol": 2e-5, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(out.double().cpu(), _naive(q, k, v, mask, causal), **tol)


def test_bf16_gradients_match_fp32() -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(H * DH, H).to(CUDA)
    x = torch.randn(B, T, H * DH, device=CUDA, requires_grad=True)
    mask = lengths_mask(torch.tensor([T, 50, 9, T], device=CUDA), T)
    mha(x, mask).square().mean().backward()
    ref = x.grad.clone()
    x.grad = None
    with torch.autocast("cuda", dtype=torch.bfloat16):
        mha(x, mask).float().square().mean().backward()
    assert torch.isfinite(x.grad).all()
    cos = torch.nn.functional.cosine_similarity(x.grad.flatten(), ref.flatten(), dim=0)
    assert cos > 0.99, f"bf16 input gradient points elsewhere than fp32's (cosine {cos:.4f})"


def test_causal_bf16_self_attention_runs_the_flash_kernel() -> None:
    """Causal self-attention without a padding mask (a decoder's training step) reaches FlashAttention."""
    mha = MultiHeadAttention(H * DH, H).to(CUDA, torch.bfloat16)
    x = torch.randn(B, T, H * DH, device=CUDA, dtype=torch.bfloat16, requires_grad=True)
    names = _cuda_kernels(lambda: mha(x, is_causal=True).sum().backward())
    assert any("flash" in n.lower() for n in names), names
    assert not any("softmax" in n.lower() for n in names), f"a softmax kernel ran: the math path ({names})"


def test_padded_bf16_self_attention_stays_on_a_fused_kernel() -> None:
    """A padding mask rules out flash; SDPA must still pick a fused kernel (memory-efficient), not the math path."""
    mha = MultiHeadAttention(H * DH, H).to(CUDA, torch.bfloat16)
    x = torch.randn(B, T, H * DH, device=CUDA, dtype=torch.bfloat16, requires_grad=True)
    mask = lengths_mask(torch.tensor([T, 50, 9, T], device=CUDA), T)
    names = _cuda_kernels(lambda: mha(x, mask).sum().backward())
    assert not any("softmax" in n.lower() for n in names), f"a softmax kernel ran: the math path ({names})"
    assert any(("fmha" in n.lower() or "efficient" in n.lower() or "flash" in n.lower()) for n in names), names


def test_cached_decoding_equals_full_decoding() -> None:
    torch.manual_seed(0)
    dec = Decoder(64, 4, n_kv_heads=2, n_layers=2, d_ff=128, max_len=64).to(CUDA).eval()
    x = torch.randn(3, 20, 64, device=CUDA)
    memory = torch.randn(3, 11, 64, device=CUDA)
    memory_mask = lengths_mask(torch.tensor([11, 4, 7], device=CUDA), 11)
    with torch.no_grad():
        full = dec(x, memory, memory_mask)
        cache: DecoderCache = dec.new_cache(capacity=4)  # grows past 4 steps on the way
        steps = [dec(x[:, t : t + 1], memory, memory_mask, cache=cache) for t in range(x.shape[1])]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_windowed_attention_runs_flex_on_cuda_and_matches_the_blocks(dtype: torch.dtype) -> None:
    """`auto` picks compiled FlexAttention on CUDA; it and its gradients equal the SDPA block path's."""
    from core.nn import windowed

    if windowed._flex() is None:
        pytest.skip("this torch has no FlexAttention")
    g = torch.Generator(device="cuda").manual_seed(0)
    b, h, t, dh, w = 2, 4, 1000, 32, 128
    q, k, v = (torch.randn(b, h, t, dh, device="cuda", generator=g, dtype=dtype, requires_grad=True) for _ in range(3))
    valid = torch.ones(b, t, dtype=torch.bool, device="cuda")
    valid[1, :300] = False  # left padding
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 1e-4, "rtol": 1e-4}
    flex = windowed.windowed_attention(q, k, v, w, valid)  # auto
    blocks = windowed.windowed_attention(q, k, v, w, valid, kernel="blocks")
    torch.testing.assert_close(flex, blocks, **tol)
    grads = torch.autograd.grad(flex.float().square().sum(), (q, k, v))
    expected = torch.autograd.grad(blocks.float().square().sum(), (q, k, v))
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, **tol)
