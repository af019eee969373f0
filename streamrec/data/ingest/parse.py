"""Steps 1 and 2 of reading a log: what each file is (`Layout`), then the file parsed by pyarrow itself.

`format: auto` looks at a file's first 64 KiB, then at its name. A delimiter the content shows but the options do not
name (';', '|') is an error naming the option, not a guess: a ';' file read as CSV gives wrong columns. Importing this
module does not import torch."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from core.runtime.errors import InputError
from streamrec.data.ingest.arrays import as_arrow, as_numpy
from streamrec.data.ingest.columns import ColumnPlan, plan_columns
from streamrec.data.ingest.options import FORMATS, ReadOptions

BLOCK = 1 << 18  # bytes per CSV/text block: arrow's CSV reader reads up to 32 blocks ahead
TOLERANT_BLOCK = 16 << 20  # the rare second CSV pass: room for long quoted fields
PARQUET_BATCH = 1 << 16  # rows per Parquet record batch
SNIFF_BYTES = 1 << 16
_SUFFIXES = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".parquet": "parquet", ".pq": "parquet",
             ".txt": "lines", ".dat": "lines"}
FORMAT_NAMES = {"csv": "CSV", "tsv": "TSV", "parquet": "Parquet", "sasrec": "SASRec 'user item' lines",
                "lines": "one line per user ('user item item ...')",
                "movielens": "MovieLens ratings ('user::item::rating::timestamp')"}
MOVIELENS_COLUMNS = ("user_id", "item_id", "rating", "timestamp")
_OTHER_DELIMITERS = (";", "|")


@dataclass(frozen=True)
class Layout:
    """How one file is parsed: MovieLens' '::' is read as ':' with every other field empty; `delimiter` is None
    for Parquet and the line formats; `names` are those of a file without header (None: header or positions)."""

    format: str
    delimiter: str | None = None
    header: bool = True
    names: tuple[str, ...] | None = None


def existing_path(path: str | Path) -> Path:
    path = Path(path)
    if not (path.is_file() or path.is_dir()):
        raise FileNotFoundError(f"interactions file {str(path)!r} does not exist; check `path`")
    return path


def log_files(path: Path) -> list[Path]:
    """The file itself, or a folder's files in name order, skipping hidden and `_`-prefixed ones (Spark's _SUCCESS)."""
    if not path.is_dir():
        return [path]
    files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith((".", "_")))
    if not files:
        raise InputError(f"{path}: the folder holds no files; pass a log file or a folder of log files")
    return files


def _head_rows(path: Path) -> list[str] | None:
    """Up to 50 non-blank lines of the file's first 64 KiB; None for binary content."""
    with path.open("rb") as f:
        head = f.read(SNIFF_BYTES)
    if b"\0" in head:
        return None
    rows = head.decode("utf-8", errors="replace").removeprefix("\ufeff").splitlines()
    if len(head) == SNIFF_BYTES and len(rows) > 1:
        rows = rows[:-1]  # the last line may be cut off
    return [r for r in rows if r.strip()][:50]


def _splits_evenly(rows: list[str], delimiter: str) -> bool:
    counts = {len(fields) for fields in csv.reader(rows, delimiter=delimiter)}
    return len(counts) == 1 and counts.pop() >= 2


def sniff_format(path: Path) -> str | None:
    """What a file's first 64 KiB look like, whatever its name says: TSV or CSV when every line splits into as
    many (2+) fields, movielens for 3+ fields joined by '::', "lines" (SASRec's too) for 2+ words a line, else None."""
    with path.open("rb") as f:
        if f.read(4) == b"PAR1":
            return "parquet"
    rows = _head_rows(path)
    if not rows:
        return None
    for fmt, delimiter in (("tsv", "\t"), ("csv", ",")):
        if _splits_evenly(rows, delimiter):
            return fmt
    if len({len(r.split("::")) for r in rows}) == 1 and len(rows[0].split("::")) >= 3:
        return "movielens"
    return "lines" if all(len(r.split()) >= 2 for r in rows) else None


def sniff_delimiter(path: Path) -> str | None:
    """';' or '|' when every sampled line splits evenly on it (a delimiter `format: auto` does not assume)."""
    rows = _head_rows(path)
    return next((d for d in _OTHER_DELIMITERS if rows and _splits_evenly(rows, d)), None)


def delimiter_hint(delimiter: str) -> str:
    return f"pass delimiter={delimiter!r} (on the command line --data.delimiter '{delimiter}')"


def layout(path: Path, options: ReadOptions) -> Layout:
    fmt = options.format
    if fmt == "auto":
        fmt = sniff_format(path)
        if fmt is None and options.delimiter is None and (found := sniff_delimiter(path)):
            raise InputError(f"{path}: its lines are fields separated by {found!r}, which is not a default "
                             f"delimiter; {delimiter_hint(found)}")
        fmt = fmt or _SUFFIXES.get(path.suffix.lower())
        if options.delimiter is not None and fmt != "parquet":
            fmt = "csv"  # a delimiter names a delimited text file, whatever it sniffs like
        if fmt is None:
            raise InputError(f"{path}: cannot tell the format from the content or the extension {path.suffix!r}; "
                             f"pass format= one of {', '.join(FORMATS)}")
    if fmt == "movielens":
        return Layout("movielens", ":", header=False, names=MOVIELENS_COLUMNS)
    if fmt in ("csv", "tsv"):
        return Layout(fmt, options.delimiter or ("," if fmt == "csv" else "\t"), options.header, options.columns)
    if not options.header:
        raise InputError(f"{path}: header: false applies to csv/tsv text, but the file is {FORMAT_NAMES[fmt]}; "
                         "drop `header` or set format: csv")
    return Layout(fmt)


def format_hint(path: Path, fmt: str) -> str | None:
    """'the file looks like CSV ...' when a forced format failed and the content says another one."""
    sniffed = sniff_format(path)
    if sniffed is None or sniffed == fmt or {fmt, sniffed} <= {"sasrec", "lines"}:
        return None
    return (f"the file looks like {FORMAT_NAMES[sniffed]}, not {fmt}: set format: {sniffed} or auto "
            f"(on the command line --data.format {sniffed})")


def delimited_plan(path: Path, layout: Layout, options: ReadOptions) -> ColumnPlan:
    """Find the options' columns in a delimited file: by its header, by `layout.names`, or by position."""
    if layout.format == "movielens":  # user::item::rating::timestamp, read as ':' with empty fields between
        plan = plan_columns(path, MOVIELENS_COLUMNS, options, [f"c{2 * k}" for k in range(4)])
        return ColumnPlan(plan.columns, plan.shown, empty=("c1", "c3", "c5"), width=7)
    with path.open(newline="", encoding="utf-8-sig") as f:  # utf-8-sig: spreadsheet exports' byte-order mark
        fields = [h.strip() for h in next(csv.reader(f, delimiter=layout.delimiter), [])]
    if not any(fields):
        if not layout.header:
            raise InputError(f"{path}: no interactions found; the file must hold at least one (user, item) row")
        names = (options.user_col, options.item_col, options.time_col)
        raise InputError(f"{path}: the file is empty; expected a header row such as "
                         f"{layout.delimiter.join(c for c in names if c)} and one row per event")
    width = len(fields)
    parsed = [f"c{k}" for k in range(width)]
    if layout.header:
        found, hints = fields, _header_hints(path, fields)
    elif layout.names is not None:
        if len(layout.names) != width:
            raise InputError(f"{path}: `columns` names {len(layout.names)} columns but line 1 has {width} fields; "
                             "give one name per field")
        found, hints = list(layout.names), []
    else:
        found, hints = [str(k) for k in range(width)], ["the file has no header: its columns are positions 0, 1, ..."]
    plan = plan_columns(path, found, options, parsed, hints)
    return ColumnPlan(plan.columns, plan.shown, width=width)


def _header_hints(path: Path, header: list[str]) -> list[str]:
    """Why a header may lack a column: another delimiter, or no header at all."""
    hints = []
    if len(header) == 1 and (found := sniff_delimiter(path)):
        hints.append(f"the header is one field split by {found!r}: {delimiter_hint(found)}")
    if any(_is_number(h) for h in header):
        hints.append("if the first line is an event, not a header, pass header=false (--data.header false) and "
                     "columns=[...] or positions (user_col=0)")
    return hints


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def estimate_rows(path: Path) -> int:
    """About how many lines the file has, from the line lengths of its head."""
    with path.open("rb") as f:
        head = f.read(SNIFF_BYTES)
    return int(path.stat().st_size * (head.count(b"\n") + 1) / max(len(head), 1) * 1.05)


def delimited_rows(path: Path, layout: Layout) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of each row of a delimited or MovieLens file after its header, read by Python's csv."""
    with path.open(newline="", encoding="utf-8-sig") as f:
        if layout.format == "movielens":
            for number, line in enumerate(f, 1):
                yield number, line.rstrip("\r\n").split("::")
            return
        reader = csv.reader(f, delimiter=layout.delimiter)
        if layout.header:
            next(reader, None)
        for row in reader:
            yield reader.line_num, row


def first_value(path: Path, layout: Layout, plan: ColumnPlan, role: str) -> str | None:
    """The `role` column's value in the first row of events (None: no such row or column)."""
    if role not in plan.columns:
        return None
    row = next((fields for _, fields in delimited_rows(path, layout)), [])
    column = int(plan.columns[role][1:]) // (2 if layout.format == "movielens" else 1)
    return row[column] if column < len(row) else None


def delimited_batches(path: Path, layout: Layout, plan: ColumnPlan, tolerant: bool, numeric_time: bool = False,
                      ) -> Iterator[pa.RecordBatch]:
    """The wanted columns as non-null strings, the time column as float64 if `numeric_time` (arrow's parser, in
    its threads); `tolerant`: quoted newlines allowed, in bigger blocks (the pass after the csv scan found no
    fault). A fault arrow finds raises `pa.ArrowException`."""

    def skip_blank(row) -> str:  # rows with a wrong field count: blank ones are skipped, as the csv module does
        fields = next(csv.reader([row.text], delimiter=layout.delimiter), [])
        return "skip" if not any(v.strip() for v in fields) else "error"

    read = pa_csv.ReadOptions(column_names=[f"c{k}" for k in range(plan.width)], skip_rows=1 if layout.header else 0,
                              block_size=TOLERANT_BLOCK if tolerant else BLOCK)
    parse = pa_csv.ParseOptions(delimiter=layout.delimiter, newlines_in_values=tolerant, invalid_row_handler=skip_blank)
    types = dict.fromkeys(plan.read, pa.string())
    if numeric_time and not tolerant:
        types[plan.columns["time_col"]] = pa.float64()
    convert = pa_csv.ConvertOptions(include_columns=plan.read, column_types=types, strings_can_be_null=False)
    yield from pa_csv.open_csv(path, read_options=read, parse_options=parse, convert_options=convert)


def parquet_batches(path: Path, options: ReadOptions) -> tuple[ColumnPlan, int, Iterator[pa.RecordBatch]]:
    """The plan, the number of rows and the record batches of a Parquet file (errors: one line, no traceback)."""
    try:
        file = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise _parquet_error(path, e) from e
    plan = plan_columns(path, file.schema_arrow.names, options)
    if file.metadata.num_rows == 0:
        raise InputError(f"{path}: the file has no rows; it must hold one row per (user, item) event")

    def batches() -> Iterator[pa.RecordBatch]:
        try:
            with file:
                yield from file.iter_batches(batch_size=PARQUET_BATCH, columns=plan.read)
        except (pa.ArrowException, OSError) as e:
            raise _parquet_error(path, e) from e

    return plan, file.metadata.num_rows, batches()


def _parquet_error(path: Path, e: Exception) -> InputError:
    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
    return InputError(f"{path}: cannot read it as Parquet ({reason}); check the file, "
                      "or pass format='csv'/'tsv' if it is text")


def _text_blocks(path: Path) -> Iterator[tuple[int, str]]:
    """(first line number, text) blocks cut after a newline, decoded as UTF-8; a line longer than a block
    (a heavy user's one line) grows its block until the line ends, whatever its length."""
    line, offset = 1, 0
    with path.open("rb") as f:
        rest: list[bytes] = []  # the unfinished line: pieces, joined once (not re-copied per read)
        while True:
            data = f.read(BLOCK)
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


def text_batches(path: Path, fmt: str) -> Iterator[tuple[pa.Array, pa.Array]]:
    """(user ids, item ids) of SASRec ("user item" per line) or one-line-per-user ("user item item ...") blocks."""
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
        yield words.take(as_arrow(heads[np.cumsum(first)[rest] - 1])), words.take(as_arrow(rest))
