"""Steps 3 and 4 of reading a log: the parsed columns named (user, item, time, the filter's) and converted,
then which events are kept, each filter logging what it found and dropped.

A value that cannot be converted raises `Fault` with its row in the batch: the delimited reader re-reads the file to
name its line (`streamrec.data.readers`), Parquet names the row at once. `keep_rows` filters each block before its ids
are encoded, so a filtered-out event costs nothing later; `refine` applies the filters that need the whole log. Legend:
E events, U users, N items."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from core.runtime.errors import InputError
from streamrec.data.ingest.arrays import as_arrow, as_numpy
from streamrec.data.ingest.options import ColumnFilter, ReadOptions
from streamrec.data.interactions import Interactions

log = logging.getLogger(__name__)

_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
ISO_EXAMPLES = "e.g. 2024-05-01, 2024-05-01 12:00:00 or 2024-05-01T12:00:00+02:00"
_COMPARE = {"==": np.equal, "!=": np.not_equal, ">": np.greater, ">=": np.greater_equal, "<": np.less,
            "<=": np.less_equal}


class Fault(Exception):
    """A value of a parsed batch that cannot be used: `row` in the batch, `column` is the option's name."""

    def __init__(self, row: int, column: str, reason: str):
        super().__init__(reason)
        self.row, self.column, self.reason = row, column, reason


@dataclass(frozen=True)
class Chunk:
    """One converted block: (B,) ids as arrow strings, (B,) float64 seconds, the filter column's cells."""

    users: pa.Array
    items: pa.Array
    times: np.ndarray | None
    filter_values: pa.Array | None = None


@dataclass(frozen=True)
class ColumnPlan:
    """Which parsed columns hold what, for one file: role (user_col, item_col, time_col, filter) -> its column
    in the batches (`columns`) and in the file (`shown`, for messages); `empty` columns are MovieLens' '::' gaps;
    `width` is a delimited file's fields per row."""

    columns: dict[str, str]
    shown: dict[str, str]
    empty: tuple[str, ...] = ()
    width: int = 0

    @property
    def read(self) -> list[str]:
        return list(dict.fromkeys([*self.columns.values(), *self.empty]))


def plan_columns(path: Path, found: Sequence[str], options: ReadOptions, parsed: Sequence[str] | None = None,
                 hints: Sequence[str] = ()) -> ColumnPlan:
    """Find the options' columns among `found` (the file's names); `parsed` names the same columns in the
    batches (default: `found`). `hints` end the missing-column message (e.g. the delimiter option)."""
    parsed = list(found) if parsed is None else list(parsed)
    wanted = {"user_col": options.user_col, "item_col": options.item_col, "time_col": options.time_col,
              "filter": None if options.filter is None else options.filter.column}
    columns, shown = {}, {}
    for role, name in wanted.items():
        if name is None:
            continue
        if name not in found:
            fix = f"rename it in the file or pass {role}=<your column name>" if role != "filter" else (
                "filter on one of these columns")
            raise InputError("; ".join([f"{path}: no column {name!r} (columns: {', '.join(map(str, found)) or 'none'})",
                                        fix, *hints]))
        k = list(found).index(name)
        columns[role], shown[role] = parsed[k], name
    return ColumnPlan(columns, shown)


class TimeParser:
    """Times -> float64 Unix seconds, by `time_format`; auto settles on numbers or ISO-8601 at the first time
    read and keeps to it for the whole log (a log mixing both would mix units)."""

    def __init__(self, time_format: str):
        self.pattern = time_format if "%" in time_format else None
        self.kind = "pattern" if self.pattern else (None if time_format == "auto" else time_format)

    def settle(self, sample: str | None) -> str | None:
        """The kind of times (unix, iso, pattern), settled by `sample`, a first time of the log, if not yet."""
        if self.kind is None and sample is not None:
            with suppress(ValueError):  # the fault is named at its line
                self.parse(sample)
        return self.kind

    def seconds(self, array: pa.Array) -> np.ndarray:
        """(B,) seconds of a null-free arrow array of any type; raises `Fault` at the first bad value."""
        kind = array.type
        if pa.types.is_dictionary(kind):
            return self.seconds(pc.cast(array, kind.value_type))
        if pa.types.is_date(kind):
            array, kind = pc.cast(array, pa.timestamp("s")), pa.timestamp("s")
        if pa.types.is_timestamp(kind):  # Unix seconds, whatever unit the file stores
            values = as_numpy(pc.cast(array, pa.int64())).astype(np.float64) / _PER_SECOND[kind.unit]
        elif pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
            values = as_numpy(pc.cast(array, pa.float64()))
        elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
            values = self._text(pc.utf8_trim_whitespace(array))
        else:
            values = self.python(array.to_pylist())  # imports pandas: rare types only
        bad = np.flatnonzero(~np.isfinite(values))
        if len(bad):
            raise Fault(int(bad[0]), "time_col", self.why(array[int(bad[0])].as_py()))
        return values

    def _text(self, array: pa.Array) -> np.ndarray:
        if self.kind in (None, "unix"):
            try:
                values = as_numpy(pc.cast(array, pa.float64()))
                self.kind = "unix"
                return values
            except pa.ArrowInvalid:
                if self.kind == "unix":
                    return self.python(array.to_pylist())
        for unit in (pa.timestamp("us"), pa.timestamp("us", "UTC")):  # zone-less, then with zones
            try:
                values = as_numpy(pc.cast(self._arrow_time(array, unit), pa.int64())) / 1e6
                self.kind = self.kind or "iso"
                return values
            except pa.ArrowInvalid:
                continue
        return self.python(array.to_pylist())  # mixed forms: each value on its own, or the first bad one

    def _arrow_time(self, array: pa.Array, unit: pa.DataType) -> pa.Array:
        if self.pattern is None:
            return pc.cast(array, unit)
        parsed = pc.strptime(array, format=self.pattern, unit="us", error_is_null=True)
        if parsed.null_count:
            raise pa.ArrowInvalid("a time does not match the pattern")
        return parsed

    def python(self, values: list) -> np.ndarray:
        """Each value parsed on its own (the csv scan and rare types); raises `Fault` at the first bad one."""
        out = np.empty(len(values), dtype=np.float64)
        for k, value in enumerate(values):
            try:
                out[k] = self.parse(value)
            except ValueError as e:
                raise Fault(k, "time_col", str(e)) from None
        return out

    def parse(self, value: object) -> float:
        """One time as seconds; ValueError says why it is not one."""
        text = str(value).strip() if value is not None else ""
        if self.kind in (None, "unix"):
            number = _float(text)
            if math.isfinite(number) or self.kind == "unix" or not text:
                if not math.isfinite(number):
                    raise ValueError(self.why(value))
                self.kind = "unix"
                return number
        try:
            moment = datetime.fromisoformat(text) if self.pattern is None else datetime.strptime(text, self.pattern)
        except ValueError:
            raise ValueError(self.why(value)) from None
        self.kind = self.kind or "iso"
        return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()

    def why(self, value: object) -> str:
        if self.kind == "pattern":
            return f"timestamp {value!r} does not match time_format {self.pattern!r}; fix the value or the pattern"
        if self.kind == "iso":
            return (f"timestamp {value!r} is not an ISO-8601 date or time ({ISO_EXAMPLES}), as the file's "
                    "earlier ones are; fix the value, or set time_format to its strptime pattern")
        return (f"timestamp {value!r} is not a finite number; timestamps must be numeric (e.g. Unix seconds) "
                f"or ISO-8601 dates and times throughout ({ISO_EXAMPLES}); set time_format for another form")


def as_ids(array: pa.Array, role: str = "user_col") -> pa.Array:
    """Ids as strings, as `str(value)` would write them (integers cast in arrow, rarer types in Python)."""
    kind = array.type
    if pa.types.is_dictionary(kind):
        return as_ids(pc.cast(array, kind.value_type), role)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return array
    if pa.types.is_integer(kind):
        return pc.cast(array, pa.string())
    try:
        return pa.array([str(v) for v in array.to_pylist()], pa.string())  # imports pandas: rare types only
    except pa.ArrowException as e:
        raise Fault(0, role, f"its ids cannot be read as text ({e}); store ids as strings or integers") from e


def convert(batch: pa.RecordBatch, plan: ColumnPlan, times: TimeParser, trim: bool, drop_blank: bool = False) -> Chunk:
    """The batch's ids, seconds and filter cells; `trim`: strip the spaces around text ids (delimited text);
    `drop_blank`: rows with an empty user id are blank lines (the tolerant CSV pass), not faults."""
    for column in plan.empty:
        lengths = as_numpy(pc.binary_length(batch.column(column)))
        if lengths.any():
            raise Fault(int(np.flatnonzero(lengths)[0]), "user_col", "expected 'user::item::rating::timestamp'")
    ids = [as_ids(batch.column(plan.columns[role]), role) for role in ("user_col", "item_col")]
    ids = [pc.utf8_trim_whitespace(column) for column in ids] if trim else ids
    if drop_blank:
        keep = np.flatnonzero(as_numpy(pc.binary_length(ids[0])) > 0)
        if len(keep) < batch.num_rows:
            index = as_arrow(keep.astype(np.int64))
            batch, ids = batch.take(index), [i.take(index) for i in ids]
    for role, column in zip(("user_col", "item_col"), ids, strict=True):
        empty = np.flatnonzero(as_numpy(pc.binary_length(column)) == 0)
        if len(empty):
            raise Fault(int(empty[0]), role, "empty id; every row needs a user and an item")
    cells = {role: batch.column(column) for role, column in plan.columns.items()}
    seconds = times.seconds(cells["time_col"]) if "time_col" in cells else None
    return Chunk(ids[0], ids[1], seconds, cells.get("filter"))


def _float(value: object) -> float:
    try:
        return float(str(value).strip())
    except ValueError:
        return math.nan


def cell_number(value: object) -> float:
    """A filter cell as a number; ValueError names what is wrong."""
    if not math.isfinite(number := _float(value)):
        raise ValueError(f"value {value!r} is not a number, which the filter compares")
    return number


def keep_rows(rule: ColumnFilter, cells: pa.Array) -> np.ndarray:
    """(B,) bool: the rows whose cell passes `rule`; raises `Fault` at a cell a numeric rule cannot read."""
    if rule.numeric:
        values = _numbers(cells)
        if rule.op in ("in", "not in"):
            return np.isin(values, np.array(rule.values, dtype=np.float64), invert=rule.op == "not in")
        return _COMPARE[rule.op](values, float(rule.value))
    encoded = pc.dictionary_encode(pc.utf8_trim_whitespace(as_ids(cells, "filter")))
    distinct = encoded.dictionary.to_pylist()  # few: decided in Python, then spread by the indices
    texts = {str(v) for v in rule.values}
    passes = np.array([(v in texts) != (rule.op in ("!=", "not in")) for v in distinct], dtype=bool)
    return passes[as_numpy(pc.cast(encoded.indices, pa.int32()))] if len(distinct) else np.zeros(len(cells), bool)


def _numbers(cells: pa.Array) -> np.ndarray:
    kind, values = cells.type, None
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        with suppress(pa.ArrowInvalid):
            values = as_numpy(pc.cast(pc.utf8_trim_whitespace(cells), pa.float64()))
    elif pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        values = as_numpy(pc.cast(cells, pa.float64()))
    if values is None:
        values = np.array([_float(v) for v in cells.to_pylist()], dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(values))
    if len(bad):
        raise Fault(int(bad[0]), "filter", f"value {cells[int(bad[0])].as_py()!r} is not a number, "
                                           "which the filter compares")
    return values


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
    log.info("%s: %d-core: kept %d of %d events, %d of %d users, %d items (%d rounds)", path, k, kept.num_interactions,
             inter.num_interactions, len(kept.users), len(inter.users), len(np.unique(kept.codes)), rounds)
    return kept
