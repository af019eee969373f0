"""Translate: the encoder-decoder translator built on `core` (docs/translate.md).

`from translate import Translator` (`translate.api`) is imported on first use, so `import translate` (every CLI) does
not pay for Lightning and the model until then."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from translate.api import Translator

__all__ = ["Translator"]


def __getattr__(name: str) -> Any:
    if name == "Translator":
        from translate.api import Translator

        return Translator
    raise AttributeError(f"module 'translate' has no attribute {name!r}")
