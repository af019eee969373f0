"""`ReadOptions`: how a log is read, one frozen object from the DataModule (or a checkpoint) down every step.

Plain values, so a checkpoint stores `to_dict` and scoring reads new logs the way training read its log."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal

from core.runtime.errors import InputError

Format = Literal["auto", "csv", "tsv", "parquet", "sasrec", "lines", "movielens"]
FORMATS = ("csv", "tsv", "parquet", "sasrec", "lines", "movielens")
DuplicatePolicy = Literal["keep", "drop", "error"]
TIME_KINDS = ("auto", "unix", "iso")
READ_OPTIONS_KEY = "read_options"  # the key of the DataModule's checkpoint state (`StreamRecDataModule.state_dict`)
DATAMODULE_KEY = "StreamRecDataModule"  # Lightning stores a DataModule's state under its class name

_DELIMITER_NAMES = {"tab": "\t", "\\t": "\t", "comma": ",", "semicolon": ";", "pipe": "|", "space": " "}
_OPS = (">=", "<=", "!=", "==", ">", "<", " not in ", " in ")
_FILTER_SHAPE = "'rating >= 4', 'event_type == buy' or 'event_type in [view, buy]'"


@dataclass(frozen=True)
class ColumnFilter:
    """Keep only the events whose `column` satisfies `op value`, e.g. rating >= 4 or event_type in [view, buy];
    numbers compare as numbers (4 equals 4.0), anything else as the cell's trimmed text."""

    column: str
    op: Literal["==", "!=", ">", ">=", "<", "<=", "in", "not in"]
    value: float | str | tuple[float | str, ...]

    def __post_init__(self) -> None:
        if self.op not in ("==", "!=", ">", ">=", "<", "<=", "in", "not in"):
            raise InputError(f"filter {self.column!r}: unknown comparison {self.op!r}; use one of "
                             "==, !=, >, >=, <, <=, in, not in")
        if isinstance(self.value, list) or self.op in ("in", "not in"):
            object.__setattr__(self, "value", tuple(self.value) if isinstance(self.value, list) else self.values)
        if self.op in (">", ">=", "<", "<=") and not isinstance(self.value, int | float):
            raise InputError(f"filter {self.column!r} {self.op} {self.value!r}: an order comparison needs a number; "
                             f"write e.g. {_FILTER_SHAPE}")

    @property
    def values(self) -> tuple[float | str, ...]:
        return self.value if isinstance(self.value, tuple) else (self.value,)

    @property
    def numeric(self) -> bool:
        """Whether the cells are compared as numbers (every value is a number)."""
        return all(isinstance(v, int | float) for v in self.values)

    @classmethod
    def parse(cls, text: str) -> ColumnFilter:
        """'rating >= 4', 'event_type == buy', 'event_type in [view, buy]' -> a `ColumnFilter`."""
        for op in _OPS:
            column, found, value = text.partition(op)
            if found and column.strip() and value.strip():
                break
        else:
            raise InputError(f"filter {text!r}: expected 'column op value', e.g. {_FILTER_SHAPE}")
        op, value = op.strip(), value.strip()
        if op in ("in", "not in"):
            if not (value.startswith("[") and value.endswith("]")):
                raise InputError(f"filter {text!r}: {op} takes a list in brackets, e.g. {_FILTER_SHAPE}")
            values = tuple(_number_or_text(v) for v in value[1:-1].split(",") if v.strip())
            return cls(column.strip(), op, values)  # type: ignore[arg-type]
        return cls(column.strip(), op, _number_or_text(value))  # type: ignore[arg-type]

    def __str__(self) -> str:
        if isinstance(self.value, tuple):
            return f"{self.column} {self.op} [{', '.join(map(_text, self.value))}]"
        return f"{self.column} {self.op} {_text(self.value)}"


def _number_or_text(value: str) -> float | str:
    value = value.strip().strip("'\"")
    try:
        number = float(value)
    except ValueError:
        return value
    return number if math.isfinite(number) else value


def _text(value: float | str) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def parse_delimiter(value: str | None) -> str | None:
    """A one-character delimiter, from the character itself or a name (tab, '\\t', comma, semicolon, pipe)."""
    if value is None:
        return None
    value = _DELIMITER_NAMES.get(value.lower(), value)
    if len(value) != 1 or value in "\"\r\n":
        raise InputError(f"`delimiter` must be one character such as ',', ';', '|' or tab ('\\t'), got {value!r}")
    return value


@dataclass(frozen=True, kw_only=True)
class ReadOptions:
    """Every option of reading a log: what the file looks like, and which events are kept. The options mean what
    `StreamRecDataModule`'s arguments of the same names say. A column is a name, or a position in a file without header
    (user_col: 0); time_col None means the file order is chronological. Times become Unix seconds (no zone: UTC)."""

    format: Format = "auto"
    delimiter: str | None = None
    header: bool = True
    columns: tuple[str, ...] | None = None
    user_col: str = "user_id"
    item_col: str = "item_id"
    time_col: str | None = "timestamp"
    time_format: str = "auto"
    filter: ColumnFilter | None = None
    duplicates: DuplicatePolicy = "keep"
    min_item_count: int = 1
    k_core: int | None = None

    def __post_init__(self) -> None:
        if self.format not in ("auto", *FORMATS):
            raise InputError(f"`format` must be auto, {', '.join(FORMATS)}; got {self.format!r}")
        object.__setattr__(self, "delimiter", parse_delimiter(self.delimiter))
        for name in ("user_col", "item_col", "time_col"):
            if isinstance(getattr(self, name), int):  # a position, e.g. from YAML `user_col: 0`
                object.__setattr__(self, name, str(getattr(self, name)))
        if self.columns is not None:
            object.__setattr__(self, "columns", tuple(str(c).strip() for c in self.columns))
            if self.header:
                raise InputError(f"`columns` {list(self.columns)} names the columns of a file without a header; "
                                 "also pass header: false (--data.header false), or drop `columns`")
            if len(set(self.columns)) != len(self.columns) or not all(self.columns):
                raise InputError(f"`columns` {list(self.columns)} must be distinct, non-empty names")
        if self.delimiter is not None and self.format in ("parquet", "sasrec", "lines", "movielens"):
            raise InputError(f"`delimiter` {self.delimiter!r} applies to csv/tsv text, not format {self.format}; "
                             "drop it or set format: csv")
        if not self.header and self.format in ("parquet", "sasrec", "lines"):
            raise InputError(f"header: false applies to csv/tsv text, not format {self.format}")
        if self.format == "movielens" and self.columns is not None:
            raise InputError("format movielens has fixed columns (user_id, item_id, rating, timestamp); drop `columns`")
        if self.time_format not in TIME_KINDS and "%" not in self.time_format:
            raise InputError(f"`time_format` must be auto, unix, iso or a strptime pattern such as "
                             f"'%Y-%m-%d %H:%M:%S'; got {self.time_format!r}")
        if isinstance(self.filter, str):
            object.__setattr__(self, "filter", ColumnFilter.parse(self.filter))
        elif isinstance(self.filter, Mapping):
            object.__setattr__(self, "filter", ColumnFilter(**self.filter))
        if self.duplicates not in ("keep", "drop", "error"):
            raise InputError(f"`duplicates` must be keep, drop or error; got {self.duplicates!r}")
        if self.min_item_count < 1:
            raise InputError(f"`min_item_count` must be at least 1, got {self.min_item_count}")
        if self.k_core is not None and self.k_core < 1:
            raise InputError(f"`k_core` must be at least 1 (or None: no k-core), got {self.k_core}")

    def for_new_logs(self) -> ReadOptions:
        """The same parsing, filter and duplicates policy, without the count filters (`min_item_count`,
        `k_core`): those shape a training set, and would drop the rare items of a user whose history is scored."""
        return replace(self, min_item_count=1, k_core=None)

    def to_dict(self) -> dict[str, Any]:
        """Plain values (a checkpoint's copy): the filter as its fields, `columns` as a list."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.filter is not None:
            value = self.filter.value
            values["filter"] = {**asdict(self.filter), "value": list(value) if isinstance(value, tuple) else value}
        values["columns"] = None if self.columns is None else list(self.columns)
        return values

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ReadOptions:
        """The options `to_dict` wrote (keys it lacks keep their defaults)."""
        known = {f.name for f in fields(cls)}
        if unknown := sorted(set(values) - known):
            raise InputError(f"read options: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(known))}); "
                             "the checkpoint was written by a newer version of StreamRec")
        return cls(**values)  # `__post_init__` makes `columns` a tuple again


def read_options_from_checkpoint(checkpoint: Mapping[str, Any]) -> ReadOptions:
    """The options a checkpoint's log was read with, to read new logs the same way (older checkpoints: the
    DataModule's format and columns from its hyper-parameters, else the defaults)."""
    # Lightning keeps a DataModule's state under its class name: StreamRecDataModule's, or a subclass's.
    for state in [checkpoint.get(DATAMODULE_KEY), *checkpoint.values()]:
        if isinstance(state, Mapping) and isinstance(state.get(READ_OPTIONS_KEY), Mapping):
            return ReadOptions.from_dict(state[READ_OPTIONS_KEY])
    hparams = checkpoint.get("datamodule_hyper_parameters")
    if isinstance(hparams, Mapping):
        old = {k: hparams[k] for k in ("format", "user_col", "item_col", "time_col") if k in hparams}
        return ReadOptions(**old)
    return ReadOptions()

