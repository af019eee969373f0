"""The request schema of the HTTP servers: `Field`s, `check_fields`, strict JSON parsing, and `RequestError`.
Pure Python: a request is checked here, in the HTTP process, before anything reaches a model."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from core.runtime.errors import InputError

MAX_ERROR_CHARS = 300
REQUIRED = object()  # Field.default of a field the request must give


class RequestError(InputError):
    """A request the server refuses, with its HTTP status (4xx) and a one-line reason."""

    def __init__(self, message: str, status: int = 422):
        super().__init__(message)
        self.status = status


def one_line(message: str) -> str:
    """`message` on one line, at most MAX_ERROR_CHARS characters (a client may echo it into a log)."""
    text = " ".join(str(message).split())
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def error_body(message: str) -> bytes:
    return json.dumps({"error": one_line(message)}).encode()


@dataclass(frozen=True)
class Field:
    """One key of a request object: its JSON type (bool, int, float: an integer too, str or list), its default
    (REQUIRED: the key must be given; None: null is allowed) and its limits: `lo`/`hi` bound a number, or the
    characters of a str, or the elements of a list; `item` is a list's element type, `item_hi` its most characters."""

    kind: type
    default: Any = REQUIRED
    lo: float | None = None
    hi: float | None = None
    item: type | None = None
    item_hi: int | None = None


_JSON_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string", list: "a list"}


def _is(value: object, kind: type) -> bool:
    """Whether a parsed JSON value has the JSON type `kind` (true is not an integer here, unlike in Python)."""
    if kind in (int, float):
        return isinstance(value, int | kind) and not isinstance(value, bool)
    return isinstance(value, kind)


def _check_value(name: str, value: Any, field: Field) -> None:
    if not _is(value, field.kind):
        raise RequestError(f"`{name}` must be {_JSON_NAMES[field.kind]}, got {json.dumps(value)[:40]}")
    if field.kind is bool:
        return
    if field.kind in (int, float):
        size, shown, unit = value, f"`{name}` ({value})", ""
    else:
        size, unit = len(value), " characters" if field.kind is str else " elements"
        shown = f"`{name}` has {size}{unit};"
    if (field.lo is not None and size < field.lo) or (field.hi is not None and size > field.hi):
        limits = (f"between {_num(field.lo)} and {_num(field.hi)}" if field.lo is not None and field.hi is not None
                  else f"at least {_num(field.lo)}" if field.lo is not None else f"at most {_num(field.hi)}")
        raise RequestError(f"{shown} must be {limits}{unit}")
    if field.kind is list and field.item is not None:
        if field.item is str and all(type(e) is str for e in value) and (  # the common case, without a Python loop
                field.item_hi is None or not value or max(map(len, value)) <= field.item_hi):
            return
        for i, element in enumerate(value):
            if not _is(element, field.item):
                raise RequestError(f"`{name}[{i}]` must be {_JSON_NAMES[field.item]}, got {json.dumps(element)[:40]}")
            if field.item_hi is not None and len(element) > field.item_hi:
                raise RequestError(f"`{name}[{i}]` has {len(element)} characters; must be at most {field.item_hi}")


def _num(x: float | None) -> str:
    return str(int(x)) if x is not None and float(x).is_integer() else str(x)


def check_fields(payload: object, fields: Mapping[str, Field]) -> dict:
    """The parsed JSON body checked against `fields` (every allowed key), with the defaults of absent optional
    fields filled in; RequestError for anything else."""
    if not isinstance(payload, dict):
        raise RequestError(f"the body must be a JSON object such as {{\"{next(iter(fields))}\": ...}}, "
                           f"got {type(payload).__name__}", 400)
    unknown = [key for key in payload if key not in fields]
    if unknown:
        raise RequestError(f"unknown field `{unknown[0]}`; allowed fields: {', '.join(fields)}")
    checked = {}
    for name, field in fields.items():
        if name not in payload:
            if field.default is REQUIRED:
                raise RequestError(f"missing field `{name}`")
            checked[name] = list(field.default) if isinstance(field.default, list) else field.default
            continue
        value = payload[name]
        if not (value is None and field.default is None):
            _check_value(name, value, field)
        checked[name] = value
    return checked


def parse_json(body: bytes) -> object:
    """The JSON value of a request body; not JSON, NaN/Infinity or a repeated key -> RequestError (400)."""
    try:
        return json.loads(body, parse_constant=_no_constant, parse_float=_finite_float,
                          object_pairs_hook=_no_repeated_keys)
    except RequestError:
        raise
    except json.JSONDecodeError as err:
        reason = f"{err.msg} at line {err.lineno} column {err.colno}"
    except UnicodeDecodeError:
        reason = "not UTF-8 text"
    except (ValueError, RecursionError) as err:  # nesting too deep, an out-of-range number
        reason = type(err).__name__
    raise RequestError(f"the body is not valid JSON ({reason}); send one JSON object", 400)


def _no_constant(name: str) -> None:
    raise RequestError(f"the body holds {name}, which is not JSON; send finite numbers", 400)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 would parse as inf
        raise RequestError(f"the number {text[:20]} is too large; send finite numbers", 400)
    return value


def _no_repeated_keys(pairs: list[tuple[str, Any]]) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        repeated = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise RequestError(f"the field `{repeated}` is given twice; give it once", 400)
    return out
