"""`streamrec.model.metrics` against hand computations and torchmetrics' retrieval metrics (the oracle)."""

from __future__ import annotations

import math

import pytest
import torch
from torchmetrics.retrieval import RetrievalHitRate, RetrievalMRR, RetrievalNormalizedDCG

from streamrec.model.metrics import (
    RankingMetrics,
    SampledRankingMetrics,
    most_popular_scores,
    sample_negatives,
    seen_mask,
    target_ranks,
)

NEG = -math.inf

# Four rows over N = 6 items (column 0 = padding).
SCORES = torch.tensor([
    [9.0, 0.1, 0.5, 0.3, 0.9, 0.2, 0.7],  # huge padding score must not count
    [0.0, 0.4, 0.4, 0.8, 0.1, 0.3, 0.0],
    [0.0, 0.2, 0.1, 0.0, 0.0, 0.0, 0.0],
    [0.0, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1],
])
TARGETS = torch.tensor([3, 2, 1, 6])
SEEN = torch.tensor([[4, 0], [2, 3], [0, 0], [0, 0]])  # padded ids; row 1 re-consumes its target 2
# Row 0: target 0.3; above it 0.5 (item 2) and 0.7 (item 6); 0.9 (item 4) is seen -> rank 2.
# Row 1: target 0.4 is seen but stays; item 3 (0.8) is seen; item 1 ties at 0.4 -> counts (pessimistic) -> rank 1.
# Row 2: target 0.2 beats everything -> rank 0.
# Row 3: five items above the target -> rank 5.
RANKS = [2, 1, 0, 5]


def test_ranks_by_hand():
    assert target_ranks(SCORES, TARGETS, SEEN).tolist() == RANKS
    assert target_ranks(SCORES, TARGETS, seen_mask(SEEN, 7)).tolist() == RANKS  # boolean mask, same result
    # Without filtering: row 0 also has item 4 above (3), row 1 item 3 (2).
    assert target_ranks(SCORES, TARGETS).tolist() == [3, 2, 0, 5]


def test_metrics_by_hand():
    metric = RankingMetrics(ks=(3, 1))
    metric.update(SCORES, TARGETS, SEEN)
    expected = {
        "hr@1": (0 + 0 + 1 + 0) / 4,  # only rank 0 is inside the top 1
        "ndcg@1": (0 + 0 + 1 + 0) / 4,
        "mrr@1": (0 + 0 + 1 + 0) / 4,
        "hr@3": (1 + 1 + 1 + 0) / 4,  # rank 5 is outside the top 3
        "ndcg@3": (1 / math.log2(2 + 2) + 1 / math.log2(1 + 2) + 1 / math.log2(0 + 2) + 0) / 4,  # (0.5+0.6309+1)/4
        "mrr@3": (1 / 3 + 1 / 2 + 1 / 1 + 0) / 4,  # 0.4583
    }
    result = metric.compute()
    assert list(result) == ["hr@1", "ndcg@1", "mrr@1", "hr@3", "ndcg@3", "mrr@3"]
    for name, value in expected.items():
        assert result[name].item() == pytest.approx(value, abs=1e-6), name


def test_ties_and_nan_count_against_the_target():
    # Pessimistic ties: a model that scores everything equal is ranked last, not first.
    flat = torch.zeros(2, 51)
    assert target_ranks(flat, torch.tensor([1, 50])).tolist() == [49, 49]
    metric = RankingMetrics(ks=(10,))
    metric.update(flat, torch.tensor([1, 50]))
    assert metric.compute()["hr@10"].item() == 0.0
    scores = torch.tensor([[0.0, 1.0, math.nan, 0.5], [0.0, math.nan, 1.0, 0.5]])
    assert target_ranks(scores, torch.tensor([1, 1])).tolist() == [1, 2]  # NaN item above; NaN target last


def test_padding_column_never_counts():
    scores = torch.randn(8, 20)
    targets = torch.randint(1, 20, (8,))
    low, high = scores.clone(), scores.clone()
    low[:, 0], high[:, 0] = NEG, math.inf
    assert torch.equal(target_ranks(low, targets), target_ranks(high, targets))
    assert int(target_ranks(high, targets).max()) <= 18  # at most N - 1 = 18 other candidates


def _torchmetrics_reference(scores, targets, seen, k, exclude_seen):
    """Flattened (preds, target, indexes) over each row's candidates: items 1..N minus seen, plus the target."""
    preds, target, indexes = [], [], []
    mask = seen_mask(seen, scores.shape[1])
    for row in range(scores.shape[0]):
        keep = torch.ones(scores.shape[1], dtype=torch.bool)
        keep[0] = False
        if exclude_seen:
            keep &= ~mask[row]
        keep[targets[row]] = True
        items = keep.nonzero().squeeze(1)
        preds.append(scores[row, items])
        target.append(items == targets[row])
        indexes.append(torch.full((len(items),), row))
    preds, target, indexes = torch.cat(preds), torch.cat(target), torch.cat(indexes)
    out = {}
    for name, cls in (("hr", RetrievalHitRate), ("ndcg", RetrievalNormalizedDCG), ("mrr", RetrievalMRR)):
        out[f"{name}@{k}"] = cls(top_k=k)(preds, target, indexes=indexes)
    return out


@pytest.mark.parametrize("exclude_seen", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_batches_match_torchmetrics(exclude_seen, seed):
    g = torch.Generator().manual_seed(seed)
    b, n, ks = 24, 40, (1, 5, 10)
    scores = torch.randn(b, n + 1, generator=g)
    scores[:, 0] = 100.0  # padding must be ignored even when it scores highest
    targets = torch.randint(1, n + 1, (b,), generator=g)
    seen = torch.randint(0, n + 1, (b, 12), generator=g)  # pads and repeats; some rows contain the target
    seen[:4, 0] = targets[:4]
    metric = RankingMetrics(ks=ks, exclude_seen=exclude_seen)
    metric.update(scores[:10], targets[:10], seen[:10])  # two batches accumulate into one mean
    metric.update(scores[10:], targets[10:], seen[10:])
    result = metric.compute()
    for k in ks:
        for name, value in _torchmetrics_reference(scores, targets, seen, k, exclude_seen).items():
            assert result[name].item() == pytest.approx(value.item(), abs=1e-6), name


def test_states_merge_like_ddp():
    # dist_reduce_fx="sum" states plus a count: merging two ranks' states gives the global mean.
    scores, targets, seen = torch.randn(30, 21), torch.randint(1, 21, (30,)), torch.randint(0, 21, (30, 5))
    whole, part_a, part_b = RankingMetrics(), RankingMetrics(), RankingMetrics()
    whole.update(scores, targets, seen)
    part_a.update(scores[:7], targets[:7], seen[:7])
    part_b.update(scores[7:], targets[7:], seen[7:])
    part_a.merge_state(part_b)
    merged, expected = part_a.compute(), whole.compute()
    assert all(torch.allclose(merged[k], expected[k]) for k in expected)


def test_bad_inputs_raise():
    metric = RankingMetrics()
    with pytest.raises(ValueError, match="0 is padding"):
        metric.update(torch.randn(2, 5), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"item ids 1\.\.4"):
        metric.update(torch.randn(2, 5), torch.tensor([5, 1]))
    with pytest.raises(ValueError, match=r"scores \(B, N\+1\) and targets \(B,\)"):
        metric.update(torch.randn(2, 5), torch.tensor([1, 1, 1]))
    with pytest.raises(ValueError, match="needs 5 columns"):
        metric.update(torch.randn(2, 5), torch.tensor([1, 1]), torch.zeros(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="positive cutoffs"):
        RankingMetrics(ks=(0, 10))


# ----------------------------------------------------------------------------- sampled protocol


def test_sample_negatives_excludes_padding_target_and_seen():
    targets = torch.randint(1, 31, (64,))
    seen = torch.randint(0, 31, (64, 6))
    negatives = sample_negatives(torch.ones(31), targets, seen, num_negatives=20)
    assert negatives.shape == (64, 20)
    for row in range(64):
        drawn = set(negatives[row].tolist())
        assert len(drawn) == 20  # without replacement
        assert not drawn & ({0, int(targets[row])} | set(seen[row].tolist()))
    with pytest.raises(ValueError, match="lower `num_negatives`"):
        sample_negatives(torch.ones(31), targets, seen, num_negatives=25)


def test_popularity_sampling_follows_counts():
    counts = torch.tensor([0, 1, 0, 8, 1])  # item 2 is never drawn; item 3 is 8 times as likely as 1 or 4
    targets = torch.full((20_000,), 2)
    drawn = sample_negatives(counts, targets, None, 1, torch.Generator().manual_seed(0)).squeeze(1)
    share = torch.bincount(drawn, minlength=5).float() / len(drawn)
    assert share[0] == share[2] == 0
    assert share[3].item() == pytest.approx(0.8, abs=0.02) and share[1].item() == pytest.approx(0.1, abs=0.02)


def test_sampling_every_candidate_reproduces_the_full_ranking():
    scores, targets = torch.randn(16, 26), torch.randint(1, 26, (16,))
    full = RankingMetrics(ks=(5,))
    sampled = SampledRankingMetrics(num_items=25, ks=(5,), num_negatives=24)  # all 24 non-target items
    full.update(scores, targets)
    sampled.update(scores, targets)
    expected, result = full.compute(), sampled.compute()
    assert list(result) == ["sampled_hr@5", "sampled_ndcg@5", "sampled_mrr@5"]
    assert all(torch.allclose(result[f"sampled_{k}"], v) for k, v in expected.items())


def test_sampled_metric_is_reproducible_after_reset():
    scores, targets = torch.randn(50, 201), torch.randint(1, 201, (50,))
    seen = torch.randint(0, 201, (50, 10))
    metric = SampledRankingMetrics(num_items=200, ks=(10,), sampling="popularity",
                                   item_counts=torch.randint(1, 50, (201,)))
    metric.update(scores, targets, seen)
    first = metric.compute()["sampled_ndcg@10"]
    metric.reset()
    metric.update(scores, targets, seen)
    assert metric.compute()["sampled_ndcg@10"] == first
    with pytest.raises(ValueError, match="needs `item_counts` of shape"):
        SampledRankingMetrics(num_items=200, sampling="popularity")
    with pytest.raises(ValueError, match="201"):
        metric.update(torch.randn(2, 11), torch.tensor([1, 2]))


# ----------------------------------------------------------------------------- baseline


def test_most_popular_scores_rank_by_count_with_ties_to_lower_ids():
    counts = torch.tensor([0, 5, 9, 5, 0])
    scores = most_popular_scores(counts, batch_size=2)
    assert scores.shape == (2, 5)
    assert scores[0].tolist() == [NEG, 3.0, 4.0, 2.0, 1.0]  # order: item 2 (9), 1 (5), 3 (5), 4 (0)
    # Item 1 is the most popular item the user has not seen (item 2 is seen): rank 0.
    assert target_ranks(scores, torch.tensor([1, 4]), torch.tensor([[2], [0]])).tolist() == [0, 3]
