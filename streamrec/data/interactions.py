"""`Interactions`: every user's events in chronological order, as one int32 array of item codes and (U + 1,)
offsets rather than Python lists of strings, so a big log stays small and can be memory-mapped."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

log = logging.getLogger(__name__)


class _PerUser(Mapping):
    """user -> that user's slice of a column, decoded to a list (a view: nothing is copied until asked)."""

    def __init__(self, inter: Interactions, values: np.ndarray, decode: Sequence[str] | None):
        self._inter, self._values, self._decode = inter, values, decode

    def __getitem__(self, user: str) -> list:
        k = self._inter.user_index[user]
        part = self._values[self._inter.offsets[k] : self._inter.offsets[k + 1]]
        return [self._decode[c] for c in part.tolist()] if self._decode is not None else part.tolist()

    def __iter__(self) -> Iterator[str]:
        return iter(self._inter.users)

    def __len__(self) -> int:
        return len(self._inter.users)

    def __repr__(self) -> str:
        shown = ", ".join(f"{u!r}: {self[u]!r}" for u in self._inter.users[:3])
        return "{" + shown + (", ...}" if len(self) > 3 else "}")


@dataclass(eq=False)
class Interactions:
    """Per-user chronological item sequences, users in order of first appearance: user k's events are
    codes[offsets[k] : offsets[k + 1]] (int32 indices into `item_ids`), oldest first; `times` aligned, or None."""

    users: list[str]
    item_ids: list[str]
    codes: np.ndarray
    offsets: np.ndarray
    times: np.ndarray | None = None

    def __post_init__(self) -> None:
        self._user_index: dict[str, int] | None = None

    @classmethod
    def from_dict(cls, items: Mapping[str, Sequence[str]], timestamps: Mapping[str, Sequence[float]] | None = None,
                  ) -> Interactions:
        """Build from user -> chronological item ids (and timestamps), e.g. hand-written test data."""
        item_ids = list(dict.fromkeys(i for seq in items.values() for i in seq))
        index = {item: k for k, item in enumerate(item_ids)}
        codes = np.array([index[i] for seq in items.values() for i in seq], dtype=np.int32)
        offsets = np.concatenate([[0], np.cumsum([len(seq) for seq in items.values()], dtype=np.int64)])
        times = None if timestamps is None else np.array([t for u in items for t in timestamps[u]], dtype=np.float64)
        return cls(list(items), item_ids, codes, offsets.astype(np.int64), times)

    @property
    def user_index(self) -> dict[str, int]:
        if self._user_index is None:
            self._user_index = {u: k for k, u in enumerate(self.users)}
        return self._user_index

    @property
    def items(self) -> Mapping[str, list[str]]:
        return _PerUser(self, self.codes, self.item_ids)

    @property
    def timestamps(self) -> Mapping[str, list[float]] | None:
        return None if self.times is None else _PerUser(self, self.times, None)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def num_interactions(self) -> int:
        return len(self.codes)

    def drop_short_users(self, min_interactions: int) -> Interactions:
        """Users with fewer than `min_interactions` events removed (the count goes to the log)."""
        lengths = self.lengths
        keep = lengths >= min_interactions
        dropped = int((~keep).sum())
        if not dropped:
            return self
        log.info("skipped %d of %d users with fewer than %d interactions", dropped, len(self.users), min_interactions)
        return self.select(np.repeat(keep, lengths))

    def select(self, keep: np.ndarray) -> Interactions:
        """The events where the (E,) bool `keep` is True, in their order; users left with none are removed."""
        if keep.all():
            return self
        # Every user has an event, so the starts increase strictly, as reduceat needs.
        counts = np.add.reduceat(keep.view(np.uint8), self.offsets[:-1], dtype=np.int64)  # (U,) kept per user
        offsets = np.concatenate([[0], np.cumsum(counts[counts > 0], dtype=np.int64)])
        users = [u for u, n in zip(self.users, counts.tolist(), strict=True) if n]
        times = None if self.times is None else self.times[keep]
        return Interactions(users, self.item_ids, self.codes[keep], offsets, times)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Interactions):
            return NotImplemented
        same_times = (self.times is None) == (other.times is None) and (
            self.times is None or dict(self.timestamps) == dict(other.timestamps))
        return self.users == other.users and dict(self.items) == dict(other.items) and same_times

    def __repr__(self) -> str:
        return (f"Interactions({len(self.users)} users, {self.num_interactions} events, {len(self.item_ids)} items, "
                f"items={self.items!r}, timed={self.times is not None})")
