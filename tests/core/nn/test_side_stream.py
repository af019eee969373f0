"""`SideStream`: a second input's query-key logits added to self-attention's, against the formula written out:
softmax((Q K^T + Q_s K_s^T) / sqrt(Dh) + masks) V, per head, with the values from the main input alone.

Legend: B batch, T time, D width, W side width, H query heads, Hkv key/value heads, Dh head width (D / H)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from core.nn.attention import MultiHeadAttention, SideStream
from core.nn.explain import AttentionCapture
from core.nn.masks import padding_mask
from core.nn.stacks import Encoder
from core.nn.windowed import WindowAttention

B, T, D, W, H = 2, 5, 16, 12, 4
ITEMS = torch.tensor([[0, 0, 3, 1, 2], [4, 1, 2, 2, 3]])  # row 0 left-padded


def naive(attn: MultiHeadAttention, x: Tensor, side: Tensor, allowed: Tensor) -> Tensor:
    """The layer by hand: every projection as a matrix product, one (row, head) at a time, an explicit softmax over
    the allowed keys (a query with none gets zeros), then the output projection."""
    hkv, dh = attn.n_kv_heads, D // H
    q, k, v = (x @ attn.qkv.weight.T + attn.qkv.bias).split([D, hkv * dh, hkv * dh], dim=-1)
    ws = W // H
    q_s, k_s = (side @ attn.side_qk.weight.T + attn.side_qk.bias).split([H * ws, hkv * ws], dim=-1)
    out = torch.zeros(B, T, D, dtype=x.dtype)
    for b in range(B):
        for h in range(H):
            g = h // (H // hkv)  # the key/value head serving query head h
            qh, kh, vh = q[b, :, h * dh : (h + 1) * dh], k[b, :, g * dh : (g + 1) * dh], v[b, :, g * dh : (g + 1) * dh]
            qs, ks = q_s[b, :, h * ws : (h + 1) * ws], k_s[b, :, g * ws : (g + 1) * ws]
            logits = (qh @ kh.T + qs @ ks.T) / math.sqrt(dh)
            logits = logits.masked_fill(~allowed[b], float("-inf"))
            weights = torch.nan_to_num(logits.softmax(-1), nan=0.0)
            out[b, :, h * dh : (h + 1) * dh] = weights @ vh
    return out @ attn.out.weight.T + attn.out.bias


def _inputs(seed: int = 0) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, T, D, generator=g, dtype=torch.float64), torch.randn(B, T, W, generator=g,
                                                                                dtype=torch.float64)


@pytest.mark.parametrize("n_kv_heads", [None, 2])
@pytest.mark.parametrize("causal", [True, False])
def test_attention_adds_the_side_logits_to_the_softmax(causal, n_kv_heads):
    torch.manual_seed(0)
    attn = MultiHeadAttention(D, H, n_kv_heads=n_kv_heads, side=SideStream(W)).double().eval()
    x, side = _inputs()
    keys = padding_mask(ITEMS, 0)  # (B, 1, 1, T)
    allowed = keys[:, 0].expand(B, T, T)
    if causal:
        allowed = allowed & torch.ones(T, T, dtype=torch.bool).tril()
    want = naive(attn, x, side, allowed)
    got = attn(x, keys, is_causal=causal, side=side)
    real = ITEMS != 0  # queries at padding see no key (causal) or are never read
    torch.testing.assert_close(got[real], want[real])
    capture = AttentionCapture(attn)  # the explicit path that keeps the weights: same output
    with capture:
        torch.testing.assert_close(attn(x, keys, is_causal=causal, side=side)[real], want[real])
    assert [w.shape for w in capture.weights[""]] == [(B, H, T, T)]


def test_an_encoder_with_silent_side_projections_is_the_plain_encoder():
    torch.manual_seed(0)
    sizes = dict(n_layers=2, d_ff=32, max_len=T, causal=True, positions="learned")
    plain, sided = Encoder(D, H, **sizes).eval(), Encoder(D, H, side=SideStream(W), **sizes).eval()
    missing = sided.load_state_dict(plain.state_dict(), strict=False).missing_keys
    assert missing and all("side_qk" in key for key in missing)
    x, side = (t.float() for t in _inputs(1))
    keys = padding_mask(ITEMS, 0)
    assert not torch.allclose(sided(x, keys, side=side), plain(x, keys))  # the side stream acts
    for layer in sided.layers:
        layer.self_attn.side_qk.weight.data.zero_()  # biases are zero from `init_linear`
    torch.testing.assert_close(sided(x, keys, side=side), plain(x, keys))
    torch.testing.assert_close(sided(x, keys, side=side, last=1), plain(x, keys, last=1))


def test_incremental_decoding_keeps_the_side_keys():
    torch.manual_seed(0)
    encoder = Encoder(D, H, side=SideStream(W), n_layers=2, d_ff=32, max_len=T, causal=True).eval()
    for layer in encoder.layers:  # biases matter too
        torch.nn.init.normal_(layer.self_attn.side_qk.bias)
    x, side = (t.float() for t in _inputs(2))
    whole = encoder(x, side=side)
    cache = encoder.new_cache()
    steps = [encoder(x[:, t : t + 1], cache=cache, side=side[:, t : t + 1]) for t in range(T)]
    torch.testing.assert_close(torch.cat(steps, 1), whole)


def test_a_side_stream_refuses_what_it_cannot_join():
    with pytest.raises(ValueError, match="divide its width"):
        MultiHeadAttention(D, H, side=SideStream(W + 1))
    with pytest.raises(ValueError, match="no `kernel`"):
        MultiHeadAttention(D, H, side=SideStream(W), kernel=WindowAttention(2))
    with pytest.raises(ValueError, match="exactly when"):
        MultiHeadAttention(D, H)(torch.zeros(1, 2, D), side=torch.zeros(1, 2, W))
    with pytest.raises(ValueError, match="exactly when"):
        MultiHeadAttention(D, H, side=SideStream(W))(torch.zeros(1, 2, D))
    with pytest.raises(ValueError, match=">= 1"):
        SideStream(0)
