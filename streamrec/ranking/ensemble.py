"""Several session models over one catalogue ranked as one: the mean of their next-item softmax probabilities, as
Translate's ensembles (and fairseq's) average next-token probabilities.

Members may differ in network and width (K seeds of one recipe, or several recipes); they share one item vocabulary,
which `streamrec.api.Recommender.load` checks, and one max_len, so that each member and the explanations read the
same history. A mean of probabilities is not one dot product, so the
bf16 scan and the item table mapped from a checkpoint do not apply: each member's softmax normaliser (a logsumexp over
the catalogue) is computed first, then the mean is walked in item chunks (`topk.top_k_by`), in the same bounded memory.
Explanations (attention, occlusion) are the first member's, as an ensemble's alignments are in Translate.

Legend: B users, T history length, N items, M members."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from streamrec.data.constants import PAD_ID
from streamrec.model.network import StreamRecModel
from streamrec.ranking.topk import DEFAULT_ITEM_CHUNK, TopK, top_k_by


class Ensemble(nn.Module):
    """Session models (one catalogue) scored as the mean of their next-item probabilities."""

    def __init__(self, members: Sequence[StreamRecModel]):
        super().__init__()
        if len(members) < 2:
            raise ValueError(f"an ensemble takes 2 or more models, got {len(members)}")
        for name in ("num_items", "max_len"):
            values = sorted({getattr(m, name) for m in members})
            if len(values) > 1:
                raise ValueError(f"an ensemble's members share one {name}; theirs differ: {values}")
        self.members = nn.ModuleList(members)
        self.num_items, self.max_len = members[0].num_items, members[0].max_len

    @property
    def first(self) -> StreamRecModel:
        """The member whose attention and item vectors explain the ensemble and find similar items."""
        return self.members[0]

    @property
    def device(self) -> torch.device:
        return self.first.device

    @property
    def item_vectors(self) -> Tensor:
        return self.first.item_vectors

    def _hidden(self, inputs: Tensor) -> list[Tensor]:
        return [m.last_hidden(inputs).float() for m in self.members]  # M x (B, D_m)

    @torch.no_grad()
    def recommend_scores(self, inputs: Tensor) -> Tensor:
        """(B, T) left-padded histories -> (B, N+1) mean probabilities (padding -inf): the whole matrix, for metrics."""
        probs = sum(m.score(h).softmax(-1) for m, h in zip(self.members, self._hidden(inputs), strict=True))
        probs = probs / len(self.members)
        probs[:, PAD_ID] = float("-inf")
        return probs

    @torch.no_grad()
    def top_k(self, inputs: Tensor, k: int, allowed: Tensor | None = None, exclude: Tensor | None = None,
              item_chunk: int | None = None) -> TopK:
        """The `k` items of highest mean probability after each (B, T) history; `allowed` (N+1,) and `exclude`
        (B, L) as in `topk.top_k_items`."""
        chunk = item_chunk or DEFAULT_ITEM_CHUNK
        hidden = self._hidden(inputs)
        vectors = [m.item_vectors for m in self.members]
        norms = [_logsumexp(h, v, chunk) for h, v in zip(hidden, vectors, strict=True)]  # M x (B,)

        def mean_probability(rows: slice | Tensor) -> Tensor:
            total = sum(torch.exp(h @ v[rows].float().T - z[:, None]) for h, v, z in zip(hidden, vectors, norms,
                                                                                         strict=True))
            return total / len(self.members)

        return top_k_by(mean_probability, self.num_items, inputs.shape[0], k, exclude=exclude, allowed=allowed,
                        item_chunk=chunk, device=inputs.device)


def _logsumexp(hidden: Tensor, vectors: Tensor, chunk: int) -> Tensor:
    """(B,) log of each row's softmax normaliser over items 1..N, `chunk` items at a time."""
    parts = [torch.logsumexp(hidden @ vectors[lo : lo + chunk].float().T, dim=1)
             for lo in range(1, vectors.shape[0], chunk)]
    return torch.logsumexp(torch.stack(parts), dim=0)


def explaining(model: StreamRecModel | Ensemble) -> StreamRecModel:
    """The network whose attention explains `model`'s recommendations (an ensemble's first member)."""
    return model.first if isinstance(model, Ensemble) else model
