"""`core.linear_cross_entropy` against autograd through `F.cross_entropy` on materialised logits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from core import linear_cross_entropy

M, D, V = 37, 8, 23


def _inputs(dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(M, D, generator=g, dtype=dtype)
    weight = torch.randn(V, D, generator=g, dtype=dtype)
    targets = torch.randint(0, V, (M,), generator=g)
    return hidden, weight, targets


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("chunk_elements", [1, 20 * V, 1 << 20])  # 16-row chunks, ragged 20-row chunks, one chunk
def test_value_and_gradients_equal_cross_entropy_on_logits(eps, chunk_elements):
    hidden, weight, targets = _inputs()
    h1, w1 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    h2, w2 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    ours = linear_cross_entropy(h1, w1, targets, eps, chunk_elements)
    reference = F.cross_entropy(h2 @ w2.T, targets, label_smoothing=eps)
    torch.testing.assert_close(ours, reference, atol=1e-12, rtol=1e-12)
    (2.5 * ours).backward()
    (2.5 * reference).backward()
    torch.testing.assert_close(h1.grad, h2.grad, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(w1.grad, w2.grad, atol=1e-12, rtol=1e-12)


def test_loss_stays_finite_when_the_target_probability_underflows():
    hidden, weight, targets = _inputs(torch.float32)
    hidden = hidden * 200.0  # logits spread over thousands: the target's softmax prob is 0 in fp32
    ours = linear_cross_entropy(hidden, weight, targets)
    reference = F.cross_entropy(hidden.double() @ weight.double().T, targets)
    assert torch.isfinite(ours) and abs(ours.item() - reference.item()) / reference.item() < 1e-5


def test_bad_label_smoothing_is_rejected():
    hidden, weight, targets = _inputs()
    with pytest.raises(ValueError, match="label_smoothing"):
        linear_cross_entropy(hidden, weight, targets, label_smoothing=1.0)
