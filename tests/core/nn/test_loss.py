"""`core.linear_cross_entropy` and `core.rdrop_cross_entropy` against autograd on materialised logits;
`core.contrastive_loss` against NT-Xent written out view by view."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from core.nn import contrastive_loss, linear_cross_entropy, rdrop_cross_entropy

M, D, V = 37, 8, 23


def _inputs(dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(M, D, generator=g, dtype=dtype)
    weight = torch.randn(V, D, generator=g, dtype=dtype)
    targets = torch.randint(0, V, (M,), generator=g)
    return hidden, weight, targets


def _assert_same_value_and_gradients(ours_fn, reference_fn, hidden, weight):
    """Loss and both gradients (under a 2.5x upstream gradient) agree to 1e-12 in float64."""
    h1, w1 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    h2, w2 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    ours, reference = ours_fn(h1, w1), reference_fn(h2, w2)
    torch.testing.assert_close(ours, reference, atol=1e-12, rtol=1e-12)
    (2.5 * ours).backward()
    (2.5 * reference).backward()
    torch.testing.assert_close(h1.grad, h2.grad, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(w1.grad, w2.grad, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("chunk_elements", [1, 20 * V, 1 << 20])  # 16-row chunks, ragged 20-row chunks, one chunk
def test_value_and_gradients_equal_cross_entropy_on_logits(eps, chunk_elements):
    hidden, weight, targets = _inputs()
    _assert_same_value_and_gradients(
        lambda h, w: linear_cross_entropy(h, w, targets, eps, chunk_elements),
        lambda h, w: F.cross_entropy(h @ w.T, targets, label_smoothing=eps), hidden, weight)


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


def _rdrop_reference(hidden, weight, targets, eps, alpha):
    """R-Drop as the paper's code writes it: CE of both passes and F.kl_div both ways, on full logits."""
    logits = hidden @ weight.T  # (2, M, V)
    ce = (F.cross_entropy(logits[0], targets, label_smoothing=eps)
          + F.cross_entropy(logits[1], targets, label_smoothing=eps)) / 2
    logp = logits.log_softmax(-1)
    p_loss = F.kl_div(logp[0], logp[1], log_target=True, reduction="sum")  # KL(p2 || p1)
    q_loss = F.kl_div(logp[1], logp[0], log_target=True, reduction="sum")  # KL(p1 || p2)
    return ce + alpha * (p_loss + q_loss) / 4 / targets.shape[0]


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("alpha", [0.0, 1.0, 5.0])
@pytest.mark.parametrize("chunk_elements", [1, 20 * V, 1 << 20])
def test_rdrop_value_and_gradients_equal_autograd_on_logits(eps, alpha, chunk_elements):
    hidden, weight, targets = _inputs()
    pair = torch.stack([hidden, hidden + 0.3 * torch.randn(M, D, generator=torch.Generator().manual_seed(1),
                                                           dtype=hidden.dtype)])
    _assert_same_value_and_gradients(
        lambda h, w: rdrop_cross_entropy(h, w, targets, eps, alpha, chunk_elements),
        lambda h, w: _rdrop_reference(h, w, targets, eps, alpha), pair, weight)


@pytest.mark.parametrize("autocast", [True, False])
def test_bf16_matmuls_are_close_to_float64(autocast):
    """Under bf16 autocast (fp32 states, as a LayerNorm hands them over) or with bf16 states and no autocast, the
    loss and both gradients stay within bf16 rounding of the float64 reference, in 16-row chunks."""
    hidden, weight, targets = _inputs(torch.float32)
    h = hidden.clone().requires_grad_() if autocast else hidden.bfloat16().requires_grad_()
    w = weight.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        ours = linear_cross_entropy(h, w, targets, 0.1, chunk_elements=1)
    assert ours.dtype == torch.float32
    ours.backward()
    h2, w2 = hidden.double().requires_grad_(), weight.double().requires_grad_()
    reference = F.cross_entropy(h2 @ w2.T, targets, label_smoothing=0.1)
    reference.backward()
    assert abs(ours.item() - reference.item()) / reference.item() < 2e-2
    for grad, ref in ((h.grad, h2.grad), (w.grad, w2.grad)):
        assert grad.dtype == (torch.float32 if grad is w.grad or autocast else torch.bfloat16)
        assert (grad.double() - ref).norm() / ref.norm() < 3e-2


def test_rdrop_of_two_equal_passes_is_the_cross_entropy():
    hidden, weight, targets = _inputs()
    ours = rdrop_cross_entropy(torch.stack([hidden, hidden]), weight, targets, 0.1, alpha=5.0)
    torch.testing.assert_close(ours, linear_cross_entropy(hidden, weight, targets, 0.1), atol=1e-12, rtol=1e-12)


def test_rdrop_under_bf16_autocast_is_close_to_fp32():
    hidden, weight, targets = _inputs(torch.float32)
    pair = torch.stack([hidden, hidden.flip(0)])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = rdrop_cross_entropy(pair, weight, targets, 0.1, 5.0)
    assert ours.dtype == torch.float32
    reference = _rdrop_reference(pair.double(), weight.double(), targets, 0.1, 5.0)
    assert abs(ours.item() - reference.item()) / reference.item() < 2e-2


def test_rdrop_needs_two_passes():
    hidden, weight, targets = _inputs()
    with pytest.raises(ValueError, match=r"\(2, M, D\)"):
        rdrop_cross_entropy(hidden, weight, targets)


def _nt_xent_by_hand(first, second, temperature, groups):
    """Each of the 2B views against every other view but itself and (with groups) the other rows of its group."""
    views, rows = torch.cat([first, second]).tolist(), first.shape[0]
    total = 0.0
    for i in range(2 * rows):
        twin = (i + rows) % (2 * rows)
        denominator, numerator = 0.0, 0.0
        for j in range(2 * rows):
            same_group = groups is not None and i % rows != j % rows and groups[i % rows] == groups[j % rows]
            if j == i or same_group:
                continue
            e = math.exp(sum(a * b for a, b in zip(views[i], views[j], strict=True)) / temperature)
            denominator += e
            if j == twin:
                numerator = e
        total += -math.log(numerator / denominator)
    return total / (2 * rows)


@pytest.mark.parametrize("temperature", [1.0, 0.3])
@pytest.mark.parametrize("groups", [None, [4, 1, 4, 2, 1, 9]])
def test_contrastive_loss_is_nt_xent_over_both_views(temperature, groups):
    g = torch.Generator().manual_seed(1)
    first, second = torch.randn(6, 5, generator=g, dtype=torch.float64), torch.randn(6, 5, generator=g,
                                                                                       dtype=torch.float64)
    labels = None if groups is None else torch.tensor(groups)
    want = _nt_xent_by_hand(first, second, temperature, groups)
    assert contrastive_loss(first, second, temperature, labels).item() == pytest.approx(want, rel=1e-10)


def test_contrastive_loss_under_bf16_autocast_compares_in_fp32():
    g = torch.Generator().manual_seed(3)
    first, second = 4 * torch.randn(8, 16, generator=g), 4 * torch.randn(8, 16, generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = contrastive_loss(first, second)
    assert got.item() == pytest.approx(contrastive_loss(first, second).item(), rel=1e-6)


def test_contrastive_loss_prefers_views_that_agree():
    g = torch.Generator().manual_seed(2)
    first = torch.randn(8, 4, generator=g)
    assert contrastive_loss(first, first) < contrastive_loss(first, torch.randn(8, 4, generator=g))


def test_contrastive_loss_rejects_bad_input():
    with pytest.raises(ValueError, match="temperature"):
        contrastive_loss(torch.ones(2, 3), torch.ones(2, 3), temperature=0.0)
    with pytest.raises(ValueError, match="two .B, D. views"):
        contrastive_loss(torch.ones(2, 3), torch.ones(3, 3))
