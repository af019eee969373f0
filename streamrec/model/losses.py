"""Next-item training losses on the selected (non-padding) positions: `full_softmax` (default, best quality when it
fits), `rdrop_softmax`, `sampled_softmax` (logQ-corrected, Yi et al., 2019, so popular negatives are not
over-penalised), `bce` (original SASRec) and `gbce` (Petrov & Macdonald, 2023: undoes the overconfidence that negative
sampling causes). The three sampled losses read only the rows they score. With `sparse=True` they gather those rows with
`F.embedding(..., sparse=True)` and cast only them to the states' dtype (bf16 under autocast): the table's gradient is
then (rows read, D) sparse, for a row-wise optimizer (`core.nn.optim`). Without it the table is cast whole and its
gradient is dense (N+1, D), as `torch.optim.AdamW` needs. Every loss takes `hidden` (M, D) states, `targets` (M,)
positive ids and `item_vectors` (N+1, D) (row 0 padding).

Legend: M positions, D model width, N items (1..N; 0 = padding), K negatives."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from core.nn import contrastive_loss, linear_cross_entropy, rdrop_cross_entropy
from core.nn.loss import CHUNK_ELEMENTS
from streamrec.data.datasets import TrainBatch
from streamrec.model.network import StreamRecModel
from streamrec.model.options import ContrastiveOptions, ObjectiveOptions


def full_softmax(hidden: Tensor, targets: Tensor, item_vectors: Tensor, label_smoothing: float = 0.0,
                 chunk_elements: int = CHUNK_ELEMENTS) -> Tensor:
    """Mean cross-entropy over all N items (not padding), without an (M, N) logits tensor
    (`core.nn.linear_cross_entropy`, holding `chunk_elements` logits at once); `label_smoothing` spreads eps / N
    over every item."""
    return linear_cross_entropy(hidden, item_vectors[1:], targets - 1, label_smoothing=label_smoothing,
                                chunk_elements=chunk_elements)


def rdrop_softmax(pair: Tensor, targets: Tensor, item_vectors: Tensor, label_smoothing: float = 0.0,
                  alpha: float = 1.0) -> Tensor:
    """`full_softmax` on (2, M, D) states of the same positions under two dropout masks, plus R-Drop's
    symmetric KL between the two distributions over the N items, weighted by `alpha` (`core.nn.rdrop_cross_entropy`)."""
    return rdrop_cross_entropy(pair, item_vectors[1:], targets - 1, label_smoothing=label_smoothing, alpha=alpha)


def sample_negatives(num_items: int, num_negatives: int, device: torch.device, probs: Tensor | None = None,
                     generator: torch.Generator | None = None) -> Tensor:
    """(K,) item ids in 1..N, drawn with replacement, uniformly or from (N+1,) unnormalised `probs` (row 0 ignored)."""
    if probs is None:
        return torch.randint(1, num_items + 1, (num_negatives,), device=device, generator=generator)
    return torch.multinomial(probs[1:], num_negatives, replacement=True, generator=generator) + 1


def item_rows(item_vectors: Tensor, dtype: torch.dtype, sparse: bool = False) -> Callable[[Tensor], Tensor]:
    """A lookup `ids -> item_vectors[ids]` in `dtype`. `sparse`: gather with a sparse gradient and cast only the
    gathered rows; otherwise the table is cast once (a no-op in fp32) and indexed, and its gradient is dense."""
    if sparse:
        return lambda ids: F.embedding(ids, item_vectors, sparse=True).to(dtype)
    table = item_vectors.to(dtype)
    return lambda ids: table[ids]


def sampled_softmax(hidden: Tensor, targets: Tensor, item_vectors: Tensor, neg_ids: Tensor,
                    log_q: Tensor | None = None, sparse: bool = False) -> Tensor:
    """Softmax over [positive, (K,) negatives shared by all positions] with the logQ correction; `log_q` (N+1,)
    None for uniform sampling, where the correction is a constant shift and cancels. A negative equal to the row's
    positive is masked out (an accidental hit, not a negative)."""
    rows = item_rows(item_vectors, hidden.dtype, sparse)
    pos = (hidden * rows(targets)).sum(-1, keepdim=True).float()  # (M, 1)
    neg = (hidden @ rows(neg_ids).T).float()  # (M, K)
    if log_q is not None:
        log_q = log_q.float()
        pos = pos - log_q[targets][:, None]
        neg = neg - log_q[neg_ids][None, :]
    neg = neg.masked_fill(neg_ids[None, :] == targets[:, None], float("-inf"))
    logits = torch.cat([pos, neg], dim=1)  # (M, 1+K)
    return F.cross_entropy(logits, torch.zeros_like(targets))


def bce(hidden: Tensor, targets: Tensor, item_vectors: Tensor, neg_ids: Tensor, sparse: bool = False) -> Tensor:
    """Binary cross-entropy: positive vs its own K negatives, `neg_ids` (M, K)."""
    return gbce(hidden, targets, item_vectors, neg_ids, beta=1.0, sparse=sparse)


def gbce_beta(num_negatives: int, num_items: int, t: float) -> float:
    """gSASRec's beta = alpha (t (1 - 1/alpha) + 1/alpha), alpha = K / (N - 1) the sampling rate: t = 0 gives
    plain BCE, t = 1 beta = alpha (fully calibrated)."""
    alpha = num_negatives / max(num_items - 1, 1)
    return alpha * (t * (1 - 1 / alpha) + 1 / alpha)


def gbce(hidden: Tensor, targets: Tensor, item_vectors: Tensor, neg_ids: Tensor, beta: float,
         sparse: bool = False) -> Tensor:
    """Generalised BCE: -log sigmoid(s+)^beta - sum log(1 - sigmoid(s-)), averaged over positions; `neg_ids`
    (M, K) per position, `beta` from `gbce_beta`."""
    rows = item_rows(item_vectors, hidden.dtype, sparse)
    pos = (hidden * rows(targets)).sum(-1).float()  # (M,)
    neg = torch.einsum("md,mkd->mk", hidden, rows(neg_ids)).float()  # (M, K)
    # -log sigmoid(x) = softplus(-x); -log(1 - sigmoid(x)) = softplus(x)
    return (beta * F.softplus(-pos) + F.softplus(neg).sum(-1)).mean()


class Objective:
    """The training loss of one batch: the configured loss on every trained position, R-Drop's and the contrastive
    term's second pass when they are on. `sparse`: the sampled losses gather the rows they score
    (`rowwise_adagrad`'s sparse item gradients)."""

    def __init__(self, objective: ObjectiveOptions, contrastive: ContrastiveOptions, sparse: bool = False):
        self.objective, self.contrastive, self.sparse = objective, contrastive, sparse

    @property
    def two_passes(self) -> bool:
        """Whether both dropout passes train the softmax (R-Drop, or the contrastive term with it)."""
        terms = self.objective.rdrop_alpha > 0.0 or self.contrastive.weight > 0.0
        return terms and self.contrastive.second_pass_softmax

    def __call__(self, network: StreamRecModel, batch: TrainBatch, item_counts: Tensor | None = None,
                 partners: Callable[[Tensor], Tensor] | None = None) -> tuple[Tensor, int]:
        """The loss of `batch` and the number of positions it trained. `item_counts` (N+1,) feed
        `negative_sampling: popularity`; `partners` maps (B,) last targets to (B, T) inputs of other windows with
        those targets, for `contrastive.positive: same_target`."""
        inputs, targets, last = network.training_inputs(batch.inputs, batch.targets, batch.last_only,
                                                        self.objective.mask_prob)
        # (B, T', D), or (2B, T', D) with two passes
        hidden = network.encode(inputs.repeat(2, 1) if self.two_passes else inputs, trim=True, last=last)
        targets = targets[:, -hidden.shape[1]:]  # inputs and targets share their padding; all-padding columns skipped
        keep = targets != 0
        if self.two_passes:
            first, second = hidden.chunk(2)
            loss = self._two_pass_loss(network, first, second, targets, keep, item_counts)
        else:
            loss = self.loss(network, hidden[keep], targets[keep], item_counts)  # (M, D), (M,)
            if self.contrastive.weight > 0.0:  # the second pass for the term alone: only its last state
                dropout_views = self.contrastive.positive == "dropout"
                if not dropout_views and partners is None:
                    raise ValueError("`contrastive.positive: same_target` needs the training windows (`partners`)")
                views = inputs if dropout_views else partners(targets[:, -1])
                second = network.encode(views, trim=True, last=1)[:, -1]
                loss = loss + self.contrastive_term(hidden[:, -1], second, targets)
        return loss, int(keep.sum())

    def _two_pass_loss(self, network: StreamRecModel, first: Tensor, second: Tensor, targets: Tensor, keep: Tensor,
                       item_counts: Tensor | None) -> Tensor:
        """The loss of (B, T', D) states of the same rows under two dropout masks: R-Drop's, or the two passes'
        mean cross-entropy, plus the contrastive term when it is on."""
        if self.objective.rdrop_alpha > 0.0:
            loss = rdrop_softmax(torch.stack([first[keep], second[keep]]), targets[keep], network.item_vectors,
                                 self.objective.label_smoothing, self.objective.rdrop_alpha)
        else:  # without R-Drop's KL work
            loss = self.loss(network, torch.cat([first[keep], second[keep]]), targets[keep].repeat(2), item_counts)
        if self.contrastive.weight > 0.0:
            loss = loss + self.contrastive_term(first[:, -1], second[:, -1], targets)
        return loss

    def contrastive_term(self, first: Tensor, second: Tensor, targets: Tensor) -> Tensor:
        """The weighted NT-Xent between two (B, D) views of each window's last state; windows are right-aligned, so
        the last column of the (B, T') targets is every row's last target, and rows sharing it are not negatives."""
        c = self.contrastive
        return c.weight * contrastive_loss(first, second, c.temperature, groups=targets[:, -1])

    def loss(self, network: StreamRecModel, hidden: Tensor, targets: Tensor, item_counts: Tensor | None) -> Tensor:
        o, vectors, num_items = self.objective, network.item_vectors, network.num_items
        if o.loss == "full":
            return full_softmax(hidden, targets, vectors, label_smoothing=o.label_smoothing)
        if o.loss == "sampled":
            probs = item_counts if o.negative_sampling == "popularity" else None
            neg = sample_negatives(num_items, o.num_negatives, hidden.device, probs)
            log_q = None if probs is None else (probs / probs[1:].sum()).clamp_min(1e-12).log()
            return sampled_softmax(hidden, targets, vectors, neg, log_q, sparse=self.sparse)
        neg = torch.randint(1, num_items + 1, (hidden.shape[0], o.num_negatives), device=hidden.device)
        if o.loss == "bce":
            return bce(hidden, targets, vectors, neg, sparse=self.sparse)
        return gbce(hidden, targets, vectors, neg, gbce_beta(o.num_negatives, num_items, o.gbce_t), sparse=self.sparse)
