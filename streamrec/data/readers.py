"""Reading an interaction log (CSV, TSV, Parquet, MovieLens ratings.dat, SASRec lines, one line per user, or a
folder of them) into columnar `Interactions`, as one pipeline of steps (streamrec/data/ingest/, one module each):

1. `detect`: which files, and each one's `Layout` (format, delimiter, header), from `ReadOptions` and the content.
2. `parse`: the file parsed by pyarrow (CSV with its own Read/Parse/ConvertOptions, Parquet, text blocks).
3. `columns`: the user, item, time and filter columns found, ids as strings, times as Unix seconds.
4. `filters`: the column filter per block; then duplicates, rare items and the k-core over the whole log.
5. `build`: `InteractionsBuilder` encodes the ids to int32 a group at a time and groups the events by user.

The options travel as one frozen `ReadOptions`. Equal timestamps keep file order. User mistakes (missing
file or column, empty file, bad timestamp, malformed line, unreadable Parquet) raise a one-line
ValueError/FileNotFoundError naming the file, line/row or column and the fix; a delimited block that a step
rejects is located by `ingest.locate`. Importing this module does not import torch.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from core.runtime.errors import InputError, check_text_file
from streamrec.data.ingest import columns, detect, filters, locate, parse
from streamrec.data.ingest.arrays import as_arrow
from streamrec.data.ingest.build import InteractionsBuilder
from streamrec.data.ingest.columns import Chunk, ColumnPlan, Fault, TimeParser
from streamrec.data.ingest.detect import existing_path, sniff_format
from streamrec.data.ingest.options import Format, ReadOptions, read_options_from_checkpoint
from streamrec.data.interactions import Interactions

__all__ = ["Format", "ReadOptions", "existing_path", "read_interactions", "read_options_from_checkpoint",
           "sniff_format"]


def read_interactions(
    path: str | Path, format: Format = "auto", user_col: str = "user_id", item_col: str = "item_id",
    time_col: str | None = "timestamp", *, options: ReadOptions | None = None,
) -> Interactions:
    """Read an interaction log into per-user chronological sequences.

    Args:
        path: the log file, or a folder of log files read in name order as one log (e.g. a
            Parquet dataset's part files).
        format: csv, tsv, parquet, movielens, sasrec ("user item" per line, already chronological), lines
            ("user item item ..." per line), or auto (by content, see `sniff_format`, then by
            extension; per file in a folder). A forced format that does not fit says which one does.
        user_col: user column of a CSV/TSV/Parquet file.
        item_col: item column of a CSV/TSV/Parquet file.
        time_col: timestamp column; None means the file order is chronological.
        options: every reading option at once (`ReadOptions`: delimiter, header, time format, filters...);
            when given, the four arguments above keep their defaults.

    Returns:
        `Interactions`, each user's events sorted by time (ties keep file order).
    """
    loose = {"format": format, "user_col": user_col, "item_col": item_col, "time_col": time_col}
    if options is None:
        options = ReadOptions(**loose)
    elif loose != {"format": "auto", "user_col": "user_id", "item_col": "item_id", "time_col": "timestamp"}:
        raise InputError("read_interactions: pass the format and columns inside `options`, not beside it")
    path = existing_path(path)
    builder, times = InteractionsBuilder(path), TimeParser(options.time_format)
    with _malloc_pool():
        for file in detect.log_files(path):
            layout = detect.layout(file, options)
            try:
                _read_file(file, layout, options, times, builder)
            except InputError as e:
                hint = detect.format_hint(file, layout.format) if options.format != "auto" else None
                if hint is None:
                    raise
                raise InputError(f"{e}; {hint}") from e
        if options.filter is not None and not builder.rows:
            raise InputError(f"{path}: no event passes the filter {options.filter}; check the filter's column "
                             "and value")
        inter = builder.build()
    return filters.refine(inter, options, path)


def _read_file(path: Path, layout: detect.Layout, options: ReadOptions, times: TimeParser,
               builder: InteractionsBuilder) -> None:
    if layout.format == "parquet":
        _read_parquet(path, options, times, builder)
        return
    check_text_file(path)  # a NUL byte: binary data, which the text readers would take as odd ids
    if not layout.delimited:
        if options.filter is not None:
            raise InputError(f"{path}: {detect.FORMAT_NAMES[layout.format]} has no columns to filter; "
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


def _read_delimited(path: Path, layout: detect.Layout, options: ReadOptions, times: TimeParser,
                    builder: InteractionsBuilder) -> None:
    """Arrow first; at a fault, the csv scan names its line, or (none found) arrow's tolerant pass reads it."""
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
        locate.raise_first_fault(path, layout, plan, times, options.filter)
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
        _check_nulls(path, batch, plan, first)
        try:
            chunk = columns.convert(batch, plan, times, trim=False)
            _add(builder, chunk, options)
        except Fault as e:
            row = "" if e.reason.startswith("its ids") else f" row {first + e.row + 1}, column {plan.shown[e.column]!r}"
            raise InputError(f"{path}{row}: {e.reason}") from None
        first += batch.num_rows


def _check_nulls(path: Path, batch: pa.RecordBatch, plan: ColumnPlan, first: int) -> None:
    for role, column in plan.columns.items():
        if batch.column(column).null_count:
            row = first + pc.index(pc.is_null(batch.column(column)), True).as_py()
            raise InputError(f"{path} row {row + 1}, column {plan.shown[role]!r}: missing value; "
                             "every row needs a user, an item and a timestamp")


def _add(builder: InteractionsBuilder, chunk: Chunk, options: ReadOptions) -> None:
    """The chunk's events that pass the column filter, to the builder."""
    users, items, times = chunk.users, chunk.items, chunk.times
    if options.filter is not None:
        keep = filters.keep_rows(options.filter, chunk.filter_values)
        if not keep.all():
            index = as_arrow(np.flatnonzero(keep).astype(np.int64))
            users, items = users.take(index), items.take(index)
            times = None if times is None else times[keep]
    builder.add(users, items, times)


@contextmanager
def _malloc_pool() -> Iterator[None]:
    """Arrow allocates from the C library's malloc while a log is read, then from its default pool again.

    The default (mimalloc) keeps the blocks arrow frees for reuse, so the transient CSV buffers and
    strings stay resident next to the codes; malloc gives them back as they are freed.
    """
    previous = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        yield
    finally:
        pa.set_memory_pool(previous)
