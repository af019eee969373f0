"""Reading interaction logs: CSV, TSV, Parquet, SASRec "user item" lines, or one line per user.

`read_interactions` reads a log into `Interactions`: user -> item ids in chronological order.
Ids stay strings; equal timestamps keep file order (stable sort). User mistakes (missing file or
column, empty file, bad timestamp, malformed line, unreadable Parquet) raise a one-line
ValueError/FileNotFoundError naming the file, line/row or column and the fix.
"""

from __future__ import annotations

import csv
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from core.errors import InputError, check_text_file

log = logging.getLogger(__name__)

Format = Literal["auto", "csv", "tsv", "parquet", "sasrec", "lines"]
_FORMATS = ("csv", "tsv", "parquet", "sasrec", "lines")
_SUFFIXES = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".parquet": "parquet", ".pq": "parquet",
             ".txt": "lines", ".dat": "lines"}



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

