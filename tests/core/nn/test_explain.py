"""`core.nn.explain`: rollout and entropy against closed forms, capture mode against the fast
path.

Legend: B batch, H heads, T time, S source, D model width, L layers.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from core.nn.explain import AttentionCapture, attention_entropy, attention_rollout
from core.nn.masks import lengths_mask
from core.nn.stacks import Decoder, Encoder

B, T, D, H = 2, 6, 16, 4


def _random_rows(*shape: int) -> Tensor:
    return torch.rand(*shape).softmax(dim=-1)


# --------------------------------------------------------------------------------------------
# Rollout and entropy


@pytest.mark.parametrize("residual", [True, False])
@pytest.mark.parametrize("n_layers", [1, 3])
def test_rollout_of_identity_attention_is_identity(n_layers: int, residual: bool) -> None:
    eye = torch.eye(T).expand(B, H, T, T)
    out = attention_rollout([eye] * n_layers, residual=residual)
    torch.testing.assert_close(out, torch.eye(T).expand(B, T, T))


def test_rollout_of_one_layer_without_residual_is_head_mean() -> None:
    w = _random_rows(B, H, T, T)
    expected = sum(w[:, h] for h in range(H)) / H
    torch.testing.assert_close(attention_rollout([w], residual=False), expected)


def test_rollout_with_residual_by_hand() -> None:
    # Two layers: R = A2' @ A1', A' = (0.5 * mean_h A + 0.5 I) with rows renormalised.
    w1, w2 = _random_rows(B, H, T, T), _random_rows(B, H, T, T)

    def step(w: Tensor) -> Tensor:
        a = 0.5 * w.mean(1) + 0.5 * torch.eye(T)
        return a / a.sum(-1, keepdim=True)

    out = attention_rollout([w1, w2])
    torch.testing.assert_close(out, step(w2) @ step(w1))
    torch.testing.assert_close(out.sum(-1), torch.ones(B, T))  # still a distribution per row


def test_rollout_without_residual_multiplies_later_layers_on_the_left() -> None:
    # Layer 1 copies position 0 to everyone; layer 2 is a shift. Order matters.
    copy0 = torch.zeros(1, 1, 3, 3)
    copy0[..., 0] = 1.0
    shift = torch.tensor([[0.0, 0, 1], [1, 0, 0], [0, 1, 0]])[None, None]
    torch.testing.assert_close(attention_rollout([copy0, shift], residual=False), (shift @ copy0)[:, 0])
    torch.testing.assert_close(attention_rollout([shift, copy0], residual=False), (copy0 @ shift)[:, 0])


def test_rollout_needs_a_layer() -> None:
    with pytest.raises(ValueError, match="at least one layer"):
        attention_rollout([])


@pytest.mark.parametrize("n", [1, 2, 5, 17])
def test_entropy_of_uniform_and_one_hot_rows(n: int) -> None:
    uniform = torch.full((2, 3, n), 1.0 / n)
    torch.testing.assert_close(attention_entropy(uniform), torch.full((2, 3), math.log(n)))
    one_hot = torch.zeros(2, 3, n)
    one_hot[..., n - 1] = 1.0
    entropy = attention_entropy(one_hot)
    assert not bool(entropy.isnan().any())
    torch.testing.assert_close(entropy, torch.zeros(2, 3))


def test_entropy_by_hand() -> None:
    row = torch.tensor([0.5, 0.25, 0.25, 0.0])
    expected = -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25))
    assert float(attention_entropy(row)) == pytest.approx(expected, abs=1e-6)


# --------------------------------------------------------------------------------------------
# Capture mode


def _encoder(positions: str = "rope", causal: bool = False, n_kv_heads: int | None = None) -> Encoder:
    return Encoder(D, H, n_kv_heads=n_kv_heads, n_layers=2, d_ff=2 * D, max_len=32, positions=positions,
                   causal=causal).eval()


@pytest.mark.parametrize("n_kv_heads", [None, 2])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("positions", ["sinusoidal", "rope", "alibi"])
def test_capture_rows_sum_to_one_and_output_equals_fast_path(positions: str, causal: bool, n_kv_heads) -> None:
    enc = _encoder(positions, causal, n_kv_heads)
    x = torch.randn(B, T, D)
    mask = lengths_mask(torch.tensor([T, 3]), T)  # right padding: every row sees a key
    fast = enc(x, mask)
    with AttentionCapture(enc) as cap:
        captured = enc(x, mask)
    torch.testing.assert_close(captured, fast, atol=1e-5, rtol=1e-5)
    layers = cap.layers("self_attn")
    assert len(layers) == 2
    for w in layers:
        assert w.shape == (B, H, T, T)
        assert bool((w >= 0).all())
        torch.testing.assert_close(w.sum(-1), torch.ones(B, H, T), atol=1e-6, rtol=0)
        if causal:
            assert bool((w.triu(diagonal=1) == 0).all())


def test_capture_left_padded_causal_rows_without_keys_are_zero() -> None:
    # Left padding + causality: the pad queries see no key. Their rows are all zero; every
    # other row sums to 1 and the real positions match the fast path.
    enc = _encoder("sinusoidal", causal=True)
    lengths = torch.tensor([T, 2])
    mask = lengths_mask(lengths, T, left_padded=True)
    x = torch.randn(B, T, D)
    fast = enc(x, mask)
    with AttentionCapture(enc) as cap:
        captured = enc(x, mask)
    real = torch.arange(T)[None, :] >= (T - lengths)[:, None]  # (B, T)
    torch.testing.assert_close(captured[real], fast[real], atol=1e-5, rtol=1e-5)
    for w in cap.layers("self_attn"):
        row_sums = w.sum(-1).permute(0, 2, 1)  # (B, T, H)
        torch.testing.assert_close(row_sums[real], torch.ones(int(real.sum()), H), atol=1e-6, rtol=0)
        assert bool((row_sums[~real] == 0).all())


def test_capture_restores_the_fast_path() -> None:
    enc = _encoder()
    modules = [m for m in enc.modules() if hasattr(m, "capture")]
    assert len(modules) == 2
    cap = AttentionCapture(enc)
    with cap:
        assert all(isinstance(m.capture, list) for m in modules)
        enc(torch.randn(B, T, D))
    assert all(m.capture is None for m in modules)
    n_calls = [len(calls) for calls in cap.weights.values()]
    enc(torch.randn(B, T, D))  # after exit, nothing more is recorded
    assert [len(calls) for calls in cap.weights.values()] == n_calls


def test_capture_restores_the_fast_path_after_an_exception() -> None:
    enc = _encoder()
    with pytest.raises(RuntimeError), AttentionCapture(enc):
        enc(torch.randn(B, T, D + 1))  # wrong width
    assert all(m.capture is None for m in enc.modules() if hasattr(m, "capture"))


def test_capture_on_a_decoder_collects_cross_attention() -> None:
    s = 5
    dec = Decoder(D, H, n_layers=2, d_ff=2 * D, positions="rope", max_len=32).eval()
    y, memory = torch.randn(B, T, D), torch.randn(B, s, D)
    memory_mask = lengths_mask(torch.tensor([s, 3]), s)
    fast = dec(y, memory, memory_mask)
    with AttentionCapture(dec) as cap:
        captured = dec(y, memory, memory_mask)
    torch.testing.assert_close(captured, fast, atol=1e-5, rtol=1e-5)
    cross = cap.layers("cross_attn")
    self_attn = cap.layers("self_attn")
    assert len(cross) == 2 and len(self_attn) == 2
    for w in cross:
        assert w.shape == (B, H, T, s)
        torch.testing.assert_close(w.sum(-1), torch.ones(B, H, T), atol=1e-6, rtol=0)
        assert bool((w[1, :, :, 3:] == 0).all())
    for w in self_attn:
        assert w.shape == (B, H, T, T)
        assert bool((w.triu(diagonal=1) == 0).all())  # decoder self-attention is causal


def test_capture_weights_equal_a_hand_computed_softmax() -> None:
    # One attention layer in a wrapper: recompute its weights from the projection weights.
    enc = _encoder("none")
    attn = enc.layers[0].self_attn
    x = torch.randn(B, T, D)
    with AttentionCapture(nn.ModuleDict({"self_attn": attn})) as cap:
        attn(x)
    q, k, _ = (x @ attn.qkv.weight.T + attn.qkv.bias).split(D, dim=-1)
    q = q.view(B, T, H, D // H).transpose(1, 2)
    k = k.view(B, T, H, D // H).transpose(1, 2)
    expected = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D // H), dim=-1)
    torch.testing.assert_close(cap.layers("self_attn")[0], expected, atol=1e-6, rtol=1e-5)


def test_capture_errors() -> None:
    with pytest.raises(ValueError, match="no core attention module"):
        AttentionCapture(nn.Linear(2, 2))
    enc = _encoder()
    with AttentionCapture(enc) as cap:
        enc(torch.randn(B, T, D))
    with pytest.raises(ValueError, match="cross_attn"):
        cap.layers("cross_attn")
