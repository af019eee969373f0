"""How the programs read a new log: the way the checkpoint's training log was read, with the user's overrides.

A checkpoint keeps its `ReadOptions` (`streamrec.data.readers.read_options_from_checkpoint`): a model trained with
`--data.user_col user --data.delimiter ';'` scores, explains and serves logs written the same way with no flag at all.
`add_read_arguments` gives `python -m streamrec.score` and `.explain` one flag per option that shapes the parsing
(`--user-col`, `--delimiter`, ..., the DataModule's `--data.*` names with dashes); `with_overrides` applies them. The
count filters (`min_item_count`, `k_core`) shape a training set and are never applied to a log being scored
(`ReadOptions.for_new_logs`)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from core.runtime.errors import InputError
from streamrec.data.ingest.options import FORMATS, ReadOptions

# The options a new log may override, by ReadOptions field; the count filters are training-only.
OVERRIDABLE = ("format", "delimiter", "header", "columns", "user_col", "item_col", "time_col", "time_format",
               "filter", "duplicates")
_TEXT_ONLY = ("delimiter", "header", "columns")  # apply to csv/tsv text only
_NONE = ("none", "null", "")


def with_overrides(options: ReadOptions, overrides: Mapping[str, Any]) -> ReadOptions:
    """`options` (a checkpoint's) with the given fields replaced, for reading a new log. A format changed to one without
    columns (parquet, sasrec, lines, movielens) drops the checkpoint's delimiter, header and column names unless they
    are overridden too: they described the other format. "none" for `time_col` or `filter` clears it."""
    unknown = sorted(set(overrides) - set(OVERRIDABLE))
    if unknown:
        raise InputError(f"reading options: unknown key(s) {', '.join(unknown)}; known: {', '.join(OVERRIDABLE)}")
    changes = {k: (None if k in ("time_col", "filter") and isinstance(v, str) and v.lower() in _NONE else v)
               for k, v in overrides.items()}
    if changes.get("columns") is not None:
        changes["columns"] = tuple(changes["columns"])
        changes.setdefault("header", False)  # naming the columns says the file has no header
    if changes.get("format", "auto") not in ("auto", "csv", "tsv"):  # a format without columns
        defaults = ReadOptions()
        for name in _TEXT_ONLY:
            changes.setdefault(name, getattr(defaults, name))
    return replace(options.for_new_logs(), **changes)


def add_read_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that override how the checkpoint's log was read (each defaults to the checkpoint's value)."""
    group = parser.add_argument_group(
        "reading the input", "Each defaults to how the checkpoint's training log was read (--data.* of fit), so a "
                             "log written like it needs none of them.")
    group.add_argument("--format", choices=("auto", *FORMATS),
                       help="auto (by content, then extension), csv, tsv, parquet, sasrec, lines or movielens")
    group.add_argument("--delimiter", help="field separator of a csv-like file: ',', ';', '|' or tab")
    group.add_argument("--header", action=argparse.BooleanOptionalAction, default=None,
                       help="whether the first line names the columns (--no-header: --columns names them, or the "
                            "--*-col flags give positions 0, 1, ...)")
    group.add_argument("--columns", nargs="+", metavar="NAME", help="column names of a file without header, in order")
    group.add_argument("--user-col", help="user column (a name, or a position in a file without header)")
    group.add_argument("--item-col", help="item column")
    group.add_argument("--time-col", help="timestamp column; none: the file order is chronological")
    group.add_argument("--time-format", help="auto, unix, iso, or a strptime pattern such as %%d/%%m/%%Y")
    group.add_argument("--filter", help="keep only the events that pass, e.g. 'rating >= 4'; none: every event")
    group.add_argument("--duplicates", choices=("keep", "drop", "error"), help="exact duplicate events")


def read_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The reading flags the user gave (`add_read_arguments`), by ReadOptions field."""
    return {name: getattr(args, name) for name in OVERRIDABLE if getattr(args, name, None) is not None}
