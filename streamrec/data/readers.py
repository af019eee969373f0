"""Reading an interaction log into columnar `Interactions` through the steps of streamrec/data/ingest/.

User mistakes raise a one-line error naming the file, line/row or column and the fix. Arrow's CSV errors name no line,
and a row index in a batch is not a line number (blank lines, quoted newlines), so when a step rejects a block,
`_raise_first_fault` reads the file again with Python's csv module, checking each row as the steps do; a file it finds
no fault in (e.g. a quoted newline inside an id) is read again with arrow's tolerant options. It imports no torch."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from core.runtime.errors import InputError, check_text_file
from streamrec.data.ingest import columns, parse
from streamrec.data.ingest.arrays import as_arrow
from streamrec.data.ingest.build import InteractionsBuilder
from streamrec.data.ingest.columns import Chunk, ColumnPlan, Fault, TimeParser
from streamrec.data.ingest.options import ColumnFilter, Format, ReadOptions, read_options_from_checkpoint
from streamrec.data.ingest.parse import Layout, existing_path, sniff_format
from streamrec.data.interactions import Interactions

__all__ = ["Format", "ReadOptions", "existing_path", "read_interactions", "read_options_from_checkpoint",
           "sniff_format"]


def read_interactions(path: str | Path, format: Format = "auto", user_col: str = "user_id", item_col: str = "item_id",
                      time_col: str | None = "timestamp", *, options: ReadOptions | None = None) -> Interactions:
    """Read an interaction log into per-user chronological sequences (equal times keep file order). `path` is a file, or
    a folder of files read in name order as one log (a Parquet dataset's parts). `format` auto goes by content
    (`sniff_format`), then extension, per file; a forced format that does not fit says which one does. time_col None:
    the file order is chronological. `options` gives every reading option at once (`ReadOptions`), the four arguments
    before it then left at their defaults."""
    loose = {"format": format, "user_col": user_col, "item_col": item_col, "time_col": time_col}
    if options is None:
        options = ReadOptions(**loose)
    elif loose != {"format": "auto", "user_col": "user_id", "item_col": "item_id", "time_col": "timestamp"}:
        raise InputError("read_interactions: pass the format and columns inside `options`, not beside it")
    path = existing_path(path)
    builder, times = InteractionsBuilder(path), TimeParser(options.time_format)
    with _malloc_pool():
        for file in parse.log_files(path):
            layout = parse.layout(file, options)
            try:
                _read_file(file, layout, options, times, builder)
            except InputError as e:
                hint = parse.format_hint(file, layout.format) if options.format != "auto" else None
                if hint is None:
                    raise
                raise InputError(f"{e}; {hint}") from e
        if options.filter is not None and not builder.rows:
            raise InputError(f"{path}: no event passes the filter {options.filter}; check the filter's column "
                             "and value")
        inter = builder.build()
    return columns.refine(inter, options, path)


def _read_file(path: Path, layout: Layout, options: ReadOptions, times: TimeParser,
               builder: InteractionsBuilder) -> None:
    if layout.format == "parquet":
        _read_parquet(path, options, times, builder)
        return
    check_text_file(path)  # a NUL byte: binary data, which the text readers would take as odd ids
    if layout.delimiter is None:
        if options.filter is not None:
            raise InputError(f"{path}: {parse.FORMAT_NAMES[layout.format]} has no columns to filter; "
                             "drop `filter`, or read a CSV/TSV/Parquet log")
        for users, items in parse.text_batches(path, layout.format):
            builder.add(users, items, None)
        return
    try:
        _read_delimited(path, layout, options, times, builder)
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text (byte {e.start}); pass format='parquet' if it is Parquet") from e
    except csv.Error as e:  # e.g. a field over csv's size limit (131,072 characters): not an id
        raise InputError(f"{path}: not a readable {layout.format.upper()} file ({e}); "
                         "check the file and `format`") from e


def _read_delimited(path: Path, layout: Layout, options: ReadOptions, times: TimeParser,
                    builder: InteractionsBuilder) -> None:
    plan = parse.delimited_plan(path, layout, options)
    builder.expect(parse.estimate_rows(path))
    numeric = times.settle(parse.first_value(path, layout, plan, "time_col")) == "unix"
    start = builder.mark()
    try:
        for batch in parse.delimited_batches(path, layout, plan, tolerant=False, numeric_time=numeric):
            _add(builder, columns.convert(batch, plan, times, trim=True), options)
        return
    except (pa.ArrowException, Fault):
        builder.rollback(start)  # the blocks before the fault are read again below
        _raise_first_fault(path, layout, plan, times, options.filter)
    try:
        for batch in parse.delimited_batches(path, layout, plan, tolerant=True):
            _add(builder, columns.convert(batch, plan, times, trim=True, drop_blank=True), options)
    except (pa.ArrowException, ValueError, Fault) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputError(f"{path}: not a readable {layout.format.upper()} file ({reason}); "
                         "check the file and `format`") from e


def _read_parquet(path: Path, options: ReadOptions, times: TimeParser, builder: InteractionsBuilder) -> None:
    plan, rows, batches = parse.parquet_batches(path, options)
    builder.expect(rows)
    first = 0
    for batch in batches:
        for role, column in plan.columns.items():
            if batch.column(column).null_count:
                row = first + pc.index(pc.is_null(batch.column(column)), True).as_py()
                raise InputError(f"{path} row {row + 1}, column {plan.shown[role]!r}: missing value; "
                                 "every row needs a user, an item and a timestamp")
        try:
            _add(builder, columns.convert(batch, plan, times, trim=False), options)
        except Fault as e:
            row = "" if e.reason.startswith("its ids") else f" row {first + e.row + 1}, column {plan.shown[e.column]!r}"
            raise InputError(f"{path}{row}: {e.reason}") from None
        first += batch.num_rows


def _add(builder: InteractionsBuilder, chunk: Chunk, options: ReadOptions) -> None:
    users, items, times = chunk.users, chunk.items, chunk.times
    if options.filter is not None:
        keep = columns.keep_rows(options.filter, chunk.filter_values)
        if not keep.all():
            index = as_arrow(np.flatnonzero(keep).astype(np.int64))
            users, items = users.take(index), items.take(index)
            times = None if times is None else times[keep]
    builder.add(users, items, times)


def _raise_first_fault(path: Path, layout: Layout, plan: ColumnPlan, times: TimeParser,
                      rule: ColumnFilter | None) -> None:
    index = {role: int(column[1:]) // (2 if layout.format == "movielens" else 1)
             for role, column in plan.columns.items()}  # parsed columns are c0, c1, ...
    width = 4 if layout.format == "movielens" else plan.width
    for number, row in parse.delimited_rows(path, layout):
        if not row or not any(v.strip() for v in row):
            continue  # blank line
        where = f"{path} line {number}"
        if len(row) != width and layout.format == "movielens":
            raise InputError(f"{where}: expected 'user::item::rating::timestamp' (4 fields), got {len(row)}; fix "
                             "the line, or pass the format the file is in")
        if len(row) != width:
            raise InputError(f"{where}: {len(row)} fields but {'the header' if layout.header else 'line 1'} has "
                             f"{width}; fix the row (is the delimiter {layout.delimiter!r} right?)")
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
                columns.cell_number(row[index["filter"]])
            except ValueError as e:
                column = plan.shown["filter"]
                raise InputError(f"{where}, column {column!r}: {e}; fix the value or the filter") from None


@contextmanager
def _malloc_pool() -> Iterator[None]:
    """Arrow allocates from malloc while a log is read: its default (mimalloc) keeps the blocks arrow frees, so
    the transient CSV buffers and strings would stay resident next to the codes."""
    previous = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        yield
    finally:
        pa.set_memory_pool(previous)
