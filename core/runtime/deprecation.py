"""Old public names (keywords, JSON fields, flags) that still work for now, each use with a DeprecationWarning."""

from __future__ import annotations

import argparse
import functools
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from core.runtime.errors import InputError


def warn_renamed(old: str, new: str, stacklevel: int = 2) -> None:
    warnings.warn(f"{old} is deprecated; use {new}", DeprecationWarning, stacklevel=stacklevel + 1)


def rename_old(values: dict[str, Any], names: Mapping[str, str], error: type[InputError] = InputError) -> dict:
    """`values` with each old name of `names` (old -> new) renamed, with a warning; old and new together: `error`."""
    for old, new in names.items():
        if old in values:
            if new in values:
                raise error(f"give `{new}` only, not also the deprecated `{old}`")
            warn_renamed(f"`{old}`", f"`{new}`", stacklevel=3)
            values[new] = values.pop(old)
    return values


def renamed_keywords(names: Mapping[str, str]) -> Callable[[Callable], Callable]:
    """A decorator: the function also takes the old keywords of `names`; its signature shows the new ones only."""
    return lambda fn: functools.wraps(fn)(lambda *args, **kwargs: fn(*args, **rename_old(kwargs, names)))


def add_old_flag(parser: argparse.ArgumentParser, old: str, new: str, **kwargs: Any) -> None:
    """A hidden flag `old` that stores what the flag `new` would (`const` when `nargs=0`), with a warning."""

    class OldFlag(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None) -> None:
            warn_renamed(old, new, stacklevel=1)
            setattr(namespace, self.dest, self.const if self.nargs == 0 else values)

    parser.add_argument(old, action=OldFlag, help=argparse.SUPPRESS, **kwargs)
