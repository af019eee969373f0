"""`core.nn.cpu_fastpath`'s dropout against what a Bernoulli(1 - p) mask and `F.dropout` must give.

Rates are checked with binomial bounds (5 standard deviations), per 16-bit lane of the
64-bit draws as well as overall, so a lane with a biased bit cannot hide in the average.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from core.nn.cpu_fastpath import FastDropout, dropout, dropout_mask, effective_p


def _within(frac: float, prob: float, n: int, sigmas: float = 5.0) -> bool:
    return abs(frac - prob) <= sigmas * math.sqrt(prob * (1 - prob) / n)


@pytest.mark.parametrize("p", [0.05, 0.1, 0.3, 0.5, 0.9])
def test_keep_rate_is_one_minus_p_in_every_lane(p):
    torch.manual_seed(0)
    keep = dropout_mask((1000, 1000), p).flatten()
    assert keep.dtype == torch.bool
    assert _within(keep.float().mean().item(), 1 - p, keep.numel())
    lanes = keep.view(-1, 4)  # element i came from 16-bit lane i % 4 of a 64-bit draw
    for j in range(4):
        assert _within(lanes[:, j].float().mean().item(), 1 - p, lanes.shape[0]), f"lane {j}"


def test_neighbouring_elements_are_independent():
    torch.manual_seed(1)
    p = 0.3
    keep = dropout_mask((2_000_000,), p)
    for lag in (1, 2, 3, 4, 5):
        both = (keep[:-lag] & keep[lag:]).float().mean().item()
        assert _within(both, (1 - p) ** 2, keep.numel() - lag), f"lag {lag}"


def test_effective_p_is_p_to_a_32768th():
    for p in (0.0, 0.1, 0.3, 1 / 3, 0.999, 1.0):
        assert abs(effective_p(p) - p) <= 0.5 / 32768


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_output_and_gradient_equal_mask_times_scale(dtype):
    """Half types take the mask as uint8 bytes; the result must be the same product as with the bool mask."""
    x = torch.randn(64, 48, dtype=dtype, requires_grad=True)
    upstream = torch.randn(64, 48, dtype=dtype)
    p = 0.3
    torch.manual_seed(7)
    out = dropout(x, p)
    out.backward(upstream)
    torch.manual_seed(7)
    keep = dropout_mask(x.shape, p)  # the same draws
    scale = 1 / (1 - effective_p(p))
    torch.testing.assert_close(out, x.detach() * keep * scale, rtol=0, atol=0)
    torch.testing.assert_close(x.grad, upstream * keep * scale, rtol=0, atol=0)


def test_unbiased_like_f_dropout():
    """E[dropout(x)] = x, as for `F.dropout`: the mean over many draws converges to the input."""
    torch.manual_seed(3)
    x = torch.full((400, 1000), 2.0)
    p = 0.3
    ours = dropout(x, p).mean().item()
    theirs = F.dropout(x, p, True).mean().item()
    sd = 2.0 * math.sqrt(p / (1 - p) / x.numel())  # sd of the mean of x * Bernoulli(1-p) / (1-p)
    assert abs(ours - 2.0) < 5 * sd and abs(theirs - 2.0) < 5 * sd


def test_same_seed_same_mask_and_new_draws_differ():
    x = torch.randn(32, 32)
    torch.manual_seed(5)
    a, b = dropout(x, 0.5), dropout(x, 0.5)
    torch.manual_seed(5)
    assert torch.equal(dropout(x, 0.5), a)
    assert not torch.equal(a, b)


def test_no_op_and_edge_probabilities():
    x = torch.randn(8, 8)
    assert dropout(x, 0.3, training=False) is x
    assert dropout(x, 0.0) is x
    assert dropout(x, 1e-6) is x  # rounds to p = 0
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    assert torch.equal(dropout(x, 0.99999), torch.zeros_like(x))  # rounds to p = 1: F.dropout's zeros
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="dropout probability"):
            dropout(x, bad)


def test_non_contiguous_input_is_masked_elementwise():
    x = torch.randn(64, 32).t()  # (32, 64), not contiguous
    torch.manual_seed(11)
    out = dropout(x, 0.5)
    torch.manual_seed(11)
    keep = dropout_mask(x.shape, 0.5)
    torch.testing.assert_close(out, x * keep * 2.0, rtol=0, atol=0)


def test_inplace_module_zeroes_in_place_like_nn_dropout():
    x = torch.ones(100, 100)
    out = FastDropout(0.5, inplace=True)(x)
    assert out.data_ptr() == x.data_ptr()
    assert set(out.unique().tolist()) == {0.0, 2.0}


def test_module_is_a_drop_in_for_nn_dropout():
    ours, theirs = FastDropout(0.25), nn.Dropout(0.25)
    assert ours.extra_repr() == theirs.extra_repr() and ours.state_dict() == theirs.state_dict() == {}
    x = torch.randn(16, 16, dtype=torch.bfloat16)
    assert ours.eval()(x) is x
    y = ours.train()(x)
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    kept = y != 0
    torch.testing.assert_close(y[kept], x[kept] * (1 / (1 - effective_p(0.25))), rtol=1e-2, atol=0)


def test_other_devices_keep_f_dropout(monkeypatch):
    """Off the CPU the fast mask is not used: F.dropout runs (here on the meta device, which has no data)."""
    seen = []
    monkeypatch.setattr(F, "dropout", lambda x, p, training: seen.append(x.device.type) or x)
    x = torch.empty(8, 8, device="meta")
    assert dropout(x, 0.3) is x and seen == ["meta"]
    dropout(torch.ones(8, 8), 0.3)  # the CPU takes the fast mask
    assert seen == ["meta"]
