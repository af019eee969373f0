"""The item vocabulary: original item ids (strings) <-> model ids 1..N; 0 is padding.

A catalogue may have millions of items, so the ids are one arrow string array looked up through their sorted
`hash(str)`s (a string comparison settles a match), not N Python strings and a dict; `items` and `index` show them as a
list and a dict. The hashes hold for this process only: checkpoints keep the ids (`to_dict`). Legend: N items, M
looked-up ids."""

from __future__ import annotations

import logging
import operator
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import suppress

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from torch import Tensor

from core.runtime.errors import InputError
from streamrec.data.constants import PAD_ID

log = logging.getLogger(__name__)

VOCAB_KEY = "streamrec_item_vocab"  # where a checkpoint holds the vocabulary (`ItemVocab.to_dict`)

_BLOCK = 1 << 16  # ids turned into Python strings at once, to hash them
_CACHE = 1 << 16  # single-id lookups remembered (`x in vocab` is usually followed by `index[x]`)
_hash = hash  # str -> int64; a module attribute so that tests can force collisions


def _sort_key(ids: Sequence[str]) -> Callable[[str], object]:
    # Numeric ids sort as numbers, so a SASRec file whose items are 1..N keeps its ids.
    if all(i.isascii() and i.isdecimal() for i in ids):
        return lambda i: (int(i), i)
    return lambda i: i


def _strings(values: Sequence[object] | pa.Array, convert: bool) -> tuple[pa.Array, np.ndarray]:
    """`values` as one arrow large_string array and the (N,) int64 `hash` of each string; non-strings become
    `str(v)` (`convert`) or null (never found). An arrow array is hashed a block of Python strings at a time."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array):
        strings = values.cast(pa.large_string())
        out = np.empty(len(strings), np.int64)
        for lo in range(0, len(strings), _BLOCK):
            block = strings.slice(lo, _BLOCK).to_pylist()
            out[lo : lo + len(block)] = np.fromiter(map(_hash, block), np.int64, count=len(block))
        return strings, out
    with suppress(pa.ArrowTypeError, pa.ArrowInvalid, UnicodeEncodeError):  # non-strings, lone surrogates
        # Looked-up values get their type inferred: given large_string, arrow would take bytes as text (and
        # hash(b"x") == hash("x")), so b"x" would be found where `b"x" in vocab` is False.
        strings = pa.array(values, pa.large_string() if convert else None)
        if isinstance(strings, pa.ChunkedArray):  # inferred strings past 2 GB
            strings = strings.cast(pa.large_string()).combine_chunks()
        if not strings.null_count and (pa.types.is_string(strings.type) or pa.types.is_large_string(strings.type)):
            return strings.cast(pa.large_string()), np.fromiter(map(_hash, values), np.int64, count=len(strings))
    return _strings(pa.array([_text(v, convert) for v in values], pa.large_string()), convert)


def _text(value: object, convert: bool) -> str | None:
    """A value as an id: its text (`convert`), else None (never found) unless it is a string arrow can hold; an
    unhashable value raises TypeError, as in a list's `in` and a dict."""
    if isinstance(value, str):
        try:
            value.encode()
            return value
        except UnicodeEncodeError:  # a lone surrogate: no item id read from a file has one
            if convert:
                raise InputError(f"item id {value!r} is not valid UTF-8 text; ids must be UTF-8") from None
            return None
    if convert:
        return str(value)
    hash(value)
    return None


class ItemIds(Sequence):
    """The original ids in model-id order (item k+1 at position k): a read-only list over the arrow array."""

    def __init__(self, ids: pa.Array):
        self._ids = ids

    def __len__(self) -> int:
        return len(self._ids)

    def __getitem__(self, k: int | slice) -> str | list[str]:
        if isinstance(k, slice):
            return self._ids.take(np.arange(len(self._ids))[k]).to_pylist()
        k = operator.index(k)
        if not -len(self._ids) <= k < len(self._ids):
            raise IndexError(f"item position {k} out of range ({len(self._ids)} items)")
        return self._ids[k].as_py()

    def __iter__(self) -> Iterator[str]:
        for lo in range(0, len(self._ids), _BLOCK):
            yield from self._ids.slice(lo, _BLOCK).to_pylist()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ItemIds):
            return self._ids.equals(other._ids)
        if isinstance(other, list):
            return len(other) == len(self) and list(self) == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # like a list

    def __repr__(self) -> str:
        shown = ", ".join(repr(i) for i in self[:5])
        return f"ItemIds([{shown}{', ...' if len(self) > 5 else ''}], {len(self)} items)"


class ItemIndex(Mapping):
    """Original id -> model id (1..N): a read-only dict over the vocabulary's sorted hashes."""

    def __init__(self, vocab: ItemVocab):
        self._vocab = vocab

    def __getitem__(self, item: str) -> int:
        found = self._vocab._find(item)
        if not found:
            raise KeyError(item)
        return found

    def __iter__(self) -> Iterator[str]:
        return iter(self._vocab.items)

    def __len__(self) -> int:
        return len(self._vocab)


class ItemVocab:
    """Original item ids (strings) <-> model ids 1..N; 0 is padding. items[k] (a list or an arrow string array)
    gets model id k + 1."""

    pad_id = PAD_ID

    def __init__(self, items: Sequence[str] | pa.Array):
        ids, hashes = _strings(items, convert=True)
        self._ids = ids.cast(pa.string()) if ids.nbytes < 2**31 - 2**20 else ids  # int32 offsets where they fit
        order = np.argsort(hashes, kind="stable")
        self._sorted = hashes[order]  # (N,) ascending
        self._order = order.astype(np.int32 if len(order) < 2**31 else np.int64)  # (N,) position of each hash
        del ids, hashes, order
        pa.default_memory_pool().release_unused()  # arrow's pool keeps the builders' freed buffers otherwise
        _, offsets, data = self._ids.buffers()
        width = np.int32 if pa.types.is_string(self._ids.type) else np.int64
        self._offsets = np.frombuffer(offsets, width)[self._ids.offset :]  # (N+1,) byte ranges in `_bytes`
        self._bytes = memoryview(data if data is not None else b"").cast("B")  # unsigned: compares equal to bytes
        self._cache: dict[str, int] = {}
        self.items = ItemIds(self._ids)
        self.index = ItemIndex(self)
        self._check_unique()

    def _check_unique(self) -> None:
        """Ids sharing a hash are compared as strings (equal ids always share one; other pairs almost never)."""
        equal = self._sorted[1:] == self._sorted[:-1]
        shared = np.zeros(len(self._sorted), dtype=bool)
        shared[1:] |= equal
        shared[:-1] |= equal
        positions = self._order[shared]
        shared_ids = self._ids.take(positions).to_pylist()
        counts = Counter(shared_ids)
        dups = [int(p) for p, item in zip(positions, shared_ids, strict=True) if counts[item] > 1]
        if dups:
            raise InputError(f"item id {self.items[min(dups)]!r} appears twice in the vocabulary; ids must be unique")

    def __getstate__(self) -> dict[str, pa.Array]:
        return {"items": self._ids}  # not the hashes: another process hashes strings with another seed

    def __setstate__(self, state: dict[str, pa.Array]) -> None:
        self.__init__(state["items"])

    @classmethod
    def build(cls, items: Iterable[str]) -> ItemVocab:
        """Vocabulary of the distinct ids, sorted (numerically when every id is a decimal number)."""
        unique = list(dict.fromkeys(items))
        return cls(sorted(unique, key=_sort_key(unique)))

    def extended(self, items: Iterable[str]) -> ItemVocab:
        """This vocabulary with the ids of `items` it lacks appended as N+1, ... (sorted as `build` sorts): an
        encoded log stays valid, as cold items (in an item features file, not in the log) are added."""
        unique = list(dict.fromkeys(items))
        new = [i for i, found in zip(unique, self.lookup(unique).tolist(), strict=True) if not found]
        if not new:
            return self
        added = pa.array(sorted(new, key=_sort_key(new)), pa.large_string())
        return ItemVocab(pa.concat_arrays([self._ids.cast(pa.large_string()), added]))

    @property
    def num_items(self) -> int:
        return len(self._ids)

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, item: object) -> bool:
        return bool(self._find(item))

    def _find(self, item: object) -> int:
        """The model id of one original id, 0 when absent (non-strings are never ids)."""
        if not isinstance(item, str):
            hash(item)  # an unhashable key raises TypeError, as a dict lookup did
            return 0
        found = self._cache.get(item)
        if found is not None:
            return found
        h = _hash(item)
        lo, hi = int(self._sorted.searchsorted(h, "left")), int(self._sorted.searchsorted(h, "right"))
        found = self._match(item.encode(errors="surrogatepass"), lo, hi)  # never matches bad UTF-8
        if len(self._cache) >= _CACHE:
            self._cache.clear()
        self._cache[item] = found
        return found

    def lookup(self, items: Sequence[str] | pa.Array) -> np.ndarray:
        """Model ids of many original ids at once: (M,) int64, 0 where an id is not in the vocabulary."""
        query, hashes = _strings(items, convert=False)
        out = np.zeros(len(query), dtype=np.int64)
        if not len(query) or not len(self._ids):
            return out
        lo = np.searchsorted(self._sorted, hashes, side="left")
        hi = np.searchsorted(self._sorted, hashes, side="right")
        pos = self._order[np.minimum(lo, len(self._order) - 1)]  # the first id with that hash
        same = pc.equal(self._ids.take(pos), query).fill_null(False).to_numpy(zero_copy_only=False)
        out[(hi - lo >= 1) & same] = pos[(hi - lo >= 1) & same] + 1
        for j in np.flatnonzero((hi - lo > 1) & ~same).tolist():  # another id with the same hash: compare each
            out[j] = self._match(query[j].as_py().encode(), int(lo[j]) + 1, int(hi[j]))
        return out

    def _match(self, key: bytes, lo: int, hi: int) -> int:
        """The model id of the id whose UTF-8 bytes are `key` among sorted hashes lo..hi-1 (all one hash), else 0."""
        return next((p + 1 for p in self._order[lo:hi].tolist()
                     if self._bytes[self._offsets.item(p) : self._offsets.item(p + 1)] == key), 0)

    def encode(self, items: Iterable[str], skip_unknown: bool = False) -> list[int]:
        """Original ids -> model ids; `skip_unknown` drops ids not in the vocabulary (logged) instead of raising."""
        items = list(items)
        ids = self.lookup(items)
        unknown = [items[j] for j in np.flatnonzero(ids == 0).tolist()]
        if unknown and not skip_unknown:
            shown = ", ".join(repr(i) for i in unknown[:5])
            shown += f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
            raise InputError(f"unknown item ids {shown} (vocabulary has {len(self)} items); "
                             "pass skip_unknown=True to drop them")
        if unknown:
            log.warning("skipped %d unknown item ids (e.g. %r)", len(unknown), unknown[0])
        return ids[ids != 0].tolist()

    def decode(self, ids: Iterable[int] | Tensor) -> list[str]:
        ids = np.asarray(ids.tolist() if isinstance(ids, Tensor) else list(ids), dtype=np.int64).reshape(-1)
        bad = ids[(ids < 1) | (ids > len(self._ids))]
        if bad.size:
            raise InputError(f"model id {int(bad[0])} is not an item; ids run 1..{len(self._ids)} (0 is padding)")
        return self._ids.take(ids - 1).to_pylist()

    def to_dict(self) -> dict[str, list[str]]:
        return {"items": self._ids.to_pylist()}

    @classmethod
    def from_dict(cls, state: dict[str, list[str]]) -> ItemVocab:
        if not isinstance(state, dict) or not isinstance(state.get("items"), list):
            raise InputError("vocabulary state needs an 'items' list; was it written by ItemVocab.to_dict()?")
        return cls(state["items"])


def encode_codes(item_ids: Sequence[str], codes: np.ndarray) -> tuple[ItemVocab, np.ndarray]:
    """The vocabulary (`ItemVocab.build`) of the items the (E,) `codes` (indices into `item_ids`) use, and
    `codes` as (E,) int32 model ids."""
    used = np.flatnonzero(np.bincount(codes, minlength=len(item_ids))).tolist()  # ids of dropped users go
    vocab = ItemVocab.build(item_ids[k] for k in used)
    model_id = np.zeros(len(item_ids), dtype=np.int32)
    model_id[used] = vocab.lookup([item_ids[k] for k in used])
    return vocab, model_id[codes]
