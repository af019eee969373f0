"""StreamRec data: interaction logs -> item vocabulary -> splits -> padded causal batches.

Pipeline (each step a small public function, the DataModule only chains them):

1. `read_interactions` reads a log (CSV, TSV, Parquet, SASRec "user item" lines, or one
   line per user) into `Interactions`: user -> item ids in chronological order. Ids stay
   strings; equal timestamps keep file order (stable sort).
2. `ItemVocab` maps item ids to 1..N; 0 is padding.
3. `leave_one_out_split` / `temporal_split` cut every user's sequence into a training
   history and evaluation cases (`EvalCase`: a target position in the user's sequence; the
   history is everything before it). A target is never part of any training history.
4. `TrainDataset` + `collate_train` give SASRec-style causal examples: the last max_len+1
   training items, inputs = seq[:-1], targets = seq[1:], both left-padded with 0 (target
   0 = ignore). `EvalDataset` + `collate_eval` give the last max_len history items, the
   held-out target and every item already seen (for filtering).

User mistakes (missing file or column, empty file, bad timestamp, malformed line, unreadable
Parquet) raise a one-line ValueError/FileNotFoundError naming the file, line/row or column
and the fix. Skips (short users, cold-start targets) are counted in the `logging` output.

Legend: B batch, T time (= max_len), L longest seen-item list in the batch, N items.
"""

from __future__ import annotations

import csv
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal, NamedTuple

import lightning as L
import numpy as np
import torch
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from core.errors import InputError, check_text_file
from core.resume import EpochRandomSampler
from streamrec.constants import PAD_ID

log = logging.getLogger(__name__)

Format = Literal["auto", "csv", "tsv", "parquet", "sasrec", "lines"]
SplitName = Literal["leave_one_out", "temporal"]
_FORMATS = ("csv", "tsv", "parquet", "sasrec", "lines")
_SUFFIXES = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".parquet": "parquet", ".pq": "parquet",
             ".txt": "lines", ".dat": "lines"}


# ----------------------------------------------------------------------------- reading


@dataclass
class Interactions:
    """Per-user chronological item sequences, users in order of first appearance.

    Args:
        items: user id -> item ids, oldest first.
        timestamps: user id -> timestamps aligned with `items`; None when the format has none.
    """

    items: dict[str, list[str]]
    timestamps: dict[str, list[float]] | None = None

    @property
    def num_interactions(self) -> int:
        """Total number of (user, item) events."""
        return sum(len(seq) for seq in self.items.values())

    def drop_short_users(self, min_interactions: int) -> Interactions:
        """Users with fewer than `min_interactions` events removed (the count goes to the log)."""
        keep = [u for u, seq in self.items.items() if len(seq) >= min_interactions]
        dropped = len(self.items) - len(keep)
        if dropped:
            log.info("skipped %d of %d users with fewer than %d interactions", dropped, len(self.items),
                     min_interactions)
        times = None if self.timestamps is None else {u: self.timestamps[u] for u in keep}
        return Interactions({u: self.items[u] for u in keep}, times)


class _Grouper:
    """Collects rows in file order and sorts each user's events by time (stable)."""

    def __init__(self, timed: bool):
        self.items: dict[str, list[str]] = {}
        self.times: dict[str, list[float]] | None = {} if timed else None

    def add(self, user: str, item: str, time: float | None = None) -> None:
        self.items.setdefault(user, []).append(item)
        if self.times is not None:
            self.times.setdefault(user, []).append(time)

    def result(self, path: Path) -> Interactions:
        if not self.items:
            raise InputError(f"{path}: no interactions found; the file must hold at least one (user, item) row")
        if self.times is not None:
            for user, times in self.times.items():
                if any(a > b for a, b in zip(times, times[1:], strict=False)):
                    order = sorted(range(len(times)), key=times.__getitem__)  # sorted() is stable
                    self.times[user] = [times[i] for i in order]
                    self.items[user] = [self.items[user][i] for i in order]
        return Interactions(self.items, self.times)


def _existing_file(path: str | Path) -> Path:
    path = Path(path)
    if not path.is_file():
        what = "is a directory, not a file" if path.is_dir() else "does not exist"
        raise FileNotFoundError(f"interactions file {str(path)!r} {what}; check `path`")
    return path


_FORMAT_NAMES = {"csv": "CSV", "tsv": "TSV", "parquet": "Parquet", "sasrec": "SASRec 'user item' lines",
                 "lines": "one line per user ('user item item ...')"}
_SNIFF_BYTES = 1 << 16


def sniff_format(path: Path) -> str | None:
    """What a file's first 64 KiB look like, whatever its name says.

    Parquet by its magic bytes; TSV or CSV when every sampled line splits into the same number
    (at least 2) of fields on that delimiter; "lines" when every line has at least two
    whitespace-separated fields (SASRec's "user item" lines are read the same way); None when
    nothing fits (empty, binary or one field a line).
    """
    with path.open("rb") as f:
        head = f.read(_SNIFF_BYTES)
    if head.startswith(b"PAR1"):
        return "parquet"
    if b"\0" in head:
        return None
    text = head.decode("utf-8", errors="replace").removeprefix("\ufeff")
    rows = text.splitlines()
    if len(head) == _SNIFF_BYTES and len(rows) > 1:
        rows = rows[:-1]  # the last line may be cut off
    rows = [r for r in rows if r.strip()][:50]
    if not rows:
        return None
    for fmt, delimiter in (("tsv", "\t"), ("csv", ",")):
        counts = {len(fields) for fields in csv.reader(rows, delimiter=delimiter)}
        if len(counts) == 1 and counts.pop() >= 2:
            return fmt
    if all(len(r.split()) >= 2 for r in rows):
        return "lines"
    return None


def _resolve_format(path: Path, format: Format) -> str:
    if format != "auto":
        if format not in _FORMATS:
            raise InputError(f"`format` must be auto, {', '.join(_FORMATS)}; got {format!r}")
        return format
    fmt = sniff_format(path) or _SUFFIXES.get(path.suffix.lower())
    if fmt is None:
        raise InputError(f"{path}: cannot tell the format from the content or the extension {path.suffix!r}; "
                         f"pass format= one of {', '.join(_FORMATS)}")
    return fmt


def _format_hint(path: Path, fmt: str) -> str | None:
    """'the file looks like CSV ...' when a forced format failed and the content says another one."""
    sniffed = sniff_format(path)
    if sniffed is None or sniffed == fmt or {fmt, sniffed} <= {"sasrec", "lines"}:
        return None
    return (f"the file looks like {_FORMAT_NAMES[sniffed]}, not {fmt}: set format: {sniffed} or auto "
            f"(on the command line --data.format {sniffed})")


def _parse_time(value: object, where: str, time_col: str) -> float:
    try:
        t = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        t = math.nan
    if not math.isfinite(t):
        raise InputError(f"{where}, column {time_col!r}: timestamp {value!r} is not a finite number; "
                         "timestamps must be numeric (e.g. Unix seconds)")
    return t


def _missing_column(path: Path, arg: str, col: str, found: Sequence[str]) -> InputError:
    return InputError(f"{path}: no column {col!r} (columns: {', '.join(map(str, found)) or 'none'}); "
                      f"rename it in the file or pass {arg}=<your column name>")


def _column_index(path: Path, header: list[str], cols: dict[str, str | None]) -> dict[str, int]:
    """Position of each wanted column in the header; `cols` maps argument name -> column name."""
    index = {}
    for arg, col in cols.items():
        if col is None:
            continue
        if col not in header:
            raise _missing_column(path, arg, col, header)
        index[arg] = header.index(col)
    return index


def _read_delimited(path: Path, delimiter: str, user_col: str, item_col: str, time_col: str | None) -> Interactions:
    # utf-8-sig drops the byte-order mark that spreadsheet exports put before the header.
    with path.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f, delimiter=delimiter)
        header = [h.strip() for h in next(reader, [])]
        if not any(header):
            raise InputError(f"{path}: the file is empty; expected a header row such as "
                             f"{delimiter.join(c for c in (user_col, item_col, time_col) if c)} and one row per event")
        idx = _column_index(path, header, {"user_col": user_col, "item_col": item_col, "time_col": time_col})
        grouper = _Grouper(timed=time_col is not None)
        for row in reader:
            if not row or not any(v.strip() for v in row):
                continue  # blank line
            where = f"{path} line {reader.line_num}"
            if len(row) != len(header):
                raise InputError(f"{where}: {len(row)} fields but the header has {len(header)}; "
                                 f"fix the row (is the delimiter {delimiter!r} right?)")
            user, item = row[idx["user_col"]].strip(), row[idx["item_col"]].strip()
            for col, value in ((user_col, user), (item_col, item)):
                if not value:
                    raise InputError(f"{where}, column {col!r}: empty id; every row needs a user and an item")
            time = _parse_time(row[idx["time_col"]], where, time_col) if time_col is not None else None
            grouper.add(user, item, time)
    return grouper.result(path)


def _read_parquet(path: Path, user_col: str, item_col: str, time_col: str | None) -> Interactions:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
        cols = {"user_col": user_col, "item_col": item_col, "time_col": time_col}
        for arg, col in cols.items():
            if col is not None and col not in schema.names:
                raise _missing_column(path, arg, col, schema.names)
        table = pq.read_table(path, columns=[c for c in cols.values() if c is not None])
    except (pa.ArrowException, OSError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputError(f"{path}: cannot read it as Parquet ({reason}); check the file, "
                         "or pass format='csv'/'tsv' if it is text") from e
    if table.num_rows == 0:
        raise InputError(f"{path}: the file has no rows; it must hold one row per (user, item) event")
    columns = []
    for col in (user_col, item_col, time_col):
        if col is None:
            columns.append([None] * table.num_rows)
            continue
        array = table.column(col)
        if pa.types.is_date(array.type):
            array = pc.cast(array, pa.timestamp("s"))
        if pa.types.is_timestamp(array.type):  # Unix seconds, whatever unit the file stores
            per_second = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}[array.type.unit]
            array = pc.divide(pc.cast(pc.cast(array, pa.int64()), pa.float64()), per_second)
        values = array.to_pylist()
        if None in values:
            raise InputError(f"{path} row {values.index(None) + 1}, column {col!r}: missing value; "
                             "every row needs a user, an item and a timestamp")
        columns.append(values)
    grouper = _Grouper(timed=time_col is not None)
    for i, (user, item, time) in enumerate(zip(*columns, strict=True)):
        if time_col is not None:
            time = _parse_time(time, f"{path} row {i + 1}", time_col)
        grouper.add(str(user), str(item), time)
    return grouper.result(path)


def _read_text(path: Path, fmt: str) -> Interactions:
    """SASRec ("user item" per line) or one line per user ("user item item ..."), both chronological."""
    grouper = _Grouper(timed=False)
    try:
        with path.open(encoding="utf-8") as f:
            for line_num, line in enumerate(f, start=1):
                fields = line.split()
                if not fields:
                    continue
                if fmt == "sasrec" and len(fields) != 2:
                    raise InputError(f"{path} line {line_num}: expected 'user item' (2 fields), got {len(fields)}; "
                                     "fix the line, or pass format='lines' for one user per line")
                if len(fields) < 2:
                    raise InputError(f"{path} line {line_num}: expected 'user item [item ...]', got only "
                                     f"{fields[0]!r}; remove the line or add the user's items")
                for item in fields[1:]:
                    grouper.add(fields[0], item)
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text (byte {e.start}); pass format='parquet' if it is Parquet") from e
    return grouper.result(path)


def read_interactions(
    path: str | Path, format: Format = "auto", user_col: str = "user_id", item_col: str = "item_id",
    time_col: str | None = "timestamp",
) -> Interactions:
    """Read an interaction log into per-user chronological sequences.

    Args:
        path: the log file.
        format: csv, tsv, parquet, sasrec ("user item" per line, already chronological), lines
            ("user item item ..." per line), or auto (by content, see `sniff_format`, then by
            extension). A forced format that does not fit says which one does.
        user_col: user column of a CSV/TSV/Parquet file.
        item_col: item column of a CSV/TSV/Parquet file.
        time_col: numeric timestamp column; None means the file order is chronological.

    Returns:
        `Interactions`, ids as strings, each user's events sorted by time (ties keep file order).
    """
    path = _existing_file(path)
    fmt = _resolve_format(path, format)
    try:
        return _read_as(path, fmt, user_col, item_col, time_col)
    except InputError as e:
        hint = _format_hint(path, fmt) if format != "auto" else None
        if hint is None:
            raise
        raise InputError(f"{e}; {hint}") from e


def _read_as(path: Path, fmt: str, user_col: str, item_col: str, time_col: str | None) -> Interactions:
    if fmt == "parquet":
        return _read_parquet(path, user_col, item_col, time_col)
    check_text_file(path)  # a NUL byte: binary data, which the text readers would take as odd ids
    if fmt in ("sasrec", "lines"):
        return _read_text(path, fmt)
    try:
        return _read_delimited(path, "," if fmt == "csv" else "\t", user_col, item_col, time_col)
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text (byte {e.start}); pass format='parquet' if it is Parquet") from e
    except csv.Error as e:  # e.g. a field over csv's size limit (131,072 characters): not an id
        raise InputError(f"{path}: not a readable {fmt.upper()} file ({e}); check the file and `format`") from e


# ----------------------------------------------------------------------------- vocabulary


def _sort_key(ids: Sequence[str]) -> Callable[[str], object]:
    # Numeric ids sort as numbers, so a SASRec file whose items are 1..N keeps its ids.
    if all(i.isascii() and i.isdecimal() for i in ids):
        return lambda i: (int(i), i)
    return lambda i: i


class ItemVocab:
    """Original item ids (strings) <-> model ids 1..N; 0 is padding.

    Args:
        items: the original ids; items[k] gets model id k + 1.
    """

    pad_id = PAD_ID

    def __init__(self, items: Sequence[str]):
        self.items = [str(i) for i in items]
        self.index = {item: k + 1 for k, item in enumerate(self.items)}
        if len(self.index) != len(self.items):
            dup = next(i for i in self.items if self.items.count(i) > 1)
            raise InputError(f"item id {dup!r} appears twice in the vocabulary; ids must be unique")

    @classmethod
    def build(cls, items: Iterable[str]) -> ItemVocab:
        """Vocabulary of the distinct ids, sorted (numerically when every id is a decimal number)."""
        unique = list(dict.fromkeys(items))
        return cls(sorted(unique, key=_sort_key(unique)))

    @property
    def num_items(self) -> int:
        """N, the number of real items (ids 1..N)."""
        return len(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __contains__(self, item: object) -> bool:
        return item in self.index

    def encode(self, items: Iterable[str], skip_unknown: bool = False) -> list[int]:
        """Original ids -> model ids.

        Args:
            items: original item ids.
            skip_unknown: drop ids not in the vocabulary (their count is logged) instead of raising.
        """
        items = list(items)
        unknown = [i for i in items if i not in self.index]
        if unknown and not skip_unknown:
            shown = ", ".join(repr(i) for i in unknown[:5])
            shown += f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
            raise InputError(f"unknown item ids {shown} (vocabulary has {len(self)} items); "
                             "pass skip_unknown=True to drop them")
        if unknown:
            log.warning("skipped %d unknown item ids (e.g. %r)", len(unknown), unknown[0])
        return [self.index[i] for i in items if i in self.index]

    def decode(self, ids: Iterable[int] | Tensor) -> list[str]:
        """Model ids (1..N) -> original ids."""
        ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        bad = [i for i in ids if not 1 <= i <= len(self.items)]
        if bad:
            raise InputError(f"model id {bad[0]} is not an item; ids run 1..{len(self.items)} (0 is padding)")
        return [self.items[i - 1] for i in ids]

    def to_dict(self) -> dict[str, list[str]]:
        """JSON-friendly form for checkpoints; `from_dict` inverts it."""
        return {"items": list(self.items)}

    @classmethod
    def from_dict(cls, state: dict[str, list[str]]) -> ItemVocab:
        """Rebuild a vocabulary saved with `to_dict`."""
        if not isinstance(state, dict) or not isinstance(state.get("items"), list):
            raise InputError("vocabulary state needs an 'items' list; was it written by ItemVocab.to_dict()?")
        return cls(state["items"])


# ----------------------------------------------------------------------------- splits


@dataclass(frozen=True)
class EvalCase:
    """One held-out event: `items[position]` is the target, `items[:position]` the history.

    Args:
        user: the user id.
        items: the user's whole encoded sequence (shared, not copied).
        position: index of the target in `items` (>= 1, so the history is never empty).
    """

    user: str
    items: Sequence[int]
    position: int

    @property
    def target(self) -> int:
        """The held-out item id."""
        return self.items[self.position]

    @property
    def history(self) -> Sequence[int]:
        """Everything the user did before the target, oldest first."""
        return self.items[: self.position]


@dataclass
class Split:
    """Training histories and evaluation cases.

    Args:
        train: user -> training history (encoded, chronological).
        valid: validation cases.
        test: test cases.
    """

    train: dict[str, list[int]]
    valid: list[EvalCase]
    test: list[EvalCase]


def leave_one_out_split(sequences: dict[str, list[int]]) -> Split:
    """Last item = test, second-to-last = validation, the rest = training.

    Users with fewer than 3 items have no held-out item and are used only for training.

    Args:
        sequences: user -> encoded chronological items.
    """
    train, valid, test = {}, [], []
    short = 0
    for user, seq in sequences.items():
        if len(seq) < 3:
            train[user] = list(seq)
            short += 1
            continue
        train[user] = seq[:-2]
        valid.append(EvalCase(user, seq, len(seq) - 2))
        test.append(EvalCase(user, seq, len(seq) - 1))
    if short:
        log.info("%d users with fewer than 3 interactions are used for training only", short)
    return Split(train, valid, test)


def time_quantiles(timestamps: dict[str, list[float]], quantiles: Sequence[float]) -> list[float]:
    """Global timestamp quantiles over all events (e.g. the cutoffs of a temporal split).

    Args:
        timestamps: user -> timestamps.
        quantiles: values in [0, 1].
    """
    if any(not 0.0 <= q <= 1.0 for q in quantiles):
        raise InputError(f"quantiles must lie in [0, 1], got {list(quantiles)}")
    flat = np.fromiter((t for ts in timestamps.values() for t in ts), dtype=np.float64)
    return [float(v) for v in np.quantile(flat, quantiles, method="lower")]


def temporal_split(
    sequences: dict[str, list[int]], timestamps: dict[str, list[float]], valid_cutoff: float, test_cutoff: float,
) -> Split:
    """Global time split: train on events at or before `valid_cutoff`, validate on events in
    (valid_cutoff, test_cutoff], test on events after `test_cutoff`.

    Every later event is a target whose history is everything the user did before it. A
    target with no earlier event (a user first seen after the cutoff) cannot be scored by a
    sequential model; those are skipped and counted in the log.

    Args:
        sequences: user -> encoded chronological items.
        timestamps: user -> timestamps aligned with `sequences`.
        valid_cutoff: last training timestamp.
        test_cutoff: last validation timestamp (>= valid_cutoff).
    """
    if valid_cutoff > test_cutoff:
        raise InputError(f"valid cutoff ({valid_cutoff}) must not exceed the test cutoff ({test_cutoff})")
    train, valid, test = {}, [], []
    cold = 0
    for user, seq in sequences.items():
        times = timestamps[user]
        n_train = sum(t <= valid_cutoff for t in times)  # times are sorted
        if n_train:
            train[user] = seq[:n_train]
        for pos in range(n_train, len(seq)):
            if pos == 0:
                cold += 1
                continue
            (valid if times[pos] <= test_cutoff else test).append(EvalCase(user, seq, pos))
    if cold:
        log.info("skipped %d evaluation targets of users with no earlier interaction (cold start)", cold)
    return Split(train, valid, test)


# ----------------------------------------------------------------------------- examples and batches


def training_windows(history: Sequence[int], max_len: int, sliding_window: bool = False) -> list[list[int]]:
    """Cut a training history into windows of at most max_len + 1 items (max_len next-item pairs).

    By default only the last window is kept, as SASRec does. With `sliding_window` the windows
    step back by max_len and overlap by one item, so every transition is a target exactly once.

    Args:
        history: encoded chronological items.
        max_len: model context length T.
        sliding_window: also cover the older part of long histories.
    """
    windows = []
    end = len(history)
    while end >= 2:
        windows.append(list(history[max(0, end - max_len - 1) : end]))
        if not sliding_window:
            break
        end -= max_len
    return windows[::-1]


def _left_pad(ids: Sequence[int], length: int) -> list[int]:
    return [PAD_ID] * (length - len(ids)) + list(ids)


class TrainBatch(NamedTuple):
    """Causal next-item batch.

    Args:
        inputs: (B, T) item ids, left-padded with 0.
        targets: (B, T) the item after each input position; 0 = ignore.
    """

    inputs: Tensor
    targets: Tensor


class EvalBatch(NamedTuple):
    """Held-out next-item batch.

    Args:
        rows: (B,) row of each case in its `EvalDataset` (maps scores back to users).
        inputs: (B, T) the last T history items, left-padded with 0.
        targets: (B,) the held-out item.
        seen: (B, L) distinct items of the whole history, right-padded with 0.
    """

    rows: Tensor
    inputs: Tensor
    targets: Tensor
    seen: Tensor


class TrainDataset(Dataset):
    """Training windows of every user with at least two training items.

    Args:
        histories: encoded training histories, one per user.
        max_len: model context length T.
        sliding_window: one window per max_len items instead of only the last one.
    """

    def __init__(self, histories: Iterable[Sequence[int]], max_len: int, sliding_window: bool = False):
        self.windows: list[list[int]] = []
        too_short = 0
        for history in histories:
            windows = training_windows(history, max_len, sliding_window)
            too_short += not windows
            self.windows.extend(windows)
        if too_short:
            log.info("%d users have fewer than 2 training interactions and give no training example", too_short)

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i: int) -> list[int]:
        return self.windows[i]


class EvalDataset(Dataset):
    """Evaluation cases, returned with their row index.

    Args:
        cases: the held-out events.
    """

    def __init__(self, cases: Sequence[EvalCase]):
        self.cases = list(cases)

    def __len__(self) -> int:
        return len(self.cases)

    def __getitem__(self, i: int) -> tuple[int, EvalCase]:
        return i, self.cases[i]


def collate_train(windows: Sequence[Sequence[int]], max_len: int) -> TrainBatch:
    """Windows of <= max_len + 1 items -> inputs = w[:-1], targets = w[1:], left-padded to max_len.

    Args:
        windows: from `TrainDataset`.
        max_len: model context length T.
    """
    inputs = [_left_pad(w[:-1][-max_len:], max_len) for w in windows]
    targets = [_left_pad(w[1:][-max_len:], max_len) for w in windows]
    return TrainBatch(torch.tensor(inputs, dtype=torch.long), torch.tensor(targets, dtype=torch.long))


def collate_eval(cases: Sequence[tuple[int, EvalCase]], max_len: int) -> EvalBatch:
    """Cases -> last max_len history items (left-padded), targets, and seen items (right-padded).

    Args:
        cases: (row, case) pairs from `EvalDataset`.
        max_len: model context length T.
    """
    seen = [list(dict.fromkeys(case.history)) for _, case in cases]
    width = max(len(s) for s in seen)
    return EvalBatch(
        rows=torch.tensor([i for i, _ in cases], dtype=torch.long),
        inputs=torch.tensor([_left_pad(case.history[-max_len:], max_len) for _, case in cases], dtype=torch.long),
        targets=torch.tensor([case.target for _, case in cases], dtype=torch.long),
        seen=torch.tensor([s + [PAD_ID] * (width - len(s)) for s in seen], dtype=torch.long),  # (B, L)
    )


class PredictBatch(NamedTuple):
    """Whole histories to recommend after (`predict`).

    Args:
        rows: (B,) position of each user in `user_sequences` order.
        users: the user ids.
        inputs: (B, T) the last T items of the whole history, left-padded with 0.
        seen: (B, L) distinct items of the whole history, right-padded with 0.
    """

    rows: Tensor
    users: list[str]
    inputs: Tensor
    seen: Tensor


def user_sequences(split: Split) -> dict[str, Sequence[int]]:
    """Every user's whole encoded sequence (training part and held-out items), in input order."""
    sequences: dict[str, Sequence[int]] = dict(split.train)
    for case in (*split.valid, *split.test):
        sequences[case.user] = case.items  # a case holds the whole sequence
    return sequences


def collate_predict(rows: Sequence[tuple[int, tuple[str, Sequence[int]]]], max_len: int) -> PredictBatch:
    """(row, (user, sequence)) pairs -> the last max_len items (left-padded) and the seen items (right-padded).

    Args:
        rows: from `StreamRecDataModule.predict_dataloader`'s dataset.
        max_len: model context length T.
    """
    seen = [list(dict.fromkeys(seq)) for _, (_, seq) in rows]
    width = max(len(s) for s in seen)
    return PredictBatch(
        rows=torch.tensor([i for i, _ in rows], dtype=torch.long),
        users=[user for _, (user, _) in rows],
        inputs=torch.tensor([_left_pad(seq[-max_len:], max_len) for _, (_, seq) in rows], dtype=torch.long),
        seen=torch.tensor([s + [PAD_ID] * (width - len(s)) for s in seen], dtype=torch.long),  # (B, L)
    )


def item_counts(histories: Iterable[Sequence[int]], num_items: int) -> Tensor:
    """How often each item occurs in the histories, (N + 1,) int64 with 0 at padding.

    Args:
        histories: encoded item sequences.
        num_items: N.
    """
    flat = [i for h in histories for i in h]
    return torch.bincount(torch.tensor(flat, dtype=torch.long), minlength=num_items + 1)[: num_items + 1]


# ----------------------------------------------------------------------------- data module


class StreamRecDataModule(L.LightningDataModule):
    """Reads a log, builds the item vocabulary and split, and serves causal batches.

    The file is read on first use of `num_items`, `vocab`, `splits` or `setup()`, so
    `LightningCLI.link_arguments("data.num_items", "model.num_items", apply_on="instantiate")`
    works right after construction.

    Args:
        path: interaction log (CSV/TSV/Parquet with user, item, timestamp columns; SASRec
            "user item" lines; or one line per user "user item item ...").
        format: auto (by content, then extension), csv, tsv, parquet, sasrec or lines.
        max_len: model context length: the last max_len items are the input.
        batch_size: examples per batch (training and evaluation).
        split: leave_one_out (last item test, second-to-last validation) or temporal (global
            time cutoffs; needs timestamps).
        min_interactions: users with fewer events are dropped before anything else.
        user_col: user column name.
        item_col: item column name.
        time_col: timestamp column name; None means the file order is chronological.
        sliding_window: train on every max_len-window of long histories, not only the last.
        temporal_cutoffs: (valid, test) timestamps for split=temporal; None uses `temporal_quantiles`.
        temporal_quantiles: (valid, test) quantiles of all timestamps used when no cutoffs are given.
        num_workers: DataLoader worker processes.
    """

    def __init__(
        self, path: str, format: Format = "auto", max_len: int = 50, batch_size: int = 128,
        split: SplitName = "leave_one_out", min_interactions: int = 2, user_col: str = "user_id",
        item_col: str = "item_id", time_col: str | None = "timestamp", sliding_window: bool = False,
        temporal_cutoffs: tuple[float, float] | None = None, temporal_quantiles: tuple[float, float] = (0.8, 0.9),
        num_workers: int = 0,
    ):
        super().__init__()
        for name, value, low in (("max_len", max_len, 1), ("batch_size", batch_size, 1),
                                 ("min_interactions", min_interactions, 1), ("num_workers", num_workers, 0)):
            if value < low:
                raise InputError(f"`{name}` must be at least {low}, got {value}")
        if split not in ("leave_one_out", "temporal"):
            raise InputError(f"`split` must be leave_one_out or temporal, got {split!r}")
        _existing_file(path)  # fail at construction, not at the first batch
        self.save_hyperparameters()
        self.path, self.format, self.max_len, self.batch_size = path, format, max_len, batch_size
        self.split_name, self.min_interactions = split, min_interactions
        self.columns = {"user_col": user_col, "item_col": item_col, "time_col": time_col}
        self.sliding_window, self.num_workers = sliding_window, num_workers
        self.temporal_cutoffs, self.temporal_quantiles = temporal_cutoffs, temporal_quantiles
        self._vocab: ItemVocab | None = None
        self._split: Split | None = None

    def _load(self) -> None:
        if self._split is not None:
            return
        raw = read_interactions(self.path, self.format, **self.columns)
        kept = raw.drop_short_users(self.min_interactions)
        if not kept.items:
            raise InputError(f"{self.path}: no user has {self.min_interactions} or more interactions; "
                             "lower `min_interactions`")
        vocab = ItemVocab.build(i for seq in kept.items.values() for i in seq)
        sequences = {u: [vocab.index[i] for i in seq] for u, seq in kept.items.items()}
        log.info("%s: %d interactions, %d users, %d items", self.path, kept.num_interactions, len(sequences),
                 len(vocab))
        self._vocab, self._split = vocab, self._make_split(sequences, kept.timestamps)

    def _make_split(self, sequences: dict[str, list[int]], timestamps: dict[str, list[float]] | None) -> Split:
        if self.split_name == "leave_one_out":
            return leave_one_out_split(sequences)
        if timestamps is None:
            raise InputError(f"{self.path}: split='temporal' needs timestamps, but this file has none; "
                             "use split='leave_one_out' or a CSV/TSV/Parquet file with a time column")
        cutoffs = self.temporal_cutoffs or tuple(time_quantiles(timestamps, self.temporal_quantiles))
        log.info("temporal split: train <= %s < valid <= %s < test", *cutoffs)
        return temporal_split(sequences, timestamps, *cutoffs)

    @property
    def vocab(self) -> ItemVocab:
        """The item vocabulary (reads the file on first use)."""
        self._load()
        return self._vocab

    @property
    def num_items(self) -> int:
        """N, the number of items; the model's item table has N + 1 rows (0 = padding)."""
        return self.vocab.num_items

    @property
    def splits(self) -> Split:
        """Training histories and evaluation cases (reads the file on first use)."""
        self._load()
        return self._split

    def train_item_counts(self) -> Tensor:
        """(N + 1,) occurrences of each item in the training histories (for a popularity baseline)."""
        return item_counts(self.splits.train.values(), self.num_items)

    def setup(self, stage: str | None = None) -> None:
        """Read the file (once) and build the datasets."""
        self._load()
        self.train_set = TrainDataset(self.splits.train.values(), self.max_len, self.sliding_window)
        self.valid_set = EvalDataset(self.splits.valid)
        self.test_set = EvalDataset(self.splits.test)
        log.info("%d training windows, %d validation and %d test cases", len(self.train_set), len(self.valid_set),
                 len(self.test_set))

    def state_dict(self) -> dict[str, dict[str, list[str]]]:
        """The vocabulary, saved by Lightning in every checkpoint."""
        return {"vocab": self.vocab.to_dict()}

    def load_state_dict(self, state_dict: dict[str, dict[str, list[str]]]) -> None:
        """Refuse to resume on data whose item ids map differently from the checkpoint's."""
        saved = ItemVocab.from_dict(state_dict["vocab"])
        if saved.items != self.vocab.items:
            raise InputError(f"{self.path}: its {len(self.vocab)} items map to different ids than the checkpoint's "
                             f"{len(saved)}; resume with the data file the checkpoint was trained on")

    def _loader(self, dataset: Dataset, collate: Callable, shuffle: bool) -> DataLoader:
        # Shuffled from (seed, epoch), and a generator of the loader's own: fetching data draws nothing from
        # the global generator, so a run resumed from a checkpoint replays the same batches (core.resume).
        seed = torch.initial_seed() % 2**31  # seed_everything's seed
        return DataLoader(dataset, batch_size=self.batch_size, sampler=EpochRandomSampler(dataset, seed) if shuffle
                          else None, num_workers=self.num_workers, collate_fn=partial(collate, max_len=self.max_len),
                          persistent_workers=self.num_workers > 0, generator=torch.Generator().manual_seed(seed))

    def _eval_loader(self, dataset: Dataset) -> DataLoader:
        # Under DDP, Lightning's default sampler pads ranks with repeated cases, which would
        # count some users twice; this one splits the cases without repeats (metric states are
        # summed across ranks, so uneven shares are fine).
        sampler = None
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            sampler = UnrepeatedDistributedSampler(dataset, shuffle=False)
        return DataLoader(dataset, batch_size=self.batch_size, sampler=sampler, num_workers=self.num_workers,
                          collate_fn=partial(collate_eval, max_len=self.max_len),
                          persistent_workers=self.num_workers > 0)

    def train_dataloader(self) -> DataLoader:
        """Shuffled `TrainBatch`es."""
        return self._loader(self.train_set, collate_train, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        """`EvalBatch`es of the validation cases, in order."""
        return self._eval_loader(self.valid_set)

    def test_dataloader(self) -> DataLoader:
        """`EvalBatch`es of the test cases, in order."""
        return self._eval_loader(self.test_set)

    def predict_dataloader(self) -> DataLoader:
        """`PredictBatch`es of every user's whole sequence, in input order (Lightning shards them under DDP)."""
        rows = list(enumerate(user_sequences(self.splits).items()))
        return DataLoader(rows, batch_size=self.batch_size, num_workers=self.num_workers,
                          collate_fn=partial(collate_predict, max_len=self.max_len),
                          persistent_workers=self.num_workers > 0)
