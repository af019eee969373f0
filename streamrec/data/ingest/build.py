"""Step 5 of reading a log: `Interactions` built from parsed chunks, holding int32 codes rather than id strings.

Id strings wait in a group that arrow's `dictionary_encode` encodes over [known ids] + the group, so known ids keep
their codes and the strings are freed. `build` groups the events by user with a counting sort (no (E,) int64 sort order)
and sorts by time only the stretches of users whose times go backwards: the peak is the codes and times twice, never the
strings of the whole log. Legend: E events, U users."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from core.runtime.errors import InputError
from streamrec.data.ingest.arrays import as_numpy
from streamrec.data.interactions import Interactions

_GROUP_ROWS = 1 << 19  # rows of id strings held before they are encoded: ~10 MB at short ids
_DEST_ROWS = 1 << 18  # events placed per step of the counting sort (its temporaries: ~8 MB)
_SORT_ROWS = 1 << 20  # events per stretch of users sorted by time at once


class _Column:
    """A numpy array filled in order, grown by 1.5x: one big array, not chunks, since glibc serves small blocks
    from a heap whose freed chunks stay resident; reserved, unwritten capacity costs no memory."""

    def __init__(self, dtype: type):
        self.data = np.empty(0, dtype=dtype)

    def reserve(self, size: int) -> None:
        if size > len(self.data):
            grown = np.empty(max(size, len(self.data) * 3 // 2), dtype=self.data.dtype)
            grown[: len(self.data)] = self.data
            self.data = grown

    def write(self, start: int, values: np.ndarray) -> None:
        self.reserve(start + len(values))
        self.data[start : start + len(values)] = values


class InteractionsBuilder:
    """Chunks of (user ids, item ids, times) in file order -> `Interactions`; `path` is named in errors."""

    def __init__(self, path: Path):
        self.path = path
        self.ids: dict[str, pa.Array | None] = {"users": None, "items": None}  # distinct ids, by code
        self.pending: list[tuple[pa.Array, pa.Array]] = []  # id strings of rows encoded_rows..rows
        self.encoded_rows = self.rows = 0
        self.user_codes, self.item_codes, self.times = _Column(np.int32), _Column(np.int32), _Column(np.float64)
        self.timed: bool | None = None  # None until the first non-empty chunk
        self.mixed = False

    def expect(self, rows: int) -> None:
        """Reserve room for about `rows` more events (a reader's estimate; more are taken as they come)."""
        for column in (self.user_codes, self.item_codes) + ((self.times,) if self.timed is not False else ()):
            column.reserve(self.rows + rows)

    def add(self, users: pa.Array, items: pa.Array, times: np.ndarray | None) -> None:
        if not len(users):
            return
        if self.timed is None:
            self.timed = times is not None
            if not self.timed:
                self.times = _Column(np.float64)  # drop a reservation made before the format was known
        if self.timed != (times is not None):
            self.mixed = True
            return
        if times is not None:
            self.times.write(self.rows, times)
        self.pending.append((pc.cast(users, pa.large_string()), pc.cast(items, pa.large_string())))
        self.rows += len(users)
        known = max((len(d) for d in self.ids.values() if d is not None), default=0)
        if self.rows - self.encoded_rows >= max(_GROUP_ROWS, known):  # re-hashing the known ids costs at most the group
            self._encode_pending()

    def mark(self) -> tuple:
        """The state `rollback` returns to (before a file that may be read again)."""
        return (self.encoded_rows, self.rows, list(self.pending), self.timed, self.mixed,
                {k: 0 if d is None else len(d) for k, d in self.ids.items()})

    def rollback(self, state: tuple) -> None:
        """Forget everything added since `mark`: ids first seen since then lose their codes too."""
        # Rows from the mark on are written again; a group encoded since is encoded again from these strings.
        self.encoded_rows, self.rows, pending, self.timed, self.mixed, sizes = state
        self.pending = list(pending)
        self.ids = {k: d if d is None else d.slice(0, sizes[k]) for k, d in self.ids.items()}

    def _encode_pending(self) -> None:
        if not self.pending:
            return
        for key, col, out in (("users", 0, self.user_codes), ("items", 1, self.item_codes)):
            known = self.ids[key]
            parts = ([] if known is None else [known]) + [p[col] for p in self.pending]
            encoded = pc.dictionary_encode(pa.chunked_array(parts, pa.large_string()))
            self.ids[key] = encoded.chunks[-1].dictionary  # the known ids first, then the new ones
            skip, start = 0 if known is None else len(known), self.encoded_rows  # the known ids' own codes
            for chunk in encoded.chunks:  # not one chunk per part: arrow drops empty ones
                codes = as_numpy(chunk.indices)[skip:]
                skip = max(0, skip - len(chunk))
                out.write(start, codes)
                start += len(codes)
        self.pending, self.encoded_rows = [], self.rows
        pa.default_memory_pool().release_unused()  # the strings, freed: with malloc (readers) a trim

    def build(self) -> Interactions:
        """The events grouped by user (first appearance order), each user's in stable time order."""
        self._encode_pending()
        if self.mixed:
            raise InputError(f"{self.path}: some files have timestamps and some do not; pass time_col=None "
                             "or give every file a time column")
        if not self.rows:
            raise InputError(f"{self.path}: no interactions found; the file must hold at least one (user, item) row")
        users, item_ids = (self.ids[k].to_pylist() for k in ("users", "items"))
        self.ids = {"users": None, "items": None}
        pa.default_memory_pool().release_unused()
        user_codes = self.user_codes.data[: self.rows]
        offsets = np.zeros(len(users) + 1, dtype=np.int64)
        np.cumsum(np.bincount(user_codes, minlength=len(users)), out=offsets[1:])
        dest = _destinations(user_codes, offsets)  # in place of the user codes when int32 holds E
        self.user_codes = None
        codes = np.empty(self.rows, dtype=np.int32)
        codes[dest] = self.item_codes.data[: self.rows]
        self.item_codes = None  # freed before the times are placed
        times = None
        if self.timed:
            times = np.empty(self.rows, dtype=np.float64)
            times[dest] = self.times.data[: self.rows]
            self.times = None
            _sort_by_time(codes, times, offsets)
        del dest
        pa.default_memory_pool().release_unused()  # and the counting sort's temporaries
        return Interactions(users, item_ids, codes, offsets, times)


def _destinations(user_codes: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """(E,) each event's position in the user-grouped order (stable): a counting sort, each step of `_DEST_ROWS`
    events sorted by (user, position) to number a user's events within it."""
    fill = offsets[:-1].copy()  # (U,) the next free slot of each user
    dest = user_codes if offsets[-1] < 2**31 else np.empty(len(user_codes), dtype=np.int64)
    for start in range(0, len(user_codes), _DEST_ROWS):
        u = user_codes[start : start + _DEST_ROWS]
        key = (u.astype(np.int64) << 32) | np.arange(len(u))  # unique keys: a fast unstable sort is stable
        key.sort()
        order, users = key & 0xFFFFFFFF, key >> 32
        starts = np.flatnonzero(np.concatenate([[True], users[1:] != users[:-1]]))
        runs = np.diff(np.append(starts, len(u)))
        rank = np.arange(len(u)) - np.repeat(starts, runs)  # place among the user's events of this step
        dest[start + order] = fill[users] + rank  # after `users` was read from u: in place is safe
        fill[users[starts]] += runs
    return dest


def _sort_by_time(codes: np.ndarray, times: np.ndarray, offsets: np.ndarray) -> None:
    """Stable sort of each user's events by time, in place, a stretch of users at a time."""
    num_users, a = len(offsets) - 1, 0
    while a < num_users:
        b = min(num_users, max(a + 1, int(np.searchsorted(offsets, offsets[a] + _SORT_ROWS, side="right")) - 1))
        s, e = int(offsets[a]), int(offsets[b])
        t = times[s:e]
        back = t[1:] < t[:-1]
        back[offsets[a + 1 : b] - s - 1] = False  # the first event of the next user may be older
        if back.any():
            user = np.repeat(np.arange(b - a, dtype=np.int32), np.diff(offsets[a : b + 1]))
            order = np.lexsort((t, user))  # stable: equal times keep file order
            codes[s:e], times[s:e] = codes[s:e][order], t[order]
        a = b
