"""The line of a fault in a delimited file, for its one-line error.

Arrow's CSV errors name no line, and a row index in a batch is not a line number (blank lines,
quoted newlines), so when a step rejects a block, `raise_first_fault` reads the file again with
Python's csv module, checking each row as the steps do, and raises the first fault with its line.
A file it finds no fault in (e.g. a quoted newline inside an id) is read again with arrow's
tolerant options.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path

from core.runtime.errors import InputError
from streamrec.data.ingest.columns import ColumnPlan, TimeParser
from streamrec.data.ingest.detect import Layout
from streamrec.data.ingest.filters import cell_number
from streamrec.data.ingest.options import ColumnFilter


def _rows(path: Path, layout: Layout) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of each row after the header."""
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


def raise_first_fault(path: Path, layout: Layout, plan: ColumnPlan, times: TimeParser,
                      rule: ColumnFilter | None) -> None:
    """Raise the first row fault of the file as a one-line `InputError` naming its line; return if none."""
    index = {role: int(column[1:]) // (2 if layout.format == "movielens" else 1)
             for role, column in plan.columns.items()}  # parsed columns are c0, c1, ...
    width = 4 if layout.format == "movielens" else plan.width
    for number, row in _rows(path, layout):
        if not row or not any(v.strip() for v in row):
            continue  # blank line
        where = f"{path} line {number}"
        if len(row) != width:
            raise InputError(_width_message(where, layout, len(row), width))
        for role in ("user_col", "item_col"):
            if not row[index[role]].strip():
                raise InputError(f"{where}, column {plan.shown[role]!r}: empty id; every row needs a user and an item")
        if "time_col" in index:
            try:
                times.parse(row[index["time_col"]])
            except ValueError as e:
                raise InputError(f"{where}, column {plan.shown['time_col']!r}: {e}") from None
        if rule is not None and rule.numeric:
            try:
                cell_number(row[index["filter"]])
            except ValueError as e:
                column = plan.shown["filter"]
                raise InputError(f"{where}, column {column!r}: {e}; fix the value or the filter") from None


def _width_message(where: str, layout: Layout, found: int, width: int) -> str:
    if layout.format == "movielens":
        return (f"{where}: expected 'user::item::rating::timestamp' (4 fields), got {found}; fix the line, "
                "or pass the format the file is in")
    against = "the header has" if layout.header else "line 1 has"
    return (f"{where}: {found} fields but {against} {width}; fix the row "
            f"(is the delimiter {layout.delimiter!r} right?)")
