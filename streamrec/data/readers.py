"""Reading interaction logs: CSV, TSV, Parquet, SASRec "user item" lines, one line per user, or a folder of them.

`read_interactions` reads a log into columnar `Interactions` (streamrec.data.interactions). The work is
done by pyarrow: CSV/TSV is streamed in 256 KiB blocks (`pyarrow.csv.open_csv`, which reads up to 32
blocks ahead), Parquet in record batches, text formats split per block with arrow's string kernels.
Each block goes to `InteractionsBuilder` (streamrec.data.columnar), which dictionary-encodes the ids to
int32 a group at a time and groups them by user, so the log's id strings are never all held at
once. Equal timestamps keep file order. Importing this module does not import torch.

User mistakes (missing file or column, empty file, bad timestamp, malformed line, unreadable
Parquet) raise a one-line ValueError/FileNotFoundError naming the file, line/row or column and the
fix. Arrow's own errors name no line, so when arrow rejects a CSV/TSV block (or it holds an empty
id or a non-finite time) `_scan_delimited` re-reads the file with the csv module only to say
which line is wrong; a file it finds no fault in (e.g. a quoted newline inside an id) is read again
with arrow's tolerant options.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from core.runtime.errors import InputError, check_text_file
from streamrec.data.columnar import InteractionsBuilder, as_arrow, as_numpy
from streamrec.data.interactions import Interactions

Format = Literal["auto", "csv", "tsv", "parquet", "sasrec", "lines"]
_FORMATS = ("csv", "tsv", "parquet", "sasrec", "lines")
_SUFFIXES = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".parquet": "parquet", ".pq": "parquet",
             ".txt": "lines", ".dat": "lines"}
_BLOCK = 1 << 18  # bytes per CSV/text block: arrow's CSV reader reads up to 32 blocks ahead
_TOLERANT_BLOCK = 16 << 20  # the rare second CSV pass: room for long quoted fields
_PARQUET_BATCH = 1 << 16  # rows per Parquet record batch

# One parsed block: user ids, item ids (arrow strings), timestamps (float64) or None.
Chunk = tuple[pa.Array, pa.Array, "np.ndarray | None"]


def _existing_path(path: str | Path) -> Path:
    path = Path(path)
    if not (path.is_file() or path.is_dir()):
        raise FileNotFoundError(f"interactions file {str(path)!r} does not exist; check `path`")
    return path


def _folder_files(path: Path) -> list[Path]:
    """The files of a folder log, in name order (hidden and `_`-prefixed files, e.g. Spark's _SUCCESS, skipped)."""
    files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith((".", "_")))
    if not files:
        raise InputError(f"{path}: the folder holds no files; pass a log file or a folder of log files")
    return files


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


def _header(path: Path, delimiter: str, cols: dict[str, str | None]) -> tuple[list[str], dict[str, int]]:
    # utf-8-sig drops the byte-order mark that spreadsheet exports put before the header.
    with path.open(newline="", encoding="utf-8-sig") as f:
        header = [h.strip() for h in next(csv.reader(f, delimiter=delimiter), [])]
    if not any(header):
        raise InputError(f"{path}: the file is empty; expected a header row such as "
                         f"{delimiter.join(c for c in cols.values() if c)} and one row per event")
    return header, _column_index(path, header, cols)


def _blank_row_handler(delimiter: str) -> Callable[[object], str]:
    """Arrow's handler for rows with a wrong field count: skip blank ones (as the csv module reader did)."""
    def handle(row) -> str:
        fields = next(csv.reader([row.text], delimiter=delimiter), [])
        return "skip" if not any(v.strip() for v in fields) else "error"
    return handle


class _Suspect(Exception):
    """A block holds an empty id or a missing/non-finite time: let the csv scan say where."""


def _arrow_delimited(path: Path, delimiter: str, width: int, idx: dict[str, int], tolerant: bool) -> Iterator[Chunk]:
    names = [f"c{i}" for i in range(width)]
    user, item = names[idx["user_col"]], names[idx["item_col"]]
    time = names[idx["time_col"]] if "time_col" in idx else None
    types = {user: pa.string(), item: pa.string()} | ({time: pa.string() if tolerant else pa.float64()} if time else {})
    reader = pa_csv.open_csv(
        path, read_options=pa_csv.ReadOptions(column_names=names, skip_rows=1,
                                              block_size=_TOLERANT_BLOCK if tolerant else _BLOCK),
        parse_options=pa_csv.ParseOptions(delimiter=delimiter, newlines_in_values=tolerant,
                                          invalid_row_handler=_blank_row_handler(delimiter)),
        convert_options=pa_csv.ConvertOptions(include_columns=list(types), column_types=types,
                                              strings_can_be_null=False))
    for batch in reader:
        users, items = (pc.utf8_trim_whitespace(batch.column(c)) for c in (user, item))
        empty = as_numpy(pc.binary_length(users)) == 0  # numpy, not arrow's to_numpy: see `as_numpy`
        if tolerant:  # the scan found no fault, so a row with an empty id is a blank row
            keep = as_arrow(np.flatnonzero(~empty))
            batch, users, items = batch.take(keep), users.take(keep), items.take(keep)
        elif empty.any() or (as_numpy(pc.binary_length(items)) == 0).any():
            raise _Suspect
        times = None
        if time is not None:
            column = batch.column(time)
            if column.null_count:
                raise _Suspect
            times = np.array([float(v) for v in column.to_pylist()]) if tolerant else as_numpy(column)
            if not np.isfinite(times).all():
                raise _Suspect
        yield users, items, times


def _scan_delimited(path: Path, delimiter: str, header: list[str], idx: dict[str, int],
                    cols: dict[str, str | None]) -> None:
    """Read the file with the csv module only to raise the first fault with its line number."""
    with path.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f, delimiter=delimiter)
        next(reader, None)
        for row in reader:
            if not row or not any(v.strip() for v in row):
                continue  # blank line
            where = f"{path} line {reader.line_num}"
            if len(row) != len(header):
                raise InputError(f"{where}: {len(row)} fields but the header has {len(header)}; "
                                 f"fix the row (is the delimiter {delimiter!r} right?)")
            for arg in ("user_col", "item_col"):
                if not row[idx[arg]].strip():
                    raise InputError(f"{where}, column {cols[arg]!r}: empty id; every row needs a user and an item")
            if "time_col" in idx:
                _parse_time(row[idx["time_col"]], where, cols["time_col"])


def _read_delimited(path: Path, fmt: str, cols: dict[str, str | None], builder: InteractionsBuilder) -> None:
    delimiter = "," if fmt == "csv" else "\t"
    header, idx = _header(path, delimiter, cols)
    with path.open("rb") as f:
        head = f.read(_SNIFF_BYTES)
    builder.expect(int(path.stat().st_size * (head.count(b"\n") + 1) / max(len(head), 1) * 1.05))  # rows, about
    start = builder.mark()
    try:
        for chunk in _arrow_delimited(path, delimiter, len(header), idx, tolerant=False):
            builder.add(*chunk)
        return
    except (pa.ArrowException, _Suspect):
        builder.rollback(start)  # the blocks before the fault are read again below
        _scan_delimited(path, delimiter, header, idx, cols)
    try:
        for chunk in _arrow_delimited(path, delimiter, len(header), idx, tolerant=True):
            builder.add(*chunk)
    except (pa.ArrowException, ValueError, _Suspect) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputError(f"{path}: not a readable {fmt.upper()} file ({reason}); check the file and `format`") from e


def _as_ids(array: pa.Array) -> pa.Array:
    """Ids as strings, as `str(value)` would write them (integers cast in arrow, rarer types in Python)."""
    kind = array.type
    if pa.types.is_dictionary(kind):
        return _as_ids(pc.cast(array, kind.value_type))
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return array
    if pa.types.is_integer(kind):
        return pc.cast(array, pa.string())
    return pa.array([str(v) for v in array.to_pylist()], pa.string())  # imports pandas: rare types only


def _as_seconds(path: Path, array: pa.Array, col: str, first_row: int) -> np.ndarray:
    """Unix seconds as float64; `first_row` (0-based) numbers the rows in errors."""
    kind = array.type
    if pa.types.is_date(kind):
        array, kind = pc.cast(array, pa.timestamp("s")), pa.timestamp("s")
    if pa.types.is_timestamp(kind):  # Unix seconds, whatever unit the file stores
        per_second = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}[kind.unit]
        values = as_numpy(pc.cast(array, pa.int64())).astype(np.float64) / per_second
    elif pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        values = as_numpy(pc.cast(array, pa.float64()))
    else:
        return np.array([_parse_time(v, f"{path} row {first_row + i + 1}", col)
                         for i, v in enumerate(array.to_pylist())], dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(values))
    if len(bad):
        _parse_time(float(values[bad[0]]), f"{path} row {first_row + bad[0] + 1}", col)
    return values


def _parquet_batches(path: Path, cols: dict[str, str | None], builder: InteractionsBuilder,
                     ) -> Iterator[pa.RecordBatch]:
    """The file's record batches; a file arrow cannot read (at open or mid-way) is a one-line error."""
    try:
        with pq.ParquetFile(path) as file:
            for arg, col in cols.items():
                if col is not None and col not in file.schema_arrow.names:
                    raise _missing_column(path, arg, col, file.schema_arrow.names)
            if file.metadata.num_rows == 0:
                raise InputError(f"{path}: the file has no rows; it must hold one row per (user, item) event")
            builder.expect(file.metadata.num_rows)
            yield from file.iter_batches(batch_size=_PARQUET_BATCH, columns=[c for c in cols.values() if c])
    except (pa.ArrowException, OSError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputError(f"{path}: cannot read it as Parquet ({reason}); check the file, "
                         "or pass format='csv'/'tsv' if it is text") from e


def _read_parquet(path: Path, cols: dict[str, str | None], builder: InteractionsBuilder) -> Iterator[Chunk]:
    columns = [c for c in cols.values() if c is not None]
    first_row = 0
    for batch in _parquet_batches(path, cols, builder):
        for col in columns:
            if batch.column(col).null_count:
                row = first_row + pc.index(pc.is_null(batch.column(col)), True).as_py()
                raise InputError(f"{path} row {row + 1}, column {col!r}: missing value; "
                                 "every row needs a user, an item and a timestamp")
        try:
            users, items = (_as_ids(batch.column(cols[a])) for a in ("user_col", "item_col"))
        except pa.ArrowException as e:
            raise InputError(f"{path}: its ids cannot be read as text ({e}); store ids as strings or integers") from e
        time_col = cols["time_col"]
        times = None if time_col is None else _as_seconds(path, batch.column(time_col), time_col, first_row)
        yield users, items, times
        first_row += batch.num_rows


def _text_blocks(path: Path) -> Iterator[tuple[int, str]]:
    """(first line number, text) blocks cut after a newline, decoded as UTF-8; a line longer than a block
    (a heavy user's one line) grows its block until the line ends, whatever its length."""
    line, offset = 1, 0
    with path.open("rb") as f:
        rest: list[bytes] = []  # the unfinished line: pieces, joined once (not re-copied per read)
        while True:
            data = f.read(_BLOCK)
            cut = data.rfind(b"\n") + 1
            if data and not cut:
                rest.append(data)
                continue
            block, rest = b"".join([*rest, data[:cut]]), [data[cut:]]
            if not block:
                break
            try:
                text = block.decode("utf-8")
            except UnicodeDecodeError as e:
                raise InputError(f"{path}: not UTF-8 text (byte {offset + e.start}); "
                                 "pass format='parquet' if it is Parquet") from e
            # Python's universal newlines, as reading the file in text mode did: \r\n, \r and \n end a line.
            text = text.replace("\r\n", "\n").replace("\r", "\n").removesuffix("\n")
            yield line, text
            line += text.count("\n") + 1
            offset += len(block)


def _read_text(path: Path, fmt: str) -> Iterator[Chunk]:
    """SASRec ("user item" per line) or one line per user ("user item item ..."), both chronological."""
    for first_line, text in _text_blocks(path):
        data = text.encode()
        block = pa.Array.from_buffers(pa.large_string(), 1, [None, pa.py_buffer(np.array([0, len(data)], np.int64)),
                                                             pa.py_buffer(data)])
        lines = pc.split_pattern(block, "\n").values  # one string per line
        tokens = pc.utf8_split_whitespace(lines)
        words, parent = pc.list_flatten(tokens), as_numpy(pc.list_parent_indices(tokens))
        real = np.flatnonzero(as_numpy(pc.binary_length(words)) > 0)  # runs of whitespace leave empty tokens
        words, parent = words.take(as_arrow(real)), parent[real]
        counts = np.bincount(parent, minlength=len(lines))
        bad = np.flatnonzero(counts != 2) if fmt == "sasrec" else np.flatnonzero(counts == 1)
        bad = bad[counts[bad] > 0]
        if len(bad):
            k, n = int(bad[0]), int(counts[bad[0]])
            if n >= 2:
                raise InputError(f"{path} line {first_line + k}: expected 'user item' (2 fields), got {n}; "
                                 "fix the line, or pass format='lines' for one user per line")
            only = words[int(np.searchsorted(parent, k))].as_py()
            raise InputError(f"{path} line {first_line + k}: expected 'user item [item ...]', got only "
                             f"{only!r}; remove the line or add the user's items")
        first = np.ones(len(parent), dtype=bool)
        first[1:] = parent[1:] != parent[:-1]  # the first word of a line is its user
        heads, rest = np.flatnonzero(first), np.flatnonzero(~first)
        users = words.take(as_arrow(heads[np.cumsum(first)[rest] - 1]))
        yield users, words.take(as_arrow(rest)), None


def read_interactions(
    path: str | Path, format: Format = "auto", user_col: str = "user_id", item_col: str = "item_id",
    time_col: str | None = "timestamp",
) -> Interactions:
    """Read an interaction log into per-user chronological sequences.

    Args:
        path: the log file, or a folder of log files read in name order as one log (e.g. a
            Parquet dataset's part files).
        format: csv, tsv, parquet, sasrec ("user item" per line, already chronological), lines
            ("user item item ..." per line), or auto (by content, see `sniff_format`, then by
            extension; per file in a folder). A forced format that does not fit says which one does.
        user_col: user column of a CSV/TSV/Parquet file.
        item_col: item column of a CSV/TSV/Parquet file.
        time_col: numeric timestamp column; None means the file order is chronological.

    Returns:
        `Interactions`, each user's events sorted by time (ties keep file order).
    """
    if format not in ("auto", *_FORMATS):
        raise InputError(f"`format` must be auto, {', '.join(_FORMATS)}; got {format!r}")
    path = _existing_path(path)
    cols = {"user_col": user_col, "item_col": item_col, "time_col": time_col}
    builder = InteractionsBuilder(path)
    with _malloc_pool():
        for file in _folder_files(path) if path.is_dir() else [path]:
            fmt = _resolve_format(file, format)
            try:
                _read_as(file, fmt, cols, builder)
            except InputError as e:
                hint = _format_hint(file, fmt) if format != "auto" else None
                if hint is None:
                    raise
                raise InputError(f"{e}; {hint}") from e
        return builder.build()


@contextmanager
def _malloc_pool() -> Iterator[None]:
    """Arrow allocates from the C library's malloc while a log is read, then from its default pool again.

    The default (mimalloc) keeps the blocks arrow frees for reuse, so the transient CSV buffers and
    strings stay resident next to the codes (benchmarks/streamrec_ingest.py measures the peak); malloc
    gives them back as they are freed.
    """
    previous = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        yield
    finally:
        pa.set_memory_pool(previous)


def _read_as(path: Path, fmt: str, cols: dict[str, str | None], builder: InteractionsBuilder) -> None:
    if fmt in ("parquet", "sasrec", "lines"):
        if fmt != "parquet":
            check_text_file(path)  # a NUL byte: binary data, which the text readers would take as odd ids
        for chunk in _read_parquet(path, cols, builder) if fmt == "parquet" else _read_text(path, fmt):
            builder.add(*chunk)
        return
    check_text_file(path)
    try:
        _read_delimited(path, fmt, cols, builder)
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text (byte {e.start}); pass format='parquet' if it is Parquet") from e
    except csv.Error as e:  # e.g. a field over csv's size limit (131,072 characters): not an id
        raise InputError(f"{path}: not a readable {fmt.upper()} file ({e}); check the file and `format`") from e
