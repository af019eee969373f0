"""Item metadata (titles, genres, ...) read from a user's file, so pages show names instead of raw ids.

Three formats, told apart by the content:
- CSV or TSV with a header row holding `item_id`; a `title` column gives the display name (else the first
  other column), every other column is kept as metadata (`item_id,title,genre`);
- MovieLens-1M `movies.dat`: `MovieID::Title::Genres`, no header, Latin-1 (as GroupLens ships it);
- a JSON object of item id -> list of attribute ids (S3Rec's `Beauty_item2attributes.json`): one `attributes`
  column, its values separated by "|", which `data.feature_columns: [attributes]` reads as features.

Ids missing from the file are not an error: `ItemCatalog.title` falls back to the raw id."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path

from core.runtime.errors import InputError, check_text

MAX_ITEMS_FILE_BYTES = 256 << 20  # ML-1M's movies.dat is 171 kB; a catalogue of millions of titles still fits
ID_COLUMN = "item_id"
TITLE_COLUMN = "title"
ATTRIBUTES_COLUMN = "attributes"  # the column a JSON attributes file becomes


@dataclass
class ItemCatalog:
    """Display names and metadata per item id: `columns` in file order (the title's included, `item_id` not);
    `separators`: a multi-valued column's separator where it is not "|" (movies.dat's genres show "A, B")."""

    columns: list[str]
    rows: dict[str, dict[str, str]]
    title_column: str
    path: str = ""
    separators: dict[str, str] = field(default_factory=dict)

    def title(self, item_id: str) -> str:
        """The item's name; the raw id when the file does not list it or its title is empty."""
        return self.rows.get(item_id, {}).get(self.title_column) or item_id

    def details(self, item_id: str) -> dict[str, str]:
        """The item's non-empty metadata other than its title ({} when the file does not list it)."""
        row = self.rows.get(item_id, {})
        return {c: row[c] for c in self.columns if c != self.title_column and row.get(c)}

    def __contains__(self, item_id: object) -> bool:
        return item_id in self.rows

    def __len__(self) -> int:
        return len(self.rows)


def read_items(path: str | Path) -> ItemCatalog:
    """Read an item file (see the module docstring); a bad file is one `InputError` naming the file and line."""
    file = Path(path)
    if not file.is_file():
        what = "is a folder, not a file" if file.is_dir() else "does not exist"
        raise FileNotFoundError(f"items file {str(file)!r} {what}; pass a CSV/TSV with an item_id column "
                                "or MovieLens' movies.dat")
    size = file.stat().st_size
    if size > MAX_ITEMS_FILE_BYTES:
        raise InputError(f"{file}: {size:,} bytes, over the {MAX_ITEMS_FILE_BYTES:,}-byte limit for an items file; "
                         "keep only the items you show")
    data = file.read_bytes()
    check_text(data, file)
    first = data.split(b"\n", 1)[0]
    if file.suffix.lower() == ".json" or data.lstrip()[:1] == b"{":
        return _read_attributes_json(file, data)
    if b"::" in first and ID_COLUMN.encode() not in first:
        return _read_movielens(file, data.decode("latin-1"))
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise InputError(f"{file}:{line}: not UTF-8 text (byte {err.start}); save the file as UTF-8") from None
    try:
        return _read_delimited(file, text)
    except csv.Error as err:  # e.g. a field over csv's size limit, a NUL byte
        raise InputError(f"{file}: not a readable CSV/TSV file ({err}); check the file") from None


def _read_movielens(file: Path, text: str) -> ItemCatalog:
    rows: dict[str, dict[str, str]] = {}
    for line_num, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("::")
        if len(fields) != 3:
            raise InputError(f"{file}:{line_num}: expected MovieID::Title::Genres (3 fields), got {len(fields)}; "
                             "fix or remove the line")
        movie, title, genres = (f.strip() for f in fields)
        _add(rows, file, line_num, movie, {TITLE_COLUMN: title, "genres": genres.replace("|", ", ")})
    if not rows:
        raise InputError(f"{file}: no items found; expected MovieID::Title::Genres lines")
    return ItemCatalog([TITLE_COLUMN, "genres"], rows, TITLE_COLUMN, str(file), {"genres": ", "})


def _read_attributes_json(file: Path, data: bytes) -> ItemCatalog:
    try:
        mapping = json.loads(data.decode("utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        where = f":{err.lineno}" if isinstance(err, json.JSONDecodeError) else ""
        raise InputError(f"{file}{where}: not a JSON object of item id -> attribute list ({err}); "
                         "fix the file") from None
    if not isinstance(mapping, dict) or not mapping:
        raise InputError(f"{file}: expected a JSON object of item id -> list of attributes; got "
                         f"{type(mapping).__name__ if mapping else 'an empty one'}")
    rows: dict[str, dict[str, str]] = {}
    for item_id, values in mapping.items():
        if not isinstance(values, list) or not all(isinstance(v, str | int) and not isinstance(v, bool)
                                                   for v in values):
            raise InputError(f"{file}: item {item_id!r} maps to {json.dumps(values)[:40]}, not a list of attribute "
                             "ids (numbers or strings); fix the file")
        rows[str(item_id).strip()] = {ATTRIBUTES_COLUMN: "|".join(str(v).strip() for v in values)}
    if "" in rows:
        raise InputError(f"{file}: an empty item id; every item needs one")
    return ItemCatalog([ATTRIBUTES_COLUMN], rows, ID_COLUMN, str(file))


def _read_delimited(file: Path, text: str) -> ItemCatalog:
    delimiter = "\t" if "\t" in text.split("\n", 1)[0] else ","  # TSV: a tab in the header line
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    header = [h.strip() for h in next(reader, [])]
    if ID_COLUMN not in header:
        found = ", ".join(repr(h) for h in header[:8]) or "none"
        raise InputError(f"{file}:1: no {ID_COLUMN!r} column in the header (columns: {found}); the first line must "
                         f"name the columns, e.g. {ID_COLUMN},{TITLE_COLUMN}, or pass MovieLens' movies.dat")
    if len(set(header)) != len(header) or "" in header:
        raise InputError(f"{file}:1: empty or repeated column names in the header; name every column once")
    id_at = header.index(ID_COLUMN)
    columns = [h for h in header if h != ID_COLUMN]
    rows: dict[str, dict[str, str]] = {}
    for fields in reader:
        line_num = reader.line_num
        if not any(f.strip() for f in fields):
            continue
        if len(fields) != len(header):
            raise InputError(f"{file}:{line_num}: {len(fields)} fields but the header has {len(header)}; "
                             f"fix the row (quote values holding {delimiter!r})")
        values = {h: v.strip() for h, v in zip(header, fields, strict=True) if h != ID_COLUMN}
        _add(rows, file, line_num, fields[id_at].strip(), values)
    title = TITLE_COLUMN if TITLE_COLUMN in columns else (columns[0] if columns else ID_COLUMN)
    return ItemCatalog(columns, rows, title, str(file))


def _add(rows: dict[str, dict[str, str]], file: Path, line_num: int, item_id: str, values: dict[str, str]) -> None:
    if not item_id:
        raise InputError(f"{file}:{line_num}: empty item id; every row needs one")
    if item_id in rows:
        raise InputError(f"{file}:{line_num}: item {item_id!r} is listed twice; keep one row per item")
    rows[item_id] = values
