"""Step 4 of reading a log: which events are kept, each step logging what it found and dropped.

`keep_rows` filters each parsed block before its ids are encoded, so a filtered-out event costs nothing
later; `refine` applies the filters that need the whole log. Legend: E events, U users, N items.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from core.runtime.errors import InputError
from streamrec.data.ingest.arrays import as_numpy
from streamrec.data.ingest.columns import Fault, as_ids
from streamrec.data.ingest.options import ColumnFilter, ReadOptions
from streamrec.data.interactions import Interactions

log = logging.getLogger(__name__)

_COMPARE = {"==": np.equal, "!=": np.not_equal, ">": np.greater, ">=": np.greater_equal, "<": np.less,
            "<=": np.less_equal}


def cell_number(value: object) -> float:
    """A filter cell as a number; ValueError names what is wrong."""
    try:
        number = float(str(value).strip())
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise ValueError(f"value {value!r} is not a number, which the filter compares")
    return number


def keep_rows(rule: ColumnFilter, cells: pa.Array) -> np.ndarray:
    """(B,) bool: the rows whose cell passes `rule`; raises `Fault` at a cell a numeric rule cannot read."""
    if rule.numeric:
        values = _numbers(cells)
        if rule.op in ("in", "not in"):
            keep = np.isin(values, np.array(rule.values, dtype=np.float64))
            return keep if rule.op == "in" else ~keep
        return _COMPARE[rule.op](values, float(rule.value))
    encoded = pc.dictionary_encode(pc.utf8_trim_whitespace(as_ids(cells, "filter")))
    distinct = encoded.dictionary.to_pylist()  # few: decided in Python, then spread by the indices
    texts = {str(v) for v in rule.values}
    passes = np.array([(v in texts) != (rule.op in ("!=", "not in")) for v in distinct], dtype=bool)
    return passes[as_numpy(pc.cast(encoded.indices, pa.int32()))] if len(distinct) else np.zeros(len(cells), bool)


def _numbers(cells: pa.Array) -> np.ndarray:
    kind, values = cells.type, None
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        try:
            values = as_numpy(pc.cast(pc.utf8_trim_whitespace(cells), pa.float64()))
        except pa.ArrowInvalid:
            pass
    elif pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        values = as_numpy(pc.cast(cells, pa.float64()))
    if values is None:
        values = np.array([_python_number(k, v) for k, v in enumerate(cells.to_pylist())], dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(values))
    if len(bad):
        raise Fault(int(bad[0]), "filter", f"value {cells[int(bad[0])].as_py()!r} is not a number, "
                                           "which the filter compares")
    return values


def _python_number(row: int, value: object) -> float:
    try:
        return cell_number(value)
    except ValueError as e:
        raise Fault(row, "filter", str(e)) from None


def refine(inter: Interactions, options: ReadOptions, path: Path) -> Interactions:
    """The whole-log filters of `options`, in order: duplicates, rare items, k-core."""
    inter = drop_duplicates(inter, options.duplicates, path)
    if options.min_item_count > 1:
        inter = drop_rare_items(inter, options.min_item_count, path)
    if options.k_core is not None and options.k_core > 1:
        inter = k_core(inter, options.k_core, path)
    if not inter.num_interactions:
        raise InputError(f"{path}: no interactions are left after the filters (filter, min_item_count, k_core); "
                         "loosen them")
    return inter


def duplicate_events(inter: Interactions) -> np.ndarray:
    """(E,) bool: events equal to an earlier event of the same user (same item and time; without times, the
    same item as the event just before)."""
    codes = inter.codes
    first = inter.offsets[1:-1] - 1  # pairs (i, i + 1) that cross from one user to the next
    if inter.times is None:
        dup = np.zeros(len(codes), dtype=bool)
        dup[1:] = codes[1:] == codes[:-1]
        dup[first + 1] = False
        return dup
    # Duplicates share a time, and a user's events are sorted by time: they lie in runs of equal times,
    # which are few, so only those runs' events are sorted by item.
    tie = inter.times[1:] == inter.times[:-1]  # (E - 1,) event i + 1 has event i's time
    tie[first] = False
    in_run = np.zeros(len(codes), dtype=bool)
    in_run[1:] |= tie
    in_run[:-1] |= tie
    idx = np.flatnonzero(in_run)
    dup = np.zeros(len(codes), dtype=bool)
    if not len(idx):
        return dup
    run = np.cumsum(np.concatenate([[True], ~tie[idx[1:] - 1]]))  # run number of each event of a run
    order = np.lexsort((codes[idx], run))  # stable: the first of equal events comes first
    same = (run[order[1:]] == run[order[:-1]]) & (codes[idx[order[1:]]] == codes[idx[order[:-1]]])
    dup[idx[order[1:][same]]] = True
    return dup


def drop_duplicates(inter: Interactions, policy: str, path: Path) -> Interactions:
    """Exact duplicate events kept, dropped (all but the first) or refused, by `policy`; the count is logged."""
    dup = duplicate_events(inter)
    count = int(dup.sum())
    what = "same user, item and time" if inter.times is not None else "the same item twice in a row for a user"
    if count and policy == "error":
        k = int(np.flatnonzero(dup)[0])
        user = inter.users[int(np.searchsorted(inter.offsets, k, side="right")) - 1]
        at = "" if inter.times is None else f" at time {inter.times[k]:g}"
        raise InputError(f"{path}: {count} exact duplicate events ({what}), the first user {user!r}, item "
                         f"{inter.item_ids[inter.codes[k]]!r}{at}; set duplicates: keep or drop "
                         "(--data.duplicates drop)")
    action = "dropped" if policy == "drop" and count else "kept"
    log.info("%s: %d exact duplicate events (%s), %s", path, count, what, action)
    return inter.select(~dup) if action == "dropped" else inter


def drop_rare_items(inter: Interactions, min_count: int, path: Path) -> Interactions:
    """The events of items with fewer than `min_count` events dropped (one pass; the counts are logged)."""
    counts = np.bincount(inter.codes, minlength=len(inter.item_ids))
    keep = counts[inter.codes] >= min_count
    rare = int(np.count_nonzero((counts > 0) & (counts < min_count)))
    log.info("%s: dropped %d of %d items with fewer than %d events (%d events)", path, rare,
             int(np.count_nonzero(counts)), min_count, int((~keep).sum()))
    return inter.select(keep)


def k_core(inter: Interactions, k: int, path: Path) -> Interactions:
    """The largest part of the log where every user and every item has at least `k` events (dropping and
    recounting until nothing changes)."""
    user = np.repeat(np.arange(len(inter.users), dtype=np.int32), inter.lengths)  # (E,)
    keep = np.ones(inter.num_interactions, dtype=bool)
    rounds = 0
    while True:
        rounds += 1
        users_ok = np.bincount(user[keep], minlength=len(inter.users)) >= k
        items_ok = np.bincount(inter.codes[keep], minlength=len(inter.item_ids)) >= k
        now = keep & users_ok[user] & items_ok[inter.codes]
        if np.array_equal(now, keep):
            break
        keep = now
    kept = inter.select(keep)
    log.info("%s: %d-core: kept %d of %d events, %d of %d users, %d items (%d rounds)", path, k,
             kept.num_interactions, inter.num_interactions, len(kept.users), len(inter.users),
             len(np.unique(kept.codes)), rounds)
    return kept
