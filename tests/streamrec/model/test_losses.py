"""Losses against naive formulas written out here."""

import pytest
import torch
import torch.nn.functional as F

from streamrec.model.losses import bce, full_softmax, gbce, gbce_beta, sample_negatives, sampled_softmax

N, D, M = 12, 8, 20


@pytest.fixture
def batch():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(M, D, generator=g, dtype=torch.float64)
    items = torch.randn(N + 1, D, generator=g, dtype=torch.float64)
    targets = torch.randint(1, N + 1, (M,), generator=g)
    return hidden, targets, items


def test_full_softmax_is_cross_entropy_over_real_items(batch):
    hidden, targets, items = batch
    logits = hidden @ items.T
    logits[:, 0] = float("-inf")  # padding is never a class
    assert torch.allclose(full_softmax(hidden, targets, items), F.cross_entropy(logits, targets))


def test_label_smoothing_spreads_eps_over_real_items_only(batch):
    hidden, targets, items = batch
    eps = 0.2
    log_p = torch.log_softmax(hidden @ items[1:].T, dim=-1)  # (M, N): padding is not a class
    expected = -((1 - eps) * log_p.gather(1, (targets - 1)[:, None])[:, 0] + eps * log_p.mean(-1)).mean()
    assert torch.allclose(full_softmax(hidden, targets, items, label_smoothing=eps), expected)


def test_sampled_softmax_with_every_item_sampled_equals_full_softmax(batch):
    hidden, targets, items = batch
    all_items = torch.arange(1, N + 1)
    sampled = sampled_softmax(hidden, targets, items, all_items)
    assert torch.allclose(sampled.double(), full_softmax(hidden, targets, items))


def test_sampled_softmax_logq_correction(batch):
    hidden, targets, items = batch
    q = torch.rand(N + 1, dtype=torch.float64) + 0.1
    q = q / q[1:].sum()
    neg = torch.tensor([3, 5, 7, 9])
    got = sampled_softmax(hidden, targets, items, neg, q.log())
    want = []
    for h, t in zip(hidden, targets, strict=True):
        pos = h @ items[t] - q[t].log()
        negs = [h @ items[j] - q[j].log() for j in neg.tolist() if j != t]
        logits = torch.stack([pos, *negs])
        want.append(-torch.log_softmax(logits, 0)[0])
    assert torch.allclose(got, torch.stack(want).mean().float())


def test_bce_and_gbce_match_formula(batch):
    hidden, targets, items = batch
    neg = torch.randint(1, N + 1, (M, 3), generator=torch.Generator().manual_seed(1))
    sig = torch.sigmoid
    pos = (hidden * items[targets]).sum(-1)
    negs = torch.einsum("md,mkd->mk", hidden, items[neg])
    plain = (-torch.log(sig(pos)) - torch.log(1 - sig(negs)).sum(-1)).mean()
    assert torch.allclose(bce(hidden, targets, items, neg), plain.float())
    beta = 0.3
    general = (-torch.log(sig(pos) ** beta) - torch.log(1 - sig(negs)).sum(-1)).mean()
    assert torch.allclose(gbce(hidden, targets, items, neg, beta), general.float())


def test_gbce_beta_endpoints():
    alpha = 4 / (101 - 1)
    assert gbce_beta(4, 101, t=0.0) == pytest.approx(1.0)
    assert gbce_beta(4, 101, t=1.0) == pytest.approx(alpha)


def test_sample_negatives_never_padding_and_follows_probs():
    g = torch.Generator().manual_seed(0)
    ids = sample_negatives(N, 5000, torch.device("cpu"), generator=g)
    assert ids.min() >= 1 and ids.max() <= N
    probs = torch.zeros(N + 1)
    probs[0] = 100.0  # padding weight must be ignored
    probs[4] = 1.0
    probs[7] = 3.0
    ids = sample_negatives(N, 4000, torch.device("cpu"), probs, generator=g)
    assert set(ids.tolist()) == {4, 7}
    assert (ids == 7).float().mean().item() == pytest.approx(0.75, abs=0.03)


@pytest.mark.parametrize("chunk_elements", [N, 1 << 22])  # 16-row chunks (16 + 4: ragged), one chunk
def test_full_softmax_gradients_equal_autograd_cross_entropy(batch, chunk_elements):
    hidden, targets, items = batch
    h1, w1 = hidden.clone().requires_grad_(), items.clone().requires_grad_()
    h2, w2 = hidden.clone().requires_grad_(), items.clone().requires_grad_()
    upstream = 0.37  # a non-unit incoming gradient must scale both
    (upstream * full_softmax(h1, targets, w1, chunk_elements=chunk_elements)).backward()
    (upstream * F.cross_entropy(h2 @ w2[1:].T, targets - 1)).backward()
    assert torch.allclose(h1.grad, h2.grad, atol=1e-12)
    assert torch.allclose(w1.grad, w2.grad, atol=1e-12)
    assert torch.all(w1.grad[0] == 0)  # padding row gets no gradient


def test_full_softmax_under_bf16_autocast_tracks_fp32():
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(300, 16, generator=g).requires_grad_()
    items = (0.3 * torch.randn(501, 16, generator=g)).requires_grad_()
    targets = torch.randint(1, 501, (300,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = full_softmax(hidden, targets, items, chunk_elements=64 * 500)
    loss.backward()
    reference = F.cross_entropy(hidden.detach() @ items.detach()[1:].T, targets - 1)
    assert loss.dtype == torch.float32 and abs(loss.item() - reference.item()) < 0.02
    assert hidden.grad.dtype == torch.float32 and items.grad.dtype == torch.float32


def test_full_softmax_without_grad_computes_no_gradients(batch):
    hidden, targets, items = batch
    with torch.no_grad():
        loss = full_softmax(hidden, targets, items)
    assert not loss.requires_grad


def _loss_and_grads(name, hidden, targets, items, sparse, log_q=None):
    hidden, items = hidden.clone().requires_grad_(), items.clone().requires_grad_()
    if name == "sampled":
        loss = sampled_softmax(hidden, targets, items, torch.tensor([3, 5, 5, 7, 12]), log_q, sparse=sparse)
    else:
        neg = torch.randint(1, N + 1, (M, 3), generator=torch.Generator().manual_seed(1))
        loss = bce(hidden, targets, items, neg, sparse=sparse) if name == "bce" else \
            gbce(hidden, targets, items, neg, 0.3, sparse=sparse)
    loss.backward()
    return loss, hidden.grad, items.grad


@pytest.mark.parametrize("name", ["sampled", "sampled_logq", "bce", "gbce"])
def test_sparse_gathering_gives_the_dense_loss_and_gradients(batch, name):
    """`sparse=True` (row-wise optimizer) against today's dense path: the same loss, the same gradients, but the
    table's gradient is sparse and names only the scored rows (targets and negatives, duplicates included)."""
    hidden, targets, items = batch
    log_q = torch.rand(N + 1, dtype=torch.float64).log() if name == "sampled_logq" else None
    name = name.removesuffix("_logq")
    dense = _loss_and_grads(name, hidden, targets, items, sparse=False, log_q=log_q)
    sparse = _loss_and_grads(name, hidden, targets, items, sparse=True, log_q=log_q)
    assert not dense[2].is_sparse and sparse[2].is_sparse
    torch.testing.assert_close(sparse[0], dense[0])
    torch.testing.assert_close(sparse[1], dense[1])
    torch.testing.assert_close(sparse[2].to_dense(), dense[2])
    touched = set(sparse[2].coalesce().indices()[0].tolist())
    assert 0 not in touched and touched <= set(range(1, N + 1))


def test_sparse_gathering_casts_rows_not_the_table_under_bf16(batch):
    """bf16 states: the same loss as casting the whole table (the cast is elementwise), gradients to bf16 rounding."""
    hidden, targets, items = batch
    hidden, items = hidden.bfloat16(), items.float()
    dense = _loss_and_grads("sampled", hidden, targets, items, sparse=False)
    sparse = _loss_and_grads("sampled", hidden, targets, items, sparse=True)
    assert torch.equal(sparse[0], dense[0])
    assert sparse[2].dtype == torch.float32  # the table's own dtype: rows come back through the cast
    torch.testing.assert_close(sparse[2].to_dense(), dense[2], rtol=2e-2, atol=2e-3)
