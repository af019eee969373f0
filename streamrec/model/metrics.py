"""Next-item ranking metrics: HR@K, NDCG@K and MRR@K, full-catalogue or against sampled negatives. Conventions, shared
by every function here:

- `scores` (B, N + 1): column 0 is padding and is never a candidate; `targets` (B,): the one held-out item, in 1..N.
- `seen`: items the user already interacted with, padded ids (B, L) with 0 = pad or a boolean mask (B, N + 1). With
  `exclude_seen` they leave the candidates, except the target itself (users do re-consume items).
- rank (0-based) = number of candidates whose score is >= the target's. **Ties count against the target**, and so does
  NaN: a model that scores everything equal, or produces NaN, ranks last instead of first. Pass float32 scores: bf16
  logits tie often and would be penalised for it (upcast the hidden state, not the logits).
- HR@K = [rank < K]; NDCG@K = [rank < K] / log2(rank + 2) (the ideal DCG is 1); MRR@K = [rank < K] / (rank + 1).

States are sums plus a count with `dist_reduce_fx="sum"`, so DDP gives the exact global mean. One comparison pass per
batch gives every rank; all Ks are read from it. The "sampled" variant (the SASRec paper's protocol: the target against
100 negatives drawn uniformly or by popularity, excluding seen items) inflates every number; its names start with
"sampled_" so it is never mistaken for the full ranking.

Legend: B batch, N items, L seen-list length, C sampled negatives, K cutoffs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor
from torchmetrics import Metric

from streamrec.data.constants import PAD_ID


def seen_mask(seen: Tensor, num_columns: int) -> Tensor:
    """Boolean (B, N + 1) mask of seen items from padded ids (B, L) or an existing mask; `num_columns`: N + 1."""
    if seen.dtype == torch.bool:
        if seen.shape[-1] != num_columns:
            raise ValueError(f"a boolean `seen` mask needs {num_columns} columns (N + 1), got {seen.shape[-1]}")
        return seen
    mask = torch.zeros(seen.shape[0], num_columns, dtype=torch.bool, device=seen.device)
    return mask.scatter_(1, seen.long(), True)  # pad id 0 lands in column 0, which is never ranked


def _check(scores: Tensor, targets: Tensor, seen: Tensor | None) -> None:
    if scores.dim() != 2 or targets.shape != scores.shape[:1]:
        raise ValueError(f"expected scores (B, N+1) and targets (B,), got {tuple(scores.shape)} and "
                         f"{tuple(targets.shape)}")
    if bool(((targets < 1) | (targets >= scores.shape[1])).any()):
        raise ValueError(f"targets must be item ids 1..{scores.shape[1] - 1} (0 is padding), "
                         f"got {targets.min().item()}..{targets.max().item()}")
    if seen is not None and seen.shape[0] != scores.shape[0]:
        raise ValueError(f"`seen` has {seen.shape[0]} rows but scores have {scores.shape[0]}")


def target_ranks(scores: Tensor, targets: Tensor, seen: Tensor | None = None) -> Tensor:
    """0-based rank (B,) of each target among all items (padding and seen items excluded; ties pessimistic)."""
    target_scores = scores.gather(1, targets[:, None])  # (B, 1)
    above = ~(scores < target_scores)  # (B, N+1); `~(<)` rather than `>=` so NaN counts against the target
    above[:, PAD_ID] = False
    if seen is not None:
        above &= ~seen_mask(seen, scores.shape[1])
    above.scatter_(1, targets[:, None], False)  # the target does not outrank itself
    return above.sum(1)


def sample_negatives(weights: Tensor, targets: Tensor, seen: Tensor | None, num_negatives: int,
                     generator: torch.Generator | None = None) -> Tensor:
    """(B, C) negatives per row, drawn without replacement in proportion to the (N + 1,) `weights`, never padding,
    the target or a seen item."""
    w = weights.to(torch.float).expand(targets.shape[0], -1).clone()  # (B, N+1)
    w[:, PAD_ID] = 0.0
    if seen is not None:
        w.masked_fill_(seen_mask(seen, w.shape[1]), 0.0)
    w.scatter_(1, targets[:, None], 0.0)
    available = int((w > 0).sum(1).min())
    if available < num_negatives:
        raise ValueError(f"a row has only {available} items to sample as negatives but `num_negatives` is "
                         f"{num_negatives}; lower `num_negatives`")
    # Gumbel-top-k: the C largest log(w) + Gumbel noise are a draw without replacement with
    # probabilities proportional to w (Kool et al. 2019), at the cost of one topk (torch.multinomial without
    # replacement draws the C items one after another).
    u = torch.rand(w.shape, generator=generator, device=w.device).clamp_(min=1e-20)  # (B, N+1)
    keys = w.log() - (-u.log()).log()  # log(0) = -inf keeps excluded items last
    return keys.topk(num_negatives, dim=1).indices


class RankingMetrics(Metric):
    """HR@K, NDCG@K and MRR@K of the target's rank among the full catalogue. `compute()` returns {"hr@10": ...,
    "ndcg@10": ..., "mrr@10": ..., "hr@20": ...}; with `cross_entropy` also "loss", the target's mean cross-entropy over
    the catalogue (the curve to read beside the training loss)."""

    full_state_update = False
    higher_is_better = True
    is_differentiable = False
    name_prefix = ""

    def __init__(self, ks: Sequence[int] = (10, 20), exclude_seen: bool = True, *, cross_entropy: bool = False):
        super().__init__()
        if not ks or any(int(k) < 1 for k in ks):
            raise ValueError(f"`ks` must be positive cutoffs, got {list(ks)}")
        self.ks = sorted({int(k) for k in ks})
        self.exclude_seen = exclude_seen
        self.cross_entropy = cross_entropy
        for name in ("hr", "ndcg", "mrr"):
            self.add_state(name, default=torch.zeros(len(self.ks)), dist_reduce_fx="sum")
        self.add_state("loss", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0), dist_reduce_fx="sum")

    def ranks(self, scores: Tensor, targets: Tensor, seen: Tensor | None) -> Tensor:
        return target_ranks(scores, targets, seen)

    def update(self, scores: Tensor, targets: Tensor, seen: Tensor | None = None) -> None:
        _check(scores, targets, seen)
        rank = self.ranks(scores.detach(), targets, seen if self.exclude_seen else None)  # (B,)
        hit = (rank[:, None] < torch.tensor(self.ks, device=rank.device)).float()  # (B, K)
        pos = rank[:, None].float() + 1.0  # 1-based rank, (B, 1)
        self.hr += hit.sum(0)
        self.ndcg += (hit / torch.log2(pos + 1.0)).sum(0)
        self.mrr += (hit / pos).sum(0)
        if self.cross_entropy:  # over the whole catalogue, seen items included: the training loss's view
            scores = scores.detach().float()
            self.loss += (torch.logsumexp(scores, -1) - scores.gather(1, targets[:, None]).squeeze(1)).sum().double()
        self.count += rank.shape[0]

    def compute(self) -> dict[str, Tensor]:
        out = {f"{self.name_prefix}{name}@{k}": getattr(self, name)[i] / self.count
               for i, k in enumerate(self.ks) for name in ("hr", "ndcg", "mrr")}
        if self.cross_entropy:
            out[f"{self.name_prefix}loss"] = (self.loss / self.count).float()
        return out


class SampledRankingMetrics(RankingMetrics):
    """The SASRec paper's protocol: the target against sampled negatives only, for comparison with papers. The generator
    is re-seeded on `reset()`, so every evaluation epoch draws the same negatives for the same batches; popularity
    `sampling` draws in proportion to `item_counts`."""

    name_prefix = "sampled_"

    def __init__(self, num_items: int, ks: Sequence[int] = (10, 20), *, num_negatives: int = 100,
                 sampling: Literal["uniform", "popularity"] = "uniform", item_counts: Tensor | None = None,
                 exclude_seen: bool = True, seed: int = 0):
        super().__init__(ks, exclude_seen)
        if sampling == "uniform":
            weights = torch.ones(num_items + 1)
        elif sampling == "popularity":
            if item_counts is None or item_counts.shape != (num_items + 1,):
                raise ValueError(f"popularity sampling needs `item_counts` of shape ({num_items + 1},) "
                                 "(e.g. StreamRecDataModule.train_item_counts())")
            weights = item_counts.float()
        else:
            raise ValueError(f"`sampling` must be uniform or popularity, got {sampling!r}")
        self.register_buffer("weights", weights, persistent=False)
        self.num_negatives, self.seed = num_negatives, seed
        self._generator: torch.Generator | None = None

    def ranks(self, scores: Tensor, targets: Tensor, seen: Tensor | None) -> Tensor:
        if scores.shape[1] != self.weights.shape[0]:
            raise ValueError(f"scores have {scores.shape[1]} columns but the metric was built for "
                             f"num_items + 1 = {self.weights.shape[0]}")
        if self._generator is None or self._generator.device != scores.device:
            self._generator = torch.Generator(device=scores.device).manual_seed(self.seed)
        negatives = sample_negatives(self.weights.to(scores.device), targets, seen, self.num_negatives,
                                     self._generator)  # (B, C)
        target_scores = scores.gather(1, targets[:, None])  # (B, 1)
        return (~(scores.gather(1, negatives) < target_scores)).sum(1)  # ties and NaN count against the target

    def reset(self) -> None:
        super().reset()
        self._generator = None


def most_popular_scores(train_counts: Tensor, batch_size: int) -> Tensor:
    """Most-popular baseline: (B, N + 1) scores, the same in every row (an expanded view: never write to it).
    Distinct scores (ties in count go to the lower id), so pessimistic tie handling does not penalise it."""
    n = train_counts.shape[0] - 1
    order = torch.sort(train_counts[1:], descending=True, stable=True).indices + 1  # most popular first
    scores = torch.empty(n + 1, device=train_counts.device)
    scores[order] = torch.arange(n, 0, -1, dtype=scores.dtype, device=scores.device)
    scores[PAD_ID] = -torch.inf
    return scores.expand(batch_size, -1)
