"""Step 1 of reading a log: which files, and what each one is (`Layout`), from the options and the content.

`format: auto` looks at a file's first 64 KiB (`sniff_format`), then at its name. A delimiter the
content shows but the options do not name (';', '|') is a one-line error that says which option to set,
not a guess: a ';' file read as CSV would give wrong columns, not an error.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from core.runtime.errors import InputError
from streamrec.data.ingest.options import FORMATS, ReadOptions

_SUFFIXES = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".parquet": "parquet", ".pq": "parquet",
             ".txt": "lines", ".dat": "lines"}
FORMAT_NAMES = {"csv": "CSV", "tsv": "TSV", "parquet": "Parquet", "sasrec": "SASRec 'user item' lines",
                "lines": "one line per user ('user item item ...')",
                "movielens": "MovieLens ratings ('user::item::rating::timestamp')"}
MOVIELENS_COLUMNS = ("user_id", "item_id", "rating", "timestamp")
_SNIFF_BYTES = 1 << 16
_OTHER_DELIMITERS = (";", "|")


@dataclass(frozen=True)
class Layout:
    """How one file is parsed.

    Args:
        format: csv, tsv, parquet, sasrec, lines or movielens (named in errors).
        delimiter: the field separator of a delimited file (MovieLens' '::' is read as ':' with every
            other field empty); None for Parquet and the line formats.
        header: whether the first line names the columns.
        names: the column names of a file without header (None: from the header, or the positions).
    """

    format: str
    delimiter: str | None = None
    header: bool = True
    names: tuple[str, ...] | None = None

    @property
    def delimited(self) -> bool:
        """Parsed by pyarrow's CSV reader."""
        return self.delimiter is not None


def existing_path(path: str | Path) -> Path:
    """`path` as a Path; a missing file or folder is a FileNotFoundError naming it."""
    path = Path(path)
    if not (path.is_file() or path.is_dir()):
        raise FileNotFoundError(f"interactions file {str(path)!r} does not exist; check `path`")
    return path


def log_files(path: Path) -> list[Path]:
    """The file itself, or a folder's files in name order (hidden and `_`-prefixed ones, e.g. Spark's _SUCCESS,
    skipped)."""
    if not path.is_dir():
        return [path]
    files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith((".", "_")))
    if not files:
        raise InputError(f"{path}: the folder holds no files; pass a log file or a folder of log files")
    return files


def _head_rows(path: Path) -> list[str] | None:
    """Up to 50 non-blank lines of the file's first 64 KiB; None for binary content."""
    with path.open("rb") as f:
        head = f.read(_SNIFF_BYTES)
    if b"\0" in head:
        return None
    rows = head.decode("utf-8", errors="replace").removeprefix("\ufeff").splitlines()
    if len(head) == _SNIFF_BYTES and len(rows) > 1:
        rows = rows[:-1]  # the last line may be cut off
    return [r for r in rows if r.strip()][:50]


def _splits_evenly(rows: list[str], delimiter: str) -> bool:
    counts = {len(fields) for fields in csv.reader(rows, delimiter=delimiter)}
    return len(counts) == 1 and counts.pop() >= 2


def sniff_format(path: Path) -> str | None:
    """What a file's first 64 KiB look like, whatever its name says.

    Parquet by its magic bytes; TSV or CSV when every sampled line splits into the same number
    (at least 2) of fields on that delimiter; movielens when every line is 3 or more fields joined by
    '::'; "lines" when every line has at least two whitespace-separated fields (SASRec's "user item"
    lines are read the same way); None when nothing fits (empty, binary or one field a line).
    """
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
    if all(len(r.split()) >= 2 for r in rows):
        return "lines"
    return None


def sniff_delimiter(path: Path) -> str | None:
    """';' or '|' when every sampled line splits evenly on it (a delimiter `format: auto` does not assume)."""
    rows = _head_rows(path)
    return next((d for d in _OTHER_DELIMITERS if rows and _splits_evenly(rows, d)), None)


def delimiter_hint(delimiter: str) -> str:
    """The option that reads a file delimited by `delimiter`."""
    return f"pass delimiter={delimiter!r} (on the command line --data.delimiter '{delimiter}')"


def layout(path: Path, options: ReadOptions) -> Layout:
    """How to parse `path` under `options` (format auto: by content, then by name)."""
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
