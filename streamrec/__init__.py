"""StreamRec: a causal session recommender built on `core` (docs/streamrec.md).

`from streamrec import Recommender` is the Python API (`streamrec.api`); it is imported on first use, so
`import streamrec` (every CLI) does not pay for Lightning and the model until then."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from streamrec.api import Recommender

__all__ = ["Recommender"]


def __getattr__(name: str) -> Any:
    if name == "Recommender":
        from streamrec.api import Recommender

        return Recommender
    raise AttributeError(f"module 'streamrec' has no attribute {name!r}")
