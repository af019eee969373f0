"""Losses against naive formulas written out here, and `Objective` (the training loss of a batch) on a tiny
network without a Trainer, against the same formulas on explicit logits."""

import pytest
import torch
import torch.nn.functional as F

from core.nn import contrastive_loss
from streamrec.data.datasets import TrainBatch
from streamrec.model.losses import (
    Objective,
    bce,
    full_softmax,
    gbce,
    gbce_beta,
    sample_negatives,
    sampled_softmax,
)
from streamrec.model.network import SASRec
from streamrec.model.options import ContrastiveOptions, ObjectiveOptions

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


# ----------------------------------------------------------------------------- Objective, without a Trainer
def _network(dropout: float = 0.0) -> SASRec:
    torch.manual_seed(0)
    return SASRec(N, d_model=D, n_heads=2, n_layers=1, d_ff=16, max_len=6, dropout=dropout).train()


# Rows 0 and 2 end in the same item (11): they are not each other's negatives in the contrastive term.
INPUTS = torch.tensor([[2, 3, 7, 9, 0, 4], [0, 5, 6, 2, 8, 1], [0, 0, 0, 4, 3, 2]])
TARGETS = torch.tensor([[3, 7, 9, 4, 4, 11], [0, 6, 2, 8, 1, 12], [0, 0, 0, 3, 2, 11]])


def test_objective_full_softmax_with_label_smoothing_is_torch_cross_entropy_on_explicit_logits():
    network = _network()
    batch = TrainBatch(torch.tensor([[0, 0, 0, 3, 7, 9], [0, 0, 5, 6, 2, 8]]),  # two all-padding columns: trimmed
                       torch.tensor([[0, 0, 0, 7, 9, 4], [0, 0, 6, 2, 8, 1]]))
    loss, positions = Objective(ObjectiveOptions(label_smoothing=0.1), ContrastiveOptions())(network, batch)
    keep = batch.targets != 0
    logits = network.encode(batch.inputs)[keep] @ network.item_vectors[1:].T  # (M, N), untrimmed
    want = F.cross_entropy(logits, batch.targets[keep] - 1, label_smoothing=0.1)
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
    assert positions == int(keep.sum()) == 7


def test_objective_two_passes_are_their_mean_cross_entropy_plus_the_weighted_contrastive_term():
    network = _network(dropout=0.3)  # two dropout masks: the passes differ
    objective = Objective(ObjectiveOptions(), ContrastiveOptions(weight=0.5, temperature=0.7))
    assert objective.two_passes
    torch.manual_seed(5)
    loss, positions = objective(network, TrainBatch(INPUTS, TARGETS))
    torch.manual_seed(5)  # the same draws: nothing is trimmed, so both runs encode the same (2B, T) batch
    first, second = network.encode(INPUTS.repeat(2, 1)).chunk(2)
    keep, items = TARGETS != 0, network.item_vectors[1:]
    assert not torch.allclose(first, second)
    ce = (F.cross_entropy(first[keep] @ items.T, TARGETS[keep] - 1)
          + F.cross_entropy(second[keep] @ items.T, TARGETS[keep] - 1)) / 2
    term = contrastive_loss(first[:, -1], second[:, -1], 0.7, groups=TARGETS[:, -1])
    torch.testing.assert_close(loss, ce + 0.5 * term, rtol=1e-5, atol=1e-6)
    assert positions == int(keep.sum())


def test_objective_same_target_positives_need_the_partner_windows():
    objective = Objective(ObjectiveOptions(), ContrastiveOptions(weight=0.5, positive="same_target",
                                                                 second_pass_softmax=False))
    assert not objective.two_passes
    with pytest.raises(ValueError, match="needs the training windows"):
        objective(_network(), TrainBatch(INPUTS, TARGETS))


@pytest.mark.parametrize("loss", ["bce", "gbce", "sampled"])
def test_each_sampled_loss_is_the_named_function_on_the_same_negatives(loss):
    network = _network()
    objective = Objective(ObjectiveOptions(loss=loss, num_negatives=5), ContrastiveOptions())
    hidden, targets = torch.randn(4, D), torch.tensor([1, 5, 9, 12])
    vectors = network.item_vectors
    torch.manual_seed(3)
    got = objective.loss(network, hidden, targets, None)
    torch.manual_seed(3)
    if loss == "sampled":
        neg = torch.randint(1, N + 1, (5,))
        want = sampled_softmax(hidden, targets, vectors, neg, None)
    else:
        neg = torch.randint(1, N + 1, (4, 5))
        want = bce(hidden, targets, vectors, neg) if loss == "bce" else \
            gbce(hidden, targets, vectors, neg, gbce_beta(5, N, 0.75))
    torch.testing.assert_close(got, want)
    if loss == "bce":  # and bce itself, by hand: -log sigmoid(positive) - sum log(1 - sigmoid(negative))
        pos = (hidden * vectors[targets]).sum(-1)
        negs = torch.einsum("md,mkd->mk", hidden, vectors[neg])
        by_hand = -(F.logsigmoid(pos) + F.logsigmoid(-negs).sum(-1)).mean()
        torch.testing.assert_close(got, by_hand, rtol=1e-5, atol=1e-5)


def test_popularity_negatives_are_drawn_from_the_counts_with_their_logq_correction():
    network = _network()
    objective = Objective(ObjectiveOptions(loss="sampled", num_negatives=6, negative_sampling="popularity"),
                          ContrastiveOptions())
    counts = torch.arange(N + 1, dtype=torch.float32) + 1.0  # row 0 (padding) is never drawn
    hidden, targets = torch.randn(4, D), torch.tensor([1, 5, 9, 12])
    torch.manual_seed(3)
    got = objective.loss(network, hidden, targets, counts)
    torch.manual_seed(3)
    neg = torch.multinomial(counts[1:], 6, replacement=True) + 1
    log_q = (counts / counts[1:].sum()).log()
    rows = []
    for h, t in zip(hidden, targets, strict=True):  # positive first, then the negatives that are not it
        logits = [h @ network.item_vectors[t] - log_q[t]]
        logits += [h @ network.item_vectors[j] - log_q[j] for j in neg.tolist() if j != t]
        rows.append(-torch.log_softmax(torch.stack(logits), 0)[0])
    torch.testing.assert_close(got, torch.stack(rows).mean(), rtol=1e-5, atol=1e-6)
