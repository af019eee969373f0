"""Sliding-window and linear attention against the formulas written out quadratically."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from core.nn.linear_attention import (
    LinearAttention,
    LinearAttentionState,
    causal_linear_attention,
    feature_map,
    linear_attention_step,
)
from core.nn.stacks import Encoder
from core.nn.windowed import WindowAttention, windowed_attention


def qkv(b=2, h=4, hkv=2, t=23, dh=8, dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(b, h, t, dh, generator=g, dtype=dtype), torch.randn(b, hkv, t, dh, generator=g, dtype=dtype),
            torch.randn(b, hkv, t, dh, generator=g, dtype=dtype))


def left_padding(b: int, t: int) -> torch.Tensor:
    valid = torch.ones(b, t, dtype=torch.bool)
    valid[1, :9] = False
    return valid


def band_mask(t: int, window: int) -> torch.Tensor:
    """(T, T) boolean, True where query i may see key j: i - W < j <= i (the full-attention reference)."""
    i = torch.arange(t)[:, None]
    return (i >= i.T) & (i.T > i - window)


def naive_softmax(q, k, v, allowed):
    """softmax(QK^T / sqrt(Dh)) V over `allowed` (B, 1, T, T), rows with nothing allowed -> 0."""
    k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
    scores = (q @ k.transpose(-2, -1)) / q.shape[-1] ** 0.5
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1).nan_to_num(0.0)
    return weights @ v


@pytest.mark.parametrize("window", [1, 4, 5, 23, 40])
def test_windowed_equals_full_attention_under_the_band_mask(window):
    q, k, v = qkv()
    valid = left_padding(2, 23)
    allowed = band_mask(23, window)[None, None] & valid[:, None, None, :]
    expected = naive_softmax(q, k, v, allowed)
    torch.testing.assert_close(windowed_attention(q, k, v, window, valid), expected)
    # and SDPA's own masked path, as core.nn.attention would run it with the band mask
    sdpa = F.scaled_dot_product_attention(q, *(x.repeat_interleave(2, dim=1) for x in (k, v)), attn_mask=allowed)
    rows = allowed.any(-1, keepdim=True)
    torch.testing.assert_close(windowed_attention(q, k, v, window, valid), sdpa.masked_fill(~rows, 0.0))


def test_windowed_refuses_an_empty_window():
    with pytest.raises(ValueError, match="window"):
        windowed_attention(*qkv(), window=0)


def naive_linear(q, k, v, valid):
    k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
    fq, fk = feature_map(q), feature_map(k) * valid[:, None, :, None]
    a = (fq @ fk.transpose(-2, -1)).tril()  # (B, H, T, T)
    den = a.sum(-1, keepdim=True)
    return torch.where(den > 0, (a @ v) / den.clamp_min(1e-300), torch.zeros(()).to(q))


@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_linear_attention_equals_the_quadratic_formula(chunk):
    q, k, v = qkv()
    valid = left_padding(2, 23)
    torch.testing.assert_close(causal_linear_attention(q, k, v, valid, chunk=chunk), naive_linear(q, k, v, valid))


def test_linear_attention_decodes_step_by_step_with_a_constant_state():
    q, k, v = qkv(t=11)
    state = LinearAttentionState.empty(2, 4, 8)
    state.sums, state.norms = state.sums.double(), state.norms.double()
    steps = [linear_attention_step(*(x[:, :, t : t + 1] for x in (q, k, v)), state) for t in range(11)]
    assert state.sums.shape == (2, 4, 8, 8)  # the same size after every step
    torch.testing.assert_close(torch.cat(steps, dim=2), causal_linear_attention(q, k, v, chunk=4))


def test_bf16_inputs_sum_in_fp32():
    q, k, v = qkv(dtype=torch.float32)
    out = causal_linear_attention(q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), causal_linear_attention(q, k, v), atol=0.05, rtol=0.05)


def test_an_encoder_with_a_window_as_long_as_the_input_is_full_attention():
    from core.nn import Encoder, causal_padding_mask

    torch.manual_seed(0)
    full = Encoder(16, 2, n_layers=2, d_ff=32, max_len=12, causal=True).eval()
    windowed = Encoder(16, 2, n_layers=2, d_ff=32, max_len=12, causal=True, kernel=WindowAttention(12)).eval()
    windowed.load_state_dict(full.state_dict())
    x = torch.randn(2, 12, 16)
    valid = left_padding(2, 12)
    expected = full(x, causal_padding_mask(valid[:, None, None, :]))
    got = windowed(x, valid=valid)
    torch.testing.assert_close(got[valid], expected[valid])  # padding positions' outputs are not used
    torch.testing.assert_close(windowed(x, valid=valid, last=1), got[:, -1:])


def test_long_attention_kinds_refuse_what_they_cannot_do():
    from core.nn import Encoder

    with pytest.raises(ValueError, match="causal"):
        Encoder(16, 2, n_layers=1, d_ff=32, max_len=8, kernel=LinearAttention())
    enc = Encoder(16, 2, n_layers=1, d_ff=32, max_len=8, causal=True, kernel=LinearAttention())
    with pytest.raises(ValueError, match="valid"):
        enc(torch.randn(1, 8, 16), torch.ones(1, 1, 1, 8, dtype=torch.bool))
    with pytest.raises(ValueError, match="full attention"):
        enc.new_cache()


@pytest.mark.parametrize("window", [1, 5, 23])
def test_the_flex_kernel_equals_the_band_mask_and_the_blocks(window):
    """FlexAttention's path, run eagerly here (compiled, with gradients, on CUDA: tests/core/test_cuda.py), gives
    the band-masked softmax, zeros for padding queries included."""
    import warnings

    from core.nn import windowed

    if windowed._flex() is None:
        pytest.skip("this torch has no FlexAttention")
    q, k, v = (x.float() for x in qkv(t=37))  # FlexAttention has no CPU backward
    valid = left_padding(2, 37)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()": eager is the point here
        got = windowed_attention(q, k, v, window, valid, kernel="flex")
    allowed = band_mask(37, window)[None, None] & valid[:, None, None, :]
    torch.testing.assert_close(got, naive_softmax(q, k, v, allowed), atol=1e-5, rtol=1e-5)


def test_the_kernel_choice_and_its_refusals():
    from core.nn import windowed

    q, k, v = qkv(dtype=torch.float32)
    with pytest.raises(ValueError, match="kernel"):
        windowed_attention(q, k, v, 4, kernel="triton")
    if windowed._flex() is not None:
        with pytest.raises(ValueError, match="dropout"):
            windowed_attention(q, k, v, 4, dropout_p=0.1, kernel="flex")
        # the private flag that keeps the CUDA mask compiled is still where we look for it
        assert windowed._mask_options(cuda=True) == {"_compile": True}
    assert windowed._mask_options(cuda=False) == {}


def test_window_part_refuses_an_empty_window() -> None:
    with pytest.raises(ValueError, match="`window` must be >= 1, got 0"):
        WindowAttention(0)


def test_a_kernel_part_needs_a_causal_stack() -> None:
    with pytest.raises(ValueError, match="WindowAttention needs `causal=True`"):
        Encoder(16, 2, n_layers=1, d_ff=32, max_len=8, kernel=WindowAttention(4))
