"""Top-K items over a catalogue of any size in bounded memory: item chunks and a running merge.

Scoring B users against N items the plain way builds the (B, N+1) score matrix (at 5M items and
128 users 2.6 GB, twice over with the masked copy `streamrec.predict.top_items` makes). Here the
catalogue is walked `item_chunk` items at a time: each chunk's scores are computed, masked (seen
items, allow-list), cut to their best K, and merged into the running best K, so the working memory
is about B x item_chunk scores whatever N is. The matmul of a chunk is the same fp32 dot product as
the full one, so the scores agree to float rounding (GEMM blocking can change the last bit).

Ranking rule, the same as a stable sort of the full score matrix: higher score first, and on equal
scores the lower item id first. `torch.topk` leaves the order of ties unspecified, so ties that
cross the K-th place of a chunk are settled by a stable sort of just those rows.

`precision="bf16"` scores each chunk in bfloat16 (about 4x the fp32 matmul speed on AVX512-BF16
CPUs), keeps a shortlist of `k + shortlist` candidates per chunk and re-scores them in fp32; the
result is exact only when bf16 rounding never pushes a true top-K item below the shortlist, so fp32
is the default and `benchmarks/streamrec_topk.py` measures the agreement.

Legend: B queries (users), D width, N items (ids 1..N, 0 = padding), C items in a chunk, K top-K,
L excluded ids per query, M allowed items.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from streamrec.constants import PAD_ID

DEFAULT_ITEM_CHUNK = 65_536  # 128 users x 64k items = 32 MiB of scores; 8k chunks were 3x slower on 2 CPUs
DEFAULT_SHORTLIST = 64  # extra bf16 candidates per chunk re-scored in fp32
Precision = Literal["fp32", "bf16"]
NEG_INF = float("-inf")


class TopK(NamedTuple):
    """Items (B, K) best first and their scores (B, K); an empty slot holds item 0 and score -inf."""

    items: Tensor
    scores: Tensor


@torch.no_grad()
def top_k_items(queries: Tensor, vectors: Tensor, k: int, *, exclude: Tensor | None = None,
                allowed: Tensor | None = None, item_chunk: int = DEFAULT_ITEM_CHUNK, normalize: bool = False,
                precision: Precision = "fp32", shortlist: int = DEFAULT_SHORTLIST) -> TopK:
    """The `k` items with the highest dot product with each query, never building the (B, N+1) matrix.

    Args:
        queries: (B, D) user states (or normalized item vectors for cosine similarity).
        vectors: (N+1, D) item vectors; row 0 is padding and never returned.
        k: items per query; min(k, N) columns are returned.
        exclude: (B, L) item ids to leave out of each row (0 = nothing), e.g. the items already seen.
        allowed: (N+1,) bool, the items that may be returned (an allow-list); None: every item.
        item_chunk: items scored at once; memory is about B x item_chunk floats, whatever N is.
        normalize: L2-normalize each chunk of item vectors first (cosine similarity; normalize the queries too).
        precision: "fp32" (exact) or "bf16" (a bf16 shortlist of `k + shortlist` per chunk, re-scored in fp32).
        shortlist: extra bf16 candidates per chunk.

    Returns:
        `TopK`: items (B, K) and scores (B, K), ranked by score, then lower item id; a slot with no
        eligible item left (exclusions or the allow-list leave fewer than K) holds item 0 and -inf.
    """
    if k < 1 or item_chunk < 1:
        raise ValueError(f"`k` ({k}) and `item_chunk` ({item_chunk}) must be >= 1")
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"`precision` ({precision!r}) must be 'fp32' or 'bf16'")
    queries = queries.float()
    n_out = min(k, vectors.shape[0] - 1)
    best = TopK(torch.full((queries.shape[0], n_out), PAD_ID, dtype=torch.long, device=queries.device),
                torch.full((queries.shape[0], n_out), NEG_INF, device=queries.device))
    candidates = _candidates(vectors.shape[0], allowed, queries.device)
    exclude = None if exclude is None else exclude.to(queries.device)
    buffer = torch.empty(queries.shape[0], item_chunk, device=queries.device)  # reused: no page faults per chunk
    for start in range(0, candidates.numel() if candidates is not None else vectors.shape[0] - 1, item_chunk):
        if candidates is None:  # the whole catalogue: a slice of the table, no copy
            lo, hi = 1 + start, min(1 + start + item_chunk, vectors.shape[0])
            ids, chunk = lo, vectors[lo:hi]  # ids lo..hi-1, kept as the first one
        else:
            ids = candidates[start : start + item_chunk]
            chunk = vectors[ids]
        chunk = F.normalize(chunk.float(), dim=-1) if normalize else chunk
        if precision == "bf16":
            top = _chunk_top_bf16(queries, chunk, ids, n_out, exclude, shortlist)
        else:
            top = _chunk_top(queries, chunk, ids, n_out, exclude, buffer)
        best = _merge(best, top)
    return TopK(best.items.masked_fill(best.scores == NEG_INF, PAD_ID), best.scores)


def _candidates(rows: int, allowed: Tensor | None, device: torch.device) -> Tensor | None:
    """The sorted ids an allow-list keeps (padding never), or None for the whole catalogue. (M,)"""
    if allowed is None:
        return None
    allowed = allowed.to(device).clone()
    allowed[PAD_ID] = False
    return allowed.nonzero().squeeze(1)


def _chunk_top(queries: Tensor, chunk: Tensor, ids: Tensor | int, k: int, exclude: Tensor | None,
               buffer: Tensor) -> TopK:
    """The chunk's best min(k, C) items per query, ordered by score, then id (ties settled as a stable sort)."""
    if chunk.shape[0] == buffer.shape[1]:
        scores = torch.mm(queries, chunk.float().T, out=buffer)  # (B, C)
    else:
        scores = queries @ chunk.float().T
    _mask_excluded(scores, ids, exclude)
    top, pos = _top_settled(scores, min(k, scores.shape[1]))
    return _ordered(top, _item_ids(ids, pos))


def _chunk_top_bf16(queries: Tensor, chunk: Tensor, ids: Tensor | int, k: int, exclude: Tensor | None,
                    shortlist: int) -> TopK:
    """A bf16 shortlist of the chunk, re-scored in fp32, cut to min(k, C)."""
    rough = queries.bfloat16() @ chunk.bfloat16().T  # (B, C)
    _mask_excluded(rough, ids, exclude)
    rough_top, pos = rough.topk(min(k + shortlist, rough.shape[1]), dim=1)  # (B, S)
    pos = pos.sort(dim=1).values  # id order, so a stable sort below prefers lower ids
    exact = torch.einsum("bd,bsd->bs", queries, chunk.float()[pos])  # (B, S): fp32 dot products
    exact.masked_fill_(rough.gather(1, pos) == NEG_INF, NEG_INF)
    top, sub = _top_settled(exact, min(k, exact.shape[1]))
    return _ordered(top, _item_ids(ids, pos.gather(1, sub)))


def _item_ids(ids: Tensor | int, pos: Tensor) -> Tensor:
    """Item ids of chunk positions: `ids` is the chunk's sorted ids, or its first id when they run on."""
    return pos + ids if isinstance(ids, int) else ids[pos]


def _mask_excluded(scores: Tensor, ids: Tensor | int, exclude: Tensor | None) -> None:
    """Set -inf where a row's excluded id falls in this chunk (`ids` sorted ascending, or the first of a run)."""
    if exclude is None:
        return
    if isinstance(ids, int):  # ids, ids + 1, ...: positions by subtraction
        pos = exclude - ids
        hit = (pos >= 0) & (pos < scores.shape[1])
    else:
        pos = torch.searchsorted(ids, exclude).clamp_(max=ids.numel() - 1)  # (B, L)
        hit = ids[pos] == exclude  # padding 0 is never among the candidate ids
    rows = torch.arange(scores.shape[0], device=scores.device)[:, None].expand_as(pos)
    scores[rows[hit], pos[hit]] = NEG_INF


def _top_settled(scores: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """`topk` whose ties at the K-th place go to the lower column (columns are in id order).

    A tie crosses the K-th place exactly when the (K+1)-th best equals the K-th: only those rows
    are redone with a stable sort, so the common case costs one `topk` of K+1.
    """
    if k >= scores.shape[1]:
        top, pos = scores.topk(k, dim=1)
        return top, pos
    top, pos = scores.topk(k + 1, dim=1)
    tied = (top[:, k] == top[:, k - 1]) & (top[:, k - 1] > NEG_INF)  # -inf slots are emptied anyway
    top, pos = top[:, :k], pos[:, :k]
    if bool(tied.any()):
        rows = tied.nonzero().squeeze(1)
        top_r, pos_r = scores[rows].sort(dim=1, descending=True, stable=True)
        top[rows], pos[rows] = top_r[:, :k], pos_r[:, :k]
    return top, pos


def _ordered(scores: Tensor, items: Tensor) -> TopK:
    """Candidates sorted by score, then item id."""
    items, by_id = items.sort(dim=1)
    scores, by_score = scores.gather(1, by_id).sort(dim=1, descending=True, stable=True)
    return TopK(items.gather(1, by_score), scores)


def _merge(best: TopK, new: TopK) -> TopK:
    """The running best K and a later chunk's best: every id in `best` is lower, so a stable sort keeps the rule."""
    scores = torch.cat([best.scores, new.scores], dim=1)
    items = torch.cat([best.items, new.items], dim=1)
    scores, order = scores.sort(dim=1, descending=True, stable=True)
    k = best.scores.shape[1]
    return TopK(items.gather(1, order[:, :k]), scores[:, :k])


def brute_force_top_k(queries: Tensor, vectors: Tensor, k: int, *, exclude: Tensor | None = None,
                      allowed: Tensor | None = None) -> TopK:
    """The reference: the full (B, N+1) matrix and a stable sort. For tests and benchmarks, O(B x N) memory."""
    scores = queries.float() @ vectors.float().T
    scores[:, PAD_ID] = NEG_INF
    if exclude is not None:
        scores.scatter_(1, exclude, NEG_INF)
    if allowed is not None:
        scores.masked_fill_(~allowed, NEG_INF)
    top, items = scores.sort(dim=1, descending=True, stable=True)
    n_out = min(k, vectors.shape[0] - 1)
    top, items = top[:, :n_out], items[:, :n_out]
    return TopK(items.masked_fill(top == NEG_INF, PAD_ID), top)
