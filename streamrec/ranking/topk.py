"""Top-K items over a catalogue of any size in bounded memory: item chunks and a running merge. Scoring B users against
N items the plain way builds the (B, N+1) score matrix. Here the catalogue is walked `item_chunk` items at a time: each
chunk's scores are computed, masked (seen items, allow-list), cut to their best K, and merged into the running best K,
so the working memory is about B x item_chunk scores whatever N is; the scores agree with the full matrix's to float
rounding. Ranking rule, as a stable sort of the full matrix: higher score first, on equal scores the lower item id first
(`torch.topk` leaves ties unspecified: ties across a chunk's K-th place are settled by a stable sort of those rows).

`precision="bf16"` gives the same items, faster where bf16 matmuls are (AVX512-BF16, AMX; docs/results.md, "Scale"):
each chunk is scored in bfloat16 and only the items whose bf16 score can still reach the running K-th best are re-scored
in fp32. Why that is exact: with inputs rounded to bf16 (relative error u = 2^-8 each; their products are exact in
fp32), products summed in fp32 and the sum rounded to bf16, |bf16 score - fp32 score| <= (3u + O(u^2)) sum|q_i v_i| <=
(3u + O(u^2)) |q| |v| (Cauchy-Schwarz). `BF16_ERROR` = 4u, plus D 2^-23 for the fp32 sums of the re-score and of the
K-th best, times |q| and the largest |v| of the chunk, is the threshold's margin; an item below (K-th best) - margin
cannot enter. Maxima of groups of `SCAN_GROUP` items are compared first, so a chunk costs a bf16 matmul and one `amax`
pass, not a `topk`. The first chunk (it sets the K-th best), and any chunk where too many items pass, are scored in
fp32. On CUDA, bf16 split-K reductions are turned off for the call (the bound needs fp32 sums). With `scan_table`'s bf16
copy the fp32 table may stay in a file (`FileRows`), read only for the first chunk and the re-scored rows (a memory map
would not do: the kernel maps whole pages around each row read).

Legend: B queries (users), D width, N items (ids 1..N, 0 = padding), C items in a chunk, K top-K, L excluded ids per
query, M allowed items."""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from streamrec.data.constants import PAD_ID

DEFAULT_ITEM_CHUNK = 65_536  # 128 users x 64k items = 32 MiB of scores; small chunks pay a merge each
SCAN_GROUP = 64  # items per group maximum in the bf16 scan
SCAN_CHUNK = 16_384  # the bf16 scan's default chunk: its (C, B) bf16 scores stay in cache
BF16_ERROR = 4 * 2**-8  # |bf16 score - fp32 score| <= BF16_ERROR |q||v| (plus D 2^-23 for fp32 sums)
Precision = Literal["fp32", "bf16"]
NEG_INF = float("-inf")


class ScanTable(NamedTuple):
    """The catalogue as the bf16 scan reads it: bf16 rows (N+1, D) and fp32 row norms (N+1,) for the error bound."""

    values: Tensor
    norms: Tensor


class FileRows:
    """An (N+1, D) fp32 table in a file, read with `os.pread`: only the rows asked for enter memory (the bf16
    scan's re-scored rows). The rows lie back to back, little-endian fp32, from byte `offset`."""

    def __init__(self, path: str | Path, shape: tuple[int, int], offset: int = 0):
        self.path, self.shape, self.offset = Path(path), torch.Size(shape), offset
        self._fd = os.open(self.path, os.O_RDONLY)
        weakref.finalize(self, os.close, self._fd)
        need = offset + self.shape.numel() * 4
        if os.fstat(self._fd).st_size < need:
            raise ValueError(f"{path}: {os.fstat(self._fd).st_size:,} bytes, too short for an fp32 table of shape "
                             f"{tuple(shape)} at offset {offset:,} ({need:,} bytes); check the shape and offset")

    @classmethod
    def mapped(cls, table: Tensor, path: str | Path) -> FileRows | None:
        """The rows of `table`, which `torch.load(path, mmap=True)` mapped from `path`, read from that file. Its place
        in the file is where its mapping starts (/proc/self/maps) plus its distance from there; the first and last rows
        read back are checked against the tensor's. None where that cannot be told (no /proc, not a mapped contiguous
        fp32 table of `path`): the caller then reads `table` itself."""
        if table.dtype != torch.float32 or table.device.type != "cpu" or table.dim() != 2 or not table.is_contiguous():
            return None
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            return None
        start, end, real = table.data_ptr(), table.data_ptr() + table.numel() * 4, os.path.realpath(path)
        for line in maps.splitlines():
            fields = line.split(maxsplit=5)  # address range, perms, file offset, device, inode, path
            if len(fields) == 6 and fields[5] == real:
                lo, hi = (int(a, 16) for a in fields[0].split("-"))
                if lo <= start and end <= hi:
                    rows = cls(path, (table.shape[0], table.shape[1]), start - lo + int(fields[2], 16))
                    ends = torch.tensor([0, table.shape[0] - 1])
                    return rows if torch.equal(rows[ends], table[ends]) else None
        return None

    def __getitem__(self, rows: slice | Tensor) -> Tensor:
        """Rows `lo:hi` (one read) or the rows of a 1-D id tensor, as a new (R, D) fp32 tensor."""
        row_bytes = self.shape[1] * 4
        if isinstance(rows, slice):
            lo, hi, step = rows.indices(self.shape[0])
            assert step == 1, "FileRows reads contiguous slices only"
            spans = [(self.offset + lo * row_bytes, max(hi - lo, 0) * row_bytes)]
        else:
            spans = [(self.offset + i * row_bytes, row_bytes) for i in rows.tolist()]
        data = bytearray(sum(n for _, n in spans))
        if not data:
            return torch.empty(0, self.shape[1])
        view, at = memoryview(data), 0
        for start, n in spans:
            if n and os.preadv(self._fd, [view[at : at + n]], start) != n:
                raise OSError(f"{self.path}: short read at byte {start:,}; the file changed while in use")
            at += n
        return torch.frombuffer(data, dtype=torch.float32).view(-1, self.shape[1])


class TopK(NamedTuple):
    """Items (B, K) best first and their scores (B, K); an empty slot holds item 0 and score -inf."""

    items: Tensor
    scores: Tensor


class ItemTable(NamedTuple):
    """The catalogue as the ranker reads it: fp32 item vectors (N+1, D), maybe from a file, and the bf16 scan table."""

    vectors: Tensor | FileRows
    scan: ScanTable | None = None


@torch.no_grad()
def top_k_items(queries: Tensor, vectors: Tensor | FileRows, top_k: int, *, exclude: Tensor | None = None,
                allowed: Tensor | None = None, item_chunk: int | None = None, normalize: bool = False,
                precision: Precision = "fp32", scan: ScanTable | None = None) -> TopK:
    """The `top_k` items with the highest dot product with each (B, D) query, never building the (B, N+1) matrix.

    Args:
        vectors: (N+1, D) item vectors, row 0 padding (never returned); a `FileRows` with a `scan` table.
        exclude: (B, L) item ids to leave out of each row (0 = nothing); `allowed`: (N+1,) bool allow-list.
        item_chunk: items scored at once (memory about B x item_chunk floats); None: `DEFAULT_ITEM_CHUNK`, or
            `SCAN_CHUNK` for the bf16 scan.
        normalize: L2-normalize each chunk of item vectors first (cosine similarity; normalize the queries too).
        precision: "fp32", or "bf16": a bf16 scan, the items that can reach the top K re-scored in fp32.
        scan: `scan_table(vectors)`, read by the bf16 scan instead of converting each chunk.

    Returns `TopK` (B, min(top_k, N)); a slot with no eligible item left holds item 0 and -inf."""
    if item_chunk is None:
        item_chunk = SCAN_CHUNK if precision == "bf16" else DEFAULT_ITEM_CHUNK
    if top_k < 1 or item_chunk < 1:
        raise ValueError(f"`top_k` ({top_k}) and `item_chunk` ({item_chunk}) must be >= 1")
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"`precision` ({precision!r}) must be 'fp32' or 'bf16'")
    if scan is not None and (precision != "bf16" or normalize or scan.values.shape != vectors.shape):
        raise ValueError(f"`scan` (shape {tuple(scan.values.shape)}) is read only with precision='bf16' and "
                         f"normalize=False, and must be scan_table(vectors) (shape {tuple(vectors.shape)})")
    queries = queries.float()
    n_out = min(top_k, vectors.shape[0] - 1)
    best = TopK(torch.full((queries.shape[0], n_out), PAD_ID, dtype=torch.long, device=queries.device),
                torch.full((queries.shape[0], n_out), NEG_INF, device=queries.device))
    candidates = _candidates(vectors.shape[0], allowed, queries.device)
    exclude = None if exclude is None else exclude.to(queries.device)
    bounded = _BoundedQueries(queries) if precision == "bf16" else None
    with _fp32_sums(queries.device):
        _walk(best, queries, vectors, n_out, candidates, exclude, item_chunk, normalize, bounded, scan)
    return TopK(best.items.masked_fill(best.scores == NEG_INF, PAD_ID), best.scores)


def _walk(best: TopK, queries: Tensor, vectors: Tensor | FileRows, n_out: int, candidates: Tensor | None,
          exclude: Tensor | None, item_chunk: int, normalize: bool, bounded: _BoundedQueries | None,
          scan: ScanTable | None) -> None:
    total = candidates.numel() if candidates is not None else vectors.shape[0] - 1
    buffer = torch.empty(queries.shape[0], max(min(item_chunk, total), 1), device=queries.device)  # reused per chunk
    for start in range(0, total, item_chunk):
        ids, rows = _chunk_rows(start, item_chunk, candidates, vectors.shape[0])
        if bounded is not None and start > 0:  # the first chunk is scored in fp32: it sets the K-th best
            _scan_chunk(bounded, vectors, scan, rows, ids, best, exclude, normalize, buffer)
            continue
        chunk = _fp32_rows(vectors, rows, normalize)
        merged = _merge(best, _chunk_top(queries, chunk, ids, n_out, exclude, buffer))
        best.items.copy_(merged.items)
        best.scores.copy_(merged.scores)


def _chunk_rows(start: int, item_chunk: int, candidates: Tensor | None,
                rows: int) -> tuple[Tensor | int, slice | Tensor]:
    """The chunk's ids (its sorted ids, or the first id of a run) and the rows to read."""
    if candidates is None:  # the whole catalogue: a slice of the table, no copy
        lo, hi = 1 + start, min(1 + start + item_chunk, rows)
        return lo, slice(lo, hi)  # ids lo..hi-1, kept as the first one
    ids = candidates[start : start + item_chunk]
    return ids, ids


@torch.no_grad()
def top_k_by(score_rows: Callable[[slice | Tensor], Tensor], n_items: int, batch: int, top_k: int, *,
             exclude: Tensor | None = None, allowed: Tensor | None = None, item_chunk: int = DEFAULT_ITEM_CHUNK,
             device: torch.device | str = "cpu") -> TopK:
    """`top_k_items` for scores that are not one dot product (an ensemble's mean probability): `score_rows(rows)`
    gives the (B, C) scores of a chunk of item rows (a slice, or sorted ids), walked and merged by the same rule."""
    n_out = min(top_k, n_items)
    best = TopK(torch.full((batch, n_out), PAD_ID, dtype=torch.long, device=device),
                torch.full((batch, n_out), NEG_INF, device=device))
    candidates = _candidates(n_items + 1, allowed, torch.device(device))
    exclude = None if exclude is None else exclude.to(device)
    for start in range(0, candidates.numel() if candidates is not None else n_items, item_chunk):
        ids, rows = _chunk_rows(start, item_chunk, candidates, n_items + 1)
        best = _merge(best, _scores_top(score_rows(rows).float(), ids, n_out, exclude))
    return TopK(best.items.masked_fill(best.scores == NEG_INF, PAD_ID), best.scores)


@contextmanager
def _fp32_sums(device: torch.device) -> Iterator[None]:
    """The bf16 error bound needs products summed in fp32: CUDA may sum split-K partials in bf16 unless told not to."""
    if device.type != "cuda":
        yield
        return
    allowed = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = allowed


@torch.no_grad()
def scan_table(vectors: Tensor | FileRows, item_chunk: int = SCAN_CHUNK) -> ScanTable:
    """The bf16 copy and fp32 row norms the bf16 scan reads, built `item_chunk` rows at a time (no fp32 table copy)."""
    device = vectors.device if isinstance(vectors, Tensor) else torch.device("cpu")
    values = torch.empty(vectors.shape, dtype=torch.bfloat16, device=device)
    norms = torch.empty(vectors.shape[0], device=device)
    for lo in range(0, vectors.shape[0], item_chunk):
        chunk = vectors[lo : lo + item_chunk].float()
        values[lo : lo + item_chunk] = chunk
        norms[lo : lo + item_chunk] = chunk.norm(dim=1)
    return ScanTable(values, norms)


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
    scores = torch.mm(queries, chunk.float().T, out=buffer if chunk.shape[0] == buffer.shape[1] else None)  # (B, C)
    return _scores_top(scores, ids, k, exclude)


def _scores_top(scores: Tensor, ids: Tensor | int, k: int, exclude: Tensor | None) -> TopK:
    """`_chunk_top` of a chunk's (B, C) scores, however computed (masked in place)."""
    _mask_excluded(scores, ids, exclude)
    top, pos = _top_settled(scores, min(k, scores.shape[1]))
    return _ordered(top, _item_ids(ids, pos))


class _BoundedQueries:
    """Queries in fp32 and bf16, and the per-row factor of the bf16 error bound (B,)."""

    def __init__(self, queries: Tensor):
        self.fp32, self.bf16 = queries, queries.bfloat16()
        # fp32 sums of D products (the re-score and the K-th best) add D 2^-24 each; 2^-23 D covers both.
        self.error = (BF16_ERROR + queries.shape[1] * 2**-23) * queries.norm(dim=1)


def _fp32_rows(vectors: Tensor | FileRows, rows: slice | Tensor, normalize: bool) -> Tensor:
    chunk = vectors[rows].float()
    return F.normalize(chunk, dim=-1) if normalize else chunk


def _scan_chunk(q: _BoundedQueries, vectors: Tensor | FileRows, scan: ScanTable | None, rows: slice | Tensor,
                ids: Tensor | int, best: TopK, exclude: Tensor | None, normalize: bool, buffer: Tensor) -> None:
    """Merge one chunk into `best` (in place): a bf16 scan, fp32 scores for the items that can reach the K-th best."""
    if scan is not None:
        rough_v, v_max = scan.values[rows], scan.norms[rows].max()
    else:
        chunk = _fp32_rows(vectors, rows, normalize)
        rough_v, v_max = chunk.bfloat16(), chunk.norm(dim=1).max()
    # Below this an item's fp32 score is below the K-th best so far (-inf while a row holds fewer than K).
    threshold = best.scores[:, -1] - q.error * v_max  # (B,)
    row, pos = _passing(rough_v @ q.bf16.T, threshold)  # (C, B) bf16: item-major, so group maxima vectorize over B
    if row.numel() == 0:
        return
    item = _item_ids(ids, pos)
    if exclude is not None:
        keep = ~(exclude[row] == item[:, None]).any(dim=1)
        row, item, pos = row[keep], item[keep], pos[keep]
    active, row = torch.unique(row, return_inverse=True)  # (R,) rows with a possible entrant; row indexes it
    queries, n_out = q.fp32[active], best.scores.shape[1]
    if row.numel() > max(rough_v.shape[0] // 4, 1024):  # near-equal scores: the fp32 matmul is cheaper
        top = _chunk_top(queries, _fp32_rows(vectors, rows, normalize), ids, n_out,
                         None if exclude is None else exclude[active], buffer[: active.numel()])
    else:
        top = _rescored(queries, vectors, normalize, row, item, active.numel())
    part = _merge(TopK(best.items[active], best.scores[active]), top)
    best.items[active], best.scores[active] = part.items, part.scores


def _passing(rough: Tensor, threshold: Tensor, group: int = SCAN_GROUP) -> tuple[Tensor, Tensor]:
    """(row, chunk position) of the bf16 scores (C, B) at or above their row's threshold (B,), row-major; group
    maxima first, so only groups holding a passing score are read again."""
    c, b = rough.shape
    whole = c - c % group
    blocks = rough[:whole].view(whole // group, group, b)  # (G, g, B)
    maxima = blocks.amax(dim=1)  # (G, B)
    if whole < c:  # the chunk's tail: one shorter group
        maxima = torch.cat([maxima, rough[whole:].amax(dim=0, keepdim=True)])
    grp, row = (maxima.float() >= threshold).nonzero().unbind(1)  # (Pg,)
    lo = grp * group
    span = torch.arange(group, device=rough.device)  # (g,)
    pos = (lo[:, None] + span).clamp_(max=c - 1)  # (Pg, g); the tail's extra places repeat its last item
    scores = rough[pos, row[:, None]].float()  # (Pg, g)
    hit = (scores >= threshold[row, None]) & (scores > NEG_INF) & (lo[:, None] + span < c)
    sel_row, sel_pos = row[:, None].expand_as(pos)[hit], pos[hit]  # (P,)
    order = torch.argsort(sel_row * c + sel_pos)  # row-major, positions in id order within a row
    return sel_row[order], sel_pos[order]


def _rescored(queries: Tensor, vectors: Tensor | FileRows, normalize: bool, row: Tensor, item: Tensor,
              n_rows: int) -> TopK:
    """fp32 scores of the (row, item) pairs (P,), laid out as (R, most pairs of a row), padded with (0, -inf)."""
    rows32 = vectors[item].float()  # (P, D): only these rows of a table on disk (`FileRows`) are read
    rows32 = F.normalize(rows32, dim=-1) if normalize else rows32
    exact = (queries[row] * rows32).sum(dim=1)  # (P,)
    counts = torch.bincount(row, minlength=n_rows)
    col = torch.arange(row.numel(), device=row.device) - (counts.cumsum(0) - counts)[row]  # place within its row
    scores = torch.full((n_rows, int(counts.max())), NEG_INF, device=row.device)
    items = torch.full_like(scores, PAD_ID, dtype=torch.long)
    scores[row, col], items[row, col] = exact, item
    return _ordered(scores, items)


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
    """`topk` whose ties at the K-th place go to the lower column (id order): only rows whose (K+1)-th best
    equals the K-th are redone with a stable sort, so the common case costs one `topk` of K+1."""
    if k >= scores.shape[1]:
        return scores.topk(k, dim=1)
    top, pos = scores.topk(k + 1, dim=1)
    tied = (top[:, k] == top[:, k - 1]) & (top[:, k - 1] > NEG_INF)  # -inf slots are emptied anyway
    top, pos = top[:, :k], pos[:, :k]
    if bool(tied.any()):
        rows = tied.nonzero().squeeze(1)
        top_r, pos_r = scores[rows].sort(dim=1, descending=True, stable=True)
        top[rows], pos[rows] = top_r[:, :k], pos_r[:, :k]
    return top, pos


def _ordered(scores: Tensor, items: Tensor) -> TopK:
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

