"""`core.nn.positions` against closed forms: complex-number RoPE, the sinusoid formula and the
ALiBi paper's slope recipe.

Legend: B batch, H heads, T time, Dh head width, D model width.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

from core.nn.positions import (
    ALiBi,
    LearnedPositions,
    RotaryEmbedding,
    SinusoidalPositions,
    alibi_slopes,
    apply_rope,
)

# --------------------------------------------------------------------------------------------
# RoPE


def rope_closed_form(x: Tensor, offset: int, base: float) -> Tensor:
    """Features (i, i + Dh/2) as one complex number, times exp(1j * pos * base^(-2i/Dh))."""
    t, dh = x.shape[-2], x.shape[-1]
    half = dh // 2
    x = x.double()
    z = torch.complex(x[..., :half], x[..., half:])  # (..., T, Dh/2)
    pos = torch.arange(offset, offset + t, dtype=torch.float64)[:, None]
    i = torch.arange(half, dtype=torch.float64)[None, :]
    angle = pos * base ** (-2.0 * i / dh)  # (T, Dh/2)
    rotated = z * torch.polar(torch.ones_like(angle), angle)
    return torch.cat([rotated.real, rotated.imag], dim=-1)


@pytest.mark.parametrize("base", [10000.0, 50.0])
@pytest.mark.parametrize("offset", [0, 7])
@pytest.mark.parametrize("head_dim", [2, 8, 16])
def test_rope_equals_closed_form_rotation(head_dim: int, offset: int, base: float) -> None:
    rope = RotaryEmbedding(head_dim, max_len=64, base=base)
    x = torch.randn(2, 3, 5, head_dim)
    out = rope(x, offset)
    # The table is float32: angles up to ~11 rad carry ~1e-6 absolute error.
    torch.testing.assert_close(out.double(), rope_closed_form(x, offset, base), atol=1e-5, rtol=1e-5)


def test_rope_preserves_norm_of_each_pair() -> None:
    rope = RotaryEmbedding(8, max_len=32)
    x = torch.randn(1, 2, 10, 8, dtype=torch.float64)
    out = rope(x)
    pair_norm = x[..., :4] ** 2 + x[..., 4:] ** 2
    torch.testing.assert_close(out[..., :4] ** 2 + out[..., 4:] ** 2, pair_norm)
    torch.testing.assert_close(out[:, :, 0], x[:, :, 0])  # position 0 is not rotated


def _score(rope: RotaryEmbedding, q: Tensor, k: Tensor, m: int, n: int) -> Tensor:
    """q rotated as position m, k as position n, then their dot product."""
    return (rope(q, offset=m) * rope(k, offset=n)).sum(-1)


@settings(max_examples=30, deadline=None)
@given(m=st.integers(0, 40), n=st.integers(0, 40), shift=st.integers(0, 20))
def test_rope_score_depends_only_on_relative_offset(m: int, n: int, shift: int) -> None:
    torch.manual_seed(1)
    rope = RotaryEmbedding(8, max_len=64)
    q = torch.randn(2, 3, 1, 8, dtype=torch.float64)
    k = torch.randn(2, 3, 1, 8, dtype=torch.float64)
    torch.testing.assert_close(_score(rope, q, k, m + shift, n + shift), _score(rope, q, k, m, n), atol=1e-5, rtol=1e-5)


def test_rope_score_does_change_with_relative_offset() -> None:
    # Guards the test above: the score must not be position-blind.
    rope = RotaryEmbedding(8, max_len=64)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    assert not torch.allclose(_score(rope, q, k, 5, 2), _score(rope, q, k, 5, 4), atol=1e-3)


def test_apply_rope_rotates_queries_and_keys_at_the_same_positions() -> None:
    rope = RotaryEmbedding(8, max_len=32)
    q, k = torch.randn(2, 4, 3, 8), torch.randn(2, 2, 3, 8)  # fewer key heads (GQA)
    q_r, k_r = apply_rope(q, k, rope, offset=6)
    torch.testing.assert_close(q_r.double(), rope_closed_form(q, 6, 10000.0), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k_r.double(), rope_closed_form(k, 6, 10000.0), atol=1e-5, rtol=1e-5)


def test_rope_rejects_odd_head_dim() -> None:
    with pytest.raises(ValueError, match="even head dimension"):
        RotaryEmbedding(3, max_len=8)


def test_rope_rejects_positions_past_max_len() -> None:
    rope = RotaryEmbedding(4, max_len=8)
    rope(torch.randn(1, 1, 3, 4), offset=5)  # positions 5..7 fit
    with pytest.raises(ValueError, match="`max_len`"):
        rope(torch.randn(1, 1, 3, 4), offset=6)


# --------------------------------------------------------------------------------------------
# Additive positions


@pytest.mark.parametrize("offset", [0, 4])
def test_sinusoidal_positions_equal_formula(offset: int) -> None:
    d, t = 6, 5
    pe = SinusoidalPositions(d, max_len=16)
    x = torch.randn(2, t, d)
    expected = torch.zeros(t, d, dtype=torch.float64)
    for p in range(t):
        pos = offset + p
        for i in range(d // 2):
            expected[p, 2 * i] = math.sin(pos / 10000 ** (2 * i / d))
            expected[p, 2 * i + 1] = math.cos(pos / 10000 ** (2 * i / d))
    torch.testing.assert_close((pe(x, offset) - x).double(), expected.expand(2, t, d), atol=1e-6, rtol=1e-5)


def test_sinusoidal_positions_reject_odd_d_model_and_long_input() -> None:
    with pytest.raises(ValueError, match="`d_model`"):
        SinusoidalPositions(5, max_len=8)
    with pytest.raises(ValueError, match="`max_len`"):
        SinusoidalPositions(4, max_len=6)(torch.randn(1, 4, 4), offset=3)


@pytest.mark.parametrize("offset", [0, 3])
def test_learned_positions_add_their_rows(offset: int) -> None:
    pe = LearnedPositions(4, max_len=10)
    x = torch.randn(2, 5, 4)
    expected = x + pe.embedding.weight.detach()[offset : offset + 5]
    torch.testing.assert_close(pe(x, offset), expected)
    with pytest.raises(ValueError, match="`max_len`"):
        pe(x, offset=6)


# --------------------------------------------------------------------------------------------
# ALiBi


def paper_alibi_slopes(n: int) -> list[float]:
    """The recipe from the ALiBi authors' code (ofirpress/attention_with_linear_biases)."""

    def get_slopes_power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return get_slopes_power_of_2(closest_power_of_2) + paper_alibi_slopes(2 * closest_power_of_2)[0::2][
        : n - closest_power_of_2
    ]


def test_alibi_slopes_power_of_two() -> None:
    expected = torch.tensor([2.0 ** (-8.0 * i / 8) for i in range(1, 9)])  # 1/2, 1/4, ..., 1/256
    torch.testing.assert_close(alibi_slopes(8), expected)
    torch.testing.assert_close(alibi_slopes(4), torch.tensor([2.0 ** (-8.0 * i / 4) for i in range(1, 5)]))


@pytest.mark.parametrize("n_heads", [1, 2, 3, 5, 6, 12, 16, 24])
def test_alibi_slopes_equal_paper_recipe(n_heads: int) -> None:
    torch.testing.assert_close(alibi_slopes(n_heads), torch.tensor(paper_alibi_slopes(n_heads)))


def test_alibi_slopes_six_heads_by_hand() -> None:
    # 4 heads: 2^-2, 2^-4, 2^-6, 2^-8; then every other slope of 8 heads: 2^-1, 2^-3.
    torch.testing.assert_close(alibi_slopes(6), torch.tensor([2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3]))


@pytest.mark.parametrize("t_q, t_k", [(5, 5), (1, 6), (3, 7)])
def test_alibi_bias_is_minus_slope_times_distance(t_q: int, t_k: int) -> None:
    n_heads = 6
    slopes = paper_alibi_slopes(n_heads)
    bias = ALiBi(n_heads, max_len=16)(t_q, t_k)
    assert bias.shape == (1, n_heads, t_q, t_k)
    expected = torch.zeros(1, n_heads, t_q, t_k)
    for h in range(n_heads):
        for i in range(t_q):
            q_pos = t_k - t_q + i  # queries are the last t_q positions
            for j in range(t_k):
                expected[0, h, i, j] = -slopes[h] * abs(q_pos - j)
    torch.testing.assert_close(bias, expected)


def test_alibi_rejects_keys_past_max_len() -> None:
    with pytest.raises(ValueError, match="`max_len`"):
        ALiBi(4, max_len=8)(1, 9)
