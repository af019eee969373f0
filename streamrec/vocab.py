"""The item vocabulary: original item ids (strings) <-> model ids 1..N; 0 is padding."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence

import numpy as np
from torch import Tensor

from core.errors import InputError
from streamrec.constants import PAD_ID

log = logging.getLogger(__name__)


def _sort_key(ids: Sequence[str]) -> Callable[[str], object]:
    # Numeric ids sort as numbers, so a SASRec file whose items are 1..N keeps its ids.
    if all(i.isascii() and i.isdecimal() for i in ids):
        return lambda i: (int(i), i)
    return lambda i: i


class ItemVocab:
    """Original item ids (strings) <-> model ids 1..N; 0 is padding.

    Args:
        items: the original ids; items[k] gets model id k + 1.
    """

    pad_id = PAD_ID

    def __init__(self, items: Sequence[str]):
        self.items = [str(i) for i in items]
        self.index = {item: k + 1 for k, item in enumerate(self.items)}
        if len(self.index) != len(self.items):
            dup = next(i for i in self.items if self.items.count(i) > 1)
            raise InputError(f"item id {dup!r} appears twice in the vocabulary; ids must be unique")

    @classmethod
    def build(cls, items: Iterable[str]) -> ItemVocab:
        """Vocabulary of the distinct ids, sorted (numerically when every id is a decimal number)."""
        unique = list(dict.fromkeys(items))
        return cls(sorted(unique, key=_sort_key(unique)))

    @property
    def num_items(self) -> int:
        """N, the number of real items (ids 1..N)."""
        return len(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __contains__(self, item: object) -> bool:
        return item in self.index

    def encode(self, items: Iterable[str], skip_unknown: bool = False) -> list[int]:
        """Original ids -> model ids.

        Args:
            items: original item ids.
            skip_unknown: drop ids not in the vocabulary (their count is logged) instead of raising.
        """
        items = list(items)
        unknown = [i for i in items if i not in self.index]
        if unknown and not skip_unknown:
            shown = ", ".join(repr(i) for i in unknown[:5])
            shown += f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
            raise InputError(f"unknown item ids {shown} (vocabulary has {len(self)} items); "
                             "pass skip_unknown=True to drop them")
        if unknown:
            log.warning("skipped %d unknown item ids (e.g. %r)", len(unknown), unknown[0])
        return [self.index[i] for i in items if i in self.index]

    def decode(self, ids: Iterable[int] | Tensor) -> list[str]:
        """Model ids (1..N) -> original ids."""
        ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        bad = [i for i in ids if not 1 <= i <= len(self.items)]
        if bad:
            raise InputError(f"model id {bad[0]} is not an item; ids run 1..{len(self.items)} (0 is padding)")
        return [self.items[i - 1] for i in ids]

    def to_dict(self) -> dict[str, list[str]]:
        """JSON-friendly form for checkpoints; `from_dict` inverts it."""
        return {"items": list(self.items)}

    @classmethod
    def from_dict(cls, state: dict[str, list[str]]) -> ItemVocab:
        """Rebuild a vocabulary saved with `to_dict`."""
        if not isinstance(state, dict) or not isinstance(state.get("items"), list):
            raise InputError("vocabulary state needs an 'items' list; was it written by ItemVocab.to_dict()?")
        return cls(state["items"])



def encode_codes(item_ids: Sequence[str], codes: np.ndarray) -> tuple[ItemVocab, np.ndarray]:
    """The vocabulary of the items `codes` uses, and `codes` (indices into `item_ids`) as its model ids.

    Args:
        item_ids: distinct original ids (`Interactions.item_ids`).
        codes: (E,) int32 indices into `item_ids`.

    Returns:
        The vocabulary (as `ItemVocab.build` over the used ids) and (E,) int32 model ids 1..N.
    """
    used = np.flatnonzero(np.bincount(codes, minlength=len(item_ids))).tolist()  # ids of dropped users go
    vocab = ItemVocab.build(item_ids[k] for k in used)
    model_id = np.zeros(len(item_ids), dtype=np.int32)
    model_id[used] = [vocab.index[item_ids[k]] for k in used]
    return vocab, model_id[codes]
