"""Splits: every user's sequence cut into a training history and evaluation cases (a target position, its
history everything before it); a target is never part of any training history."""

from __future__ import annotations

import bisect
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from core.runtime.errors import InputError

log = logging.getLogger(__name__)

SplitName = Literal["leave_one_out", "temporal"]


@dataclass(frozen=True)
class EvalCase:
    """One held-out event: `items[position]` is the target, `items[:position]` the history (never empty).
    `items` is the user's whole encoded sequence, shared, not copied."""

    user: str
    items: Sequence[int]
    position: int

    @property
    def target(self) -> int:
        return self.items[self.position]

    @property
    def history(self) -> Sequence[int]:
        return self.items[: self.position]


@dataclass
class Split:
    """Training histories (user -> encoded, chronological items) and evaluation cases."""

    train: dict[str, Sequence[int]]
    valid: list[EvalCase]
    test: list[EvalCase]


def leave_one_out_split(sequences: Mapping[str, Sequence[int]]) -> Split:
    """Last item = test, second-to-last = validation, the rest = training; users with fewer than 3 items train
    only. Views of one numpy array as `sequences` are shared by the histories and cases, not copied."""
    train, valid, test = {}, [], []
    short = 0
    for user, seq in sequences.items():
        if len(seq) < 3:
            train[user] = seq[:]
            short += 1
            continue
        train[user] = seq[:-2]
        valid.append(EvalCase(user, seq, len(seq) - 2))
        test.append(EvalCase(user, seq, len(seq) - 1))
    if short:
        log.info("%d users with fewer than 3 interactions are used for training only", short)
    return Split(train, valid, test)


def time_quantiles(timestamps: Mapping[str, Sequence[float]] | np.ndarray, quantiles: Sequence[float]) -> list[float]:
    """Global timestamp quantiles over all events (user -> timestamps, or one array): a temporal split's cutoffs."""
    if any(not 0.0 <= q <= 1.0 for q in quantiles):
        raise InputError(f"quantiles must lie in [0, 1], got {list(quantiles)}")
    flat = (timestamps if isinstance(timestamps, np.ndarray)
            else np.fromiter((t for ts in timestamps.values() for t in ts), dtype=np.float64))
    return [float(v) for v in np.quantile(flat, quantiles, method="lower")]


def temporal_split(sequences: Mapping[str, Sequence[int]], timestamps: Mapping[str, Sequence[float]],
                   valid_cutoff: float, test_cutoff: float) -> Split:
    """Train on events at or before `valid_cutoff`, validate on (valid_cutoff, test_cutoff], test on the rest,
    each target's history everything before it; a target with no earlier event (cold start) is skipped."""
    if valid_cutoff > test_cutoff:
        raise InputError(f"valid cutoff ({valid_cutoff}) must not exceed the test cutoff ({test_cutoff})")
    train, valid, test = {}, [], []
    cold = 0
    for user, seq in sequences.items():
        times = timestamps[user]
        n_train = bisect.bisect_right(times, valid_cutoff)  # times are sorted
        if n_train:
            train[user] = seq[:n_train]
        for pos in range(n_train, len(seq)):
            if pos == 0:
                cold += 1
                continue
            (valid if times[pos] <= test_cutoff else test).append(EvalCase(user, seq, pos))
    if cold:
        log.info("skipped %d evaluation targets of users with no earlier interaction (cold start)", cold)
    return Split(train, valid, test)

