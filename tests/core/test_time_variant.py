"""`core.nn.time_variant` against TV-Rec's node-variant filter written out term by term."""

from __future__ import annotations

import pytest
import torch

from core.nn.time_variant import TimeVariantEncoder, TimeVariantFilter


def _naive(taps: torch.Tensor, x: torch.Tensor, offset: int) -> torch.Tensor:
    """y[b, i] = sum over lags k = 0..i of H[offset + i, k] x[b, i - k], one product at a time."""
    y = torch.zeros_like(x)
    for b in range(x.shape[0]):
        for i in range(x.shape[1]):
            for k in range(i + 1):
                y[b, i] += taps[offset + i, k] * x[b, i - k]
    return y


@pytest.mark.parametrize(("length", "offset"), [(7, 0), (4, 3), (1, 6)])
def test_the_filter_is_the_formula(length, offset):
    torch.manual_seed(length)
    f = TimeVariantFilter(7, 3)
    x = torch.randn(2, length, 5, dtype=torch.float64)
    with torch.no_grad():
        taps = f.coefficients.double() @ f.bases.double()
        torch.testing.assert_close(f.taps().double(), taps)
        got = f.double()(x, offset=offset)
    torch.testing.assert_close(got, _naive(taps, x, offset))


def test_cut_leading_padding_and_masked_padding_give_the_full_windows_outputs():
    torch.manual_seed(0)
    f = TimeVariantFilter(6, 2)
    x = torch.randn(3, 6, 4)
    valid = torch.ones(3, 6, dtype=torch.bool)
    valid[:, :2] = False  # two columns of padding in every row
    full = f(x, valid)  # the padding's values are ignored
    torch.testing.assert_close(full, f(x.masked_fill(~valid[..., None], 0.0)))
    torch.testing.assert_close(full[:, 2:], f(x[:, 2:], offset=2), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="outside the filter's window of 6"):
        f(x[:, :4], offset=3)


def test_the_encoder_is_causal():
    torch.manual_seed(0)
    encoder = TimeVariantEncoder(8, n_layers=2, d_ff=16, max_len=5, n_bases=3).eval()
    x = torch.randn(1, 5, 8, requires_grad=True)
    out = encoder(x)
    assert out.shape == (1, 5, 8) and encoder(x, last=1).shape == (1, 1, 8)
    weights = torch.randn(8)  # not a plain sum: a LayerNorm's outputs sum to a constant
    for t in range(5):
        (grad,) = torch.autograd.grad(out[0, t] @ weights, x, retain_graph=True)
        assert bool((grad[0, t + 1 :] == 0).all()) and bool((grad[0, : t + 1] != 0).any())
