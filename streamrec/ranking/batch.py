"""Batch scoring, shared by every entry point: histories in, top-K items and output rows out. Each entry point (score
and its Ray workers, predict, the server, `streamrec.Recommender`) builds one `RankingOptions` from its own spelling
(flags, YAML, JSON, keywords), so a setting has one name everywhere; `rank` is the one path from histories to top-K.

Legend: B users in a batch, T history length (the model's max_len), K top-K, L seen-list length."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import torch
from torch import Tensor

from core.runtime.atomic import atomic_path
from core.runtime.errors import InputError
from streamrec.data.interactions import Interactions
from streamrec.data.items import ItemCatalog
from streamrec.data.vocab import ItemVocab
from streamrec.model.network import PAD_ID, StreamRecModel
from streamrec.ranking.ensemble import Ensemble, explaining
from streamrec.ranking.explain import EXPLAIN_COLUMNS, explain_columns
from streamrec.ranking.topk import ItemTable, Precision, TopK, top_k_items


@dataclass(frozen=True)
class RankingOptions:
    """How one job ranks the catalogue for each user. `exclude_seen` leaves out the whole history, not only the last
    max_len items the model reads. `cold_slots`: of the `top_k`, how many go to the best cold items (known by their
    features only), placed by score: a model ranks a cold item below the warm ones it knows from many histories, so
    without slots new items are almost never shown. Without item features there is no cold item: all slots are warm."""

    top_k: int = 10
    exclude_seen: bool = True
    item_chunk: int | None = None
    precision: Precision = "fp32"
    explain: bool = False
    batch_size: int = 256
    cold_slots: int = 0

    def __post_init__(self) -> None:
        for name in ("top_k", "item_chunk", "batch_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise InputError(f"`{name}` ({value}) must be >= 1")
        if not 0 <= self.cold_slots <= self.top_k:
            raise InputError(f"`cold_slots` ({self.cold_slots}) must be between 0 and `top_k` ({self.top_k})")
        if self.precision not in ("fp32", "bf16"):
            raise InputError(f"`precision` ({self.precision!r}) must be 'fp32' or 'bf16'")


def encode_histories(histories: Sequence[Sequence[str]], vocab: ItemVocab) -> tuple[list[list[int]], list[list[str]]]:
    """Original ids -> model ids (order kept) of many histories with one `ItemVocab.lookup` for all their items,
    and per history the ids the checkpoint never saw (dropped), in order."""
    flat: list[str] = []
    bounds = [0]  # history u is flat[bounds[u] : bounds[u + 1]]
    for h in histories:
        flat.extend(h)
        bounds.append(len(flat))
    ids = vocab.lookup(flat)  # (sum of lengths,) 0 for an unknown id
    known = [part[part != 0].tolist() for part in (ids[lo:hi] for lo, hi in pairwise(bounds))]
    unknown: list[list[str]] = [[] for _ in known]
    missing = np.flatnonzero(ids == 0)
    for j, user in zip(missing.tolist(), (np.searchsorted(bounds, missing, side="right") - 1).tolist(), strict=True):
        unknown[user].append(flat[j])
    return known, unknown


def encode_history(items: Sequence[str], vocab: ItemVocab) -> tuple[list[int], list[str]]:
    known, unknown = encode_histories([items], vocab)
    return known[0], unknown[0]


def left_pad(histories: Sequence[Sequence[int]], max_len: int, device: torch.device | str = "cpu") -> Tensor:
    """The last `max_len` items of each history, left-padded with 0. (B, T)"""
    out = torch.zeros(len(histories), max_len, dtype=torch.long)
    for row, h in enumerate(histories):
        tail = list(h)[-max_len:]
        if tail:
            out[row, max_len - len(tail):] = torch.tensor(tail)
    return out.to(device)


def length_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices in batches of similar history length, shortest first: a batch costs what its longest history
    costs (`trim_padding`)."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


@torch.no_grad()
def rank(model: StreamRecModel | Ensemble, inputs: Tensor, seen: Tensor | None, options: RankingOptions,
         allowed: Tensor | None = None, table: ItemTable | None = None) -> TopK:
    """The top K items after each (B, T) left-padded history, (B, K); a slot with no eligible item left holds item 0 and
    -inf. `seen` (B, L) holds each whole history (0 = nothing), left out when `options.exclude_seen`; `table` is where
    the item vectors are read (`FileRows` of the checkpoint, the bf16 scan table; None: the model's)."""
    exclude = seen if options.exclude_seen else None
    if isinstance(model, Ensemble):
        if table is not None or options.precision != "fp32":
            raise InputError("an ensemble ranks by a mean of probabilities, in fp32 only: drop the bf16 precision")
        if options.cold_slots:
            raise InputError("`cold_slots`: an ensemble ranks every item by one mean probability; ask for 0 cold slots")

        def top(k: int, among: Tensor | None) -> TopK:
            return model.top_k(inputs, k, among, exclude, options.item_chunk)
    else:
        vectors, scan = (model.item_vectors, None) if table is None else table
        hidden = model.last_hidden(inputs)

        def top(k: int, among: Tensor | None) -> TopK:
            return top_k_items(hidden, vectors, k, allowed=among, exclude=exclude, item_chunk=options.item_chunk,
                               precision=options.precision, scan=scan)

    cold = getattr(model, "cold_items", None)
    if options.cold_slots and getattr(getattr(model, "items", None), "features", "add") != "add":
        raise InputError("`cold_slots` needs a model that scores cold items by their features, and this one scores ids "
                         "alone (`model.items.features: attention` or `stream`); ask for 0 cold slots")
    if not options.cold_slots or cold is None or not bool(cold.any()):
        return top(options.top_k, allowed)
    both = torch.ones_like(cold) if allowed is None else allowed.to(cold.device)
    parts = [top(k, both & mask) for k, mask in ((options.top_k - options.cold_slots, ~cold),
                                                    (options.cold_slots, cold)) if k]
    items, scores = torch.cat([p.items for p in parts], 1), torch.cat([p.scores for p in parts], 1)
    order = scores.argsort(dim=1, descending=True, stable=True)  # empty slots (-inf) go last
    return TopK(items.gather(1, order), scores.gather(1, order))


@torch.no_grad()
def recommend(model: StreamRecModel | Ensemble, histories: Sequence[Sequence[int]], options: RankingOptions,
              allowed: Tensor | None = None, table: ItemTable | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """`rank` of model id histories (oldest first, none empty, each whole its seen items): inputs (B, T), items
    (B, K) and scores (B, K)."""
    device = model.device
    inputs = left_pad(histories, model.max_len, device)
    width = max(1, max((len(h) for h in histories), default=0))  # (B, L) right-padded
    seen = torch.tensor([list(h) + [PAD_ID] * (width - len(h)) for h in histories], dtype=torch.long,
                        device=device) if options.exclude_seen else None
    return inputs, *rank(model, inputs, seen, options, allowed, table)


def recommendation_table(users: Sequence[str], vocab: ItemVocab, items: Tensor, scores: Tensor,
                         extra: dict[str, Tensor] | None = None) -> pa.Table:
    """One row per (user, rank), original ids; slots with no eligible item (item 0) are left out. `extra`: more
    (B, K) columns; names starting with "because" hold item ids, the others floats."""
    k = items.shape[1]
    valid = (items != PAD_ID).flatten().tolist()
    cols: dict[str, list] = {
        "user_id": [u for u in users for _ in range(k)],
        "rank": list(range(1, k + 1)) * len(users),
        "item_id": [vocab.items[i - 1] if i else "" for i in items.flatten().tolist()],
        "score": scores.flatten().tolist(),
    }
    for name, values in (extra or {}).items():
        flat = values.flatten().tolist()
        cols[name] = [vocab.items[i - 1] if i else "" for i in flat] if name.startswith("because") else flat
    cols = {name: [v for v, ok in zip(col, valid, strict=True) if ok] for name, col in cols.items()}
    types = {"rank": pa.int32(), "score": pa.float32(), "attention_weight": pa.float32(),
             "occlusion_drop": pa.float32()}
    return pa.table({name: pa.array(col, type=types.get(name, pa.string())) for name, col in cols.items()})


@dataclass(frozen=True)
class PopularItems:
    """The most popular items (model ids, ties in the vocabulary's order) and their event counts (the rows'
    `score`): the ranking a cold user (no history item the model knows) gets."""

    items: list[int]
    counts: list[float]

    @classmethod
    def count(cls, log: Interactions, vocab: ItemVocab, top_k: int) -> PopularItems:
        """The `top_k` items of `vocab` with the most events in `log` (items it never saw are not counted)."""
        events = np.bincount(log.codes, minlength=len(log.item_ids))  # (distinct ids of the log,)
        ids = vocab.lookup(log.item_ids)  # their model ids, 0 for an id the checkpoint never saw
        counts = np.bincount(ids, weights=events, minlength=vocab.num_items + 1)
        counts[PAD_ID] = 0
        order = np.argsort(-counts, kind="stable")[:top_k]
        order = order[counts[order] > 0]
        return cls(order.tolist(), counts[order].tolist())


class BatchScorer:
    """Blocks of users into output rows: `python -m streamrec.score`'s local engine and each of its Ray workers. A user
    with no history item known to the checkpoint (or no history) is cold: with `popular` it gets those items (counted
    `popular_users`), else it is skipped (named in `skipped`). Unknown history items are counted (`unknown_items`). With
    a `catalog` a title column follows each item id column."""

    def __init__(self, model: StreamRecModel | Ensemble, vocab: ItemVocab, options: RankingOptions,
                 catalog: ItemCatalog | None = None, table: ItemTable | None = None,
                 popular: PopularItems | None = None):
        self.model, self.vocab, self.options, self.catalog, self.table = model, vocab, options, catalog, table
        self.popular = popular
        self.unknown_items = self.popular_users = 0
        self.skipped: list[str] = []

    @property
    def no_history(self) -> int:
        return len(self.skipped)

    def rows(self, users: list[str], histories: Mapping[str, Sequence[str]],
             advance: Callable[[int], object] | None = None) -> pa.Table:
        """The rows of `users` in their order, scored in batches of similar history length; `advance(n)` per batch."""
        tables, before = [], len(self.skipped)
        for batch in length_batches([len(histories.get(u, ())) for u in users], self.options.batch_size):
            tables.append(self.score_batch([users[i] for i in batch], histories))
            if advance is not None:
                advance(len(batch))
        if not tables:
            return self.score_batch([], histories)
        position = {u: i for i, u in enumerate(users)}  # back into the users' order, skipped users too
        self.skipped[before:] = sorted(self.skipped[before:], key=position.__getitem__)
        table = pa.concat_tables(tables)
        keys = pa.table({"position": [position[u] for u in table.column("user_id").to_pylist()],
                         "rank": table.column("rank")})
        return table.take(pc.sort_indices(keys, sort_keys=[("position", "ascending"), ("rank", "ascending")]))

    def score_batch(self, users: list[str], histories: Mapping[str, Sequence[str]]) -> pa.Table:
        """One forward pass: the rows of the users with a known history item, then the cold users' (`popular`)."""
        encoded, unknown = encode_histories([histories.get(u, ()) for u in users], self.vocab)  # one lookup
        self.unknown_items += sum(map(len, unknown))
        kept = [(u, ids) for u, ids in zip(users, encoded, strict=True) if ids]
        cold = [u for u, ids in zip(users, encoded, strict=True) if not ids]
        tables = [self._popular_rows(cold)] if cold and self.popular is not None else []
        if cold and self.popular is None:
            self.skipped.extend(cold)
        if kept or not tables:  # with no row, the columns of a scored batch: tables of one run share one schema
            tables.insert(0, self._scored_rows(kept))
        return tables[0] if len(tables) == 1 else pa.concat_tables(tables)

    def _scored_rows(self, kept: list[tuple[str, list[int]]]) -> pa.Table:
        if not kept:
            none = torch.zeros(0, self.options.top_k, dtype=torch.long)
            extra = dict.fromkeys(EXPLAIN_COLUMNS, none) if self.options.explain else {}
            return self._table([], none, none.float(), extra)
        inputs, items, scores = recommend(self.model, [ids for _, ids in kept], self.options, table=self.table)
        extra = explain_columns(explaining(self.model), inputs, items) if self.options.explain else {}
        return self._table([u for u, _ in kept], items, scores, extra)

    def _popular_rows(self, users: list[str]) -> pa.Table:
        """The popular items for each cold user; no history, so the explanation columns are empty."""
        assert self.popular is not None
        self.popular_users += len(users)
        k = self.options.top_k
        pad = k - len(self.popular.items)  # a log with fewer known items than K: empty slots (item 0)
        items = torch.tensor([self.popular.items + [PAD_ID] * pad] * len(users), dtype=torch.long).view(-1, k)
        scores = torch.tensor([self.popular.counts + [0.0] * pad] * len(users)).view(-1, k)
        extra = {name: (torch.zeros_like(items) if name.startswith("because") else torch.full(items.shape, np.nan))
                 for name in EXPLAIN_COLUMNS} if self.options.explain else {}
        return self._table(users, items, scores, extra)

    def _table(self, users: list[str], items: Tensor, scores: Tensor, extra: dict[str, Tensor]) -> pa.Table:
        table = recommendation_table(users, self.vocab, items.cpu(), scores.cpu(),
                                     {name: v.cpu() for name, v in extra.items()})
        for column, title in (("item_id", "title"), ("because_attention", "because_attention_title"),
                              ("because_occlusion", "because_occlusion_title")):
            if self.catalog is not None and column in table.column_names:  # an id it lacks is its own title
                titles = pa.array([self.catalog.title(i) for i in table.column(column).to_pylist()], pa.string())
                table = table.add_column(table.column_names.index(column) + 1, title, titles)
        return table


def write_tables(tables: Iterable[pa.Table], path: Path, metadata: dict[bytes, bytes] | None = None) -> int:
    """Stream tables of one schema into `path` (.csv, else Parquet with `metadata`) atomically, one in memory at a
    time; returns the rows written."""
    writer, rows = None, 0
    with atomic_path(path) as tmp:
        try:
            for table in tables:
                if writer is None:
                    schema = table.schema.remove_metadata()
                    writer = (pacsv.CSVWriter(tmp, schema) if path.suffix == ".csv" else
                              pq.ParquetWriter(tmp, schema.with_metadata(metadata) if metadata else schema))
                writer.write_table(table.replace_schema_metadata(None))
                rows += table.num_rows
        finally:
            if writer is not None:
                writer.close()
        if writer is None:
            raise InputError(f"{path}: no user could be scored (no history item is known to the checkpoint; "
                             "see the warnings above); nothing was written")
    return rows
