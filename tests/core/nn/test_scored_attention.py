"""Bahdanau and Luong attention against their formulas written out one query and one source position at a time."""

from __future__ import annotations

import math

import pytest
import torch

from core.nn import padding_mask
from core.nn.scored_attention import AdditiveAttention, MultiplicativeAttention


def naive(score, query, values, allowed):
    """context_bt = sum_s a_bts v_bs, a = softmax over the allowed s of score(b, t, s); nothing allowed -> zeros."""
    b, t, s = query.shape[0], query.shape[1], values.shape[1]
    contexts = torch.zeros(b, t, values.shape[2], dtype=values.dtype)
    weights = torch.zeros(b, t, s, dtype=values.dtype)
    for i in range(b):
        for j in range(t):
            picked = [k for k in range(s) if allowed[i, k]]
            if not picked:
                continue
            e = [math.exp(score(query[i, j], values[i, k])) for k in picked]
            for k, ek in zip(picked, e, strict=True):
                weights[i, j, k] = ek / sum(e)
                contexts[i, j] += weights[i, j, k] * values[i, k]
    return contexts, weights


@pytest.fixture
def data():
    g = torch.Generator().manual_seed(0)
    query = torch.randn(3, 2, 6, generator=g, dtype=torch.float64)
    values = torch.randn(3, 5, 6, generator=g, dtype=torch.float64)
    src = torch.tensor([[4, 5, 6, 7, 8], [4, 5, 0, 0, 0], [0, 0, 0, 0, 0]])  # the last row: all padding
    return query, values, src != 0


def test_additive_is_v_tanh_wq_q_plus_wk_k(data):
    query, values, allowed = data
    attn = AdditiveAttention(6, 6, 4).double().requires_grad_(False)

    def score(q, k):
        return float(attn.v.weight[0] @ torch.tanh(attn.query.weight @ q + attn.key.weight @ k + attn.key.bias))

    context, weights = attn(query, values, padding_mask(allowed.long(), 0)[:, 0])
    expected_context, expected_weights = naive(score, query, values, allowed)
    torch.testing.assert_close(weights, expected_weights)
    torch.testing.assert_close(context, expected_context)
    projected = attn.project_keys(values)  # a decoder computes it once and passes it at every step
    torch.testing.assert_close(attn(query, values, allowed[:, None, :], keys=projected)[0], expected_context)


@pytest.mark.parametrize("kind", ["dot", "general"])
def test_multiplicative_dot_and_general(data, kind):
    query, values, allowed = data
    attn = MultiplicativeAttention(6, 6, kind).double().requires_grad_(False)

    def score(q, k):
        return float(q @ k) if kind == "dot" else float(q @ attn.weight.weight @ k)

    context, weights = attn(query, values, allowed[:, None, :])
    expected_context, expected_weights = naive(score, query, values, allowed)
    torch.testing.assert_close(weights, expected_weights)
    torch.testing.assert_close(context, expected_context)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="score"):
        MultiplicativeAttention(4, 4, "concat")
    with pytest.raises(ValueError, match="equal widths"):
        MultiplicativeAttention(4, 6, "dot")
