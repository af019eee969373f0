"""Datasets and collate functions: SASRec-style causal training examples and evaluation batches.

`TrainDataset` + `collate_train` give the last max_len+1 training items, inputs = seq[:-1],
targets = seq[1:], both left-padded with 0 (target 0 = ignore). `EvalDataset` + `collate_eval`
give the last max_len history items, the held-out target and every item already seen (for
filtering). `collate_predict` does the same for whole sequences. `LengthGroupedSampler` orders
training windows so that each batch holds windows of similar length.

Legend: B batch, T time (= max_len), L longest seen-item list in the batch, N items.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from core.resume import EpochRandomSampler
from streamrec.constants import PAD_ID
from streamrec.splits import EvalCase, Split

log = logging.getLogger(__name__)


def training_windows(history: Sequence[int], max_len: int, sliding_window: bool = False) -> list[list[int]]:
    """Cut a training history into windows of at most max_len + 1 items (max_len next-item pairs).

    By default only the last window is kept, as SASRec does. With `sliding_window` the windows
    step back by max_len and overlap by one item, so every transition is a target exactly once.

    Args:
        history: encoded chronological items.
        max_len: model context length T.
        sliding_window: also cover the older part of long histories.
    """
    windows = []
    end = len(history)
    while end >= 2:
        windows.append(list(history[max(0, end - max_len - 1) : end]))
        if not sliding_window:
            break
        end -= max_len
    return windows[::-1]


def _left_padded(rows: Sequence[Sequence[int]], length: int) -> Tensor:
    """(B, length) int64: each row's last `length` ids, right-aligned, 0 before them."""
    out = np.full((len(rows), length), PAD_ID, dtype=np.int64)
    for r, ids in enumerate(rows):
        ids = np.asarray(ids, dtype=np.int64)[len(ids) - length if len(ids) > length else 0 :]
        out[r, length - len(ids) :] = ids
    return torch.from_numpy(out)


def _seen(histories: Sequence[Sequence[int]]) -> Tensor:
    """(B, L) int64: each history's distinct ids in order of first occurrence, right-padded with 0."""
    seen = []
    for h in histories:
        h = np.asarray(h, dtype=np.int64)
        _, first = np.unique(h, return_index=True)
        seen.append(h[np.sort(first)])
    out = np.full((len(seen), max(len(s) for s in seen)), PAD_ID, dtype=np.int64)
    for r, s in enumerate(seen):
        out[r, : len(s)] = s
    return torch.from_numpy(out)


class TrainBatch(NamedTuple):
    """Causal next-item batch.

    Args:
        inputs: (B, T) item ids, left-padded with 0.
        targets: (B, T) the item after each input position; 0 = ignore.
        mean_positions: the epoch's mean count of targets a batch; the loss is then summed over the batch's
            targets and divided by it, so every target weighs the same in whichever batch it falls. Length-grouped
            batches need it: their counts differ up to max_len times, and a plain mean would weigh each target of
            a batch of short histories far above one of long histories. None: the batch's own mean.
    """

    inputs: Tensor
    targets: Tensor
    mean_positions: float | None = None


class EvalBatch(NamedTuple):
    """Held-out next-item batch.

    Args:
        rows: (B,) row of each case in its `EvalDataset` (maps scores back to users).
        inputs: (B, T) the last T history items, left-padded with 0.
        targets: (B,) the held-out item.
        seen: (B, L) distinct items of the whole history, right-padded with 0.
    """

    rows: Tensor
    inputs: Tensor
    targets: Tensor
    seen: Tensor


class TrainDataset(Dataset):
    """Training windows of every user with at least two training items.

    The windows are (start, end) spans of one flat int32 array of items, which may be a read-only
    memory map (`from_spans`): DataLoader workers and DDP ranks on a node then share its pages.

    Args:
        histories: encoded training histories, one per user.
        max_len: model context length T.
        sliding_window: one window per max_len items instead of only the last one.
    """

    def __init__(self, histories: Iterable[Sequence[int]], max_len: int, sliding_window: bool = False):
        histories = [np.asarray(h, dtype=np.int32) for h in histories]
        lengths = np.array([len(h) for h in histories], dtype=np.int64)
        ends = np.cumsum(lengths)
        flat = np.concatenate(histories) if histories else np.zeros(0, dtype=np.int32)
        self._init(flat, ends - lengths, ends, max_len, sliding_window)

    @classmethod
    def from_spans(cls, items: np.ndarray, starts: np.ndarray, ends: np.ndarray, max_len: int,
                   sliding_window: bool = False) -> TrainDataset:
        """Histories items[starts[k] : ends[k]] of one flat array, which is kept, not copied.

        Args:
            items: (E,) encoded items, e.g. `np.load(..., mmap_mode="r")`.
            starts: (U,) first index of each history.
            ends: (U,) one past the last index of each history.
            max_len: model context length T.
            sliding_window: one window per max_len items instead of only the last one.
        """
        dataset = cls.__new__(cls)
        dataset._init(items, np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64), max_len,
                      sliding_window)
        return dataset

    def _init(self, items: np.ndarray, starts: np.ndarray, ends: np.ndarray, max_len: int,
              sliding_window: bool) -> None:
        # The windows `training_windows` cuts, for all histories at once: window j (0 = the last) of a
        # history ends j * max_len items before its end; each history's windows go oldest first.
        lengths = ends - starts
        counts = np.where(lengths >= 2, (lengths - 2) // max_len + 1 if sliding_window else 1, 0)
        too_short = int((lengths < 2).sum())
        if too_short:
            log.info("%d users have fewer than 2 training interactions and give no training example", too_short)
        history = np.repeat(np.arange(len(lengths)), counts)
        first = np.cumsum(counts) - counts  # (U,) index of each history's first window
        j = counts[history] - 1 - (np.arange(len(history)) - first[history])  # counts down to 0 per history
        self.items = items
        self.ends = ends[history] - j * max_len
        self.starts = np.maximum(starts[history], self.ends - max_len - 1)

    @property
    def windows(self) -> list[list[int]]:
        """Every window as a list (for inspection; batches read spans of `items`)."""
        return [self.items[a:b].tolist() for a, b in zip(self.starts.tolist(), self.ends.tolist(), strict=True)]

    @property
    def lengths(self) -> np.ndarray:
        """(len(self),) input length of every window (its items less the last, which is only a target)."""
        return self.ends - self.starts - 1

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.items[self.starts[i] : self.ends[i]]


class LengthGroupedSampler(EpochRandomSampler):
    """A shuffled order in which every run of `batch_size` indices has windows of similar length.

    The model skips the columns that are padding in every row of a batch (`StreamRecModel.encode(trim=True)`),
    so a batch of similar lengths computes little padding. On ML-1M at max_len 200, random batches are padded
    to 200 almost always; grouped ones compute 54% of those positions and 41% of the attention.

    Each epoch draws a permutation from (seed, epoch), cuts it into groups of `group_batches` batches, sorts
    each group by length (stably: equal lengths stay in random order), cuts it into batches and shuffles the
    full batches; a short last batch stays last, so a `DataLoader(batch_size=batch_size)` cuts exactly these
    batches. Every window is still seen once an epoch. Under DDP Lightning replaces this sampler (it is a
    `RandomSampler`) with its `DistributedSampler`, which shuffles without grouping.

    Args:
        lengths: (W,) length of every window (`TrainDataset.lengths`).
        batch_size: the loader's batch size.
        seed: seed of the permutations; the same (seed, epoch) gives the same order.
        group_batches: batches per sorted group; more gives less padding and less random batches.
    """

    def __init__(self, lengths: np.ndarray, batch_size: int, seed: int = 0, group_batches: int = 64):
        super().__init__(range(len(lengths)), seed)
        self.lengths, self.batch_size, self.group_batches = np.asarray(lengths), batch_size, group_batches

    def __iter__(self) -> Iterator[int]:
        rng = np.random.default_rng([self.seed, self.epoch])
        order = rng.permutation(len(self.lengths))
        group = self.group_batches * self.batch_size
        for start in range(0, len(order), group):
            chunk = order[start : start + group]
            order[start : start + group] = chunk[np.argsort(self.lengths[chunk], kind="stable")]
        full = len(order) // self.batch_size * self.batch_size
        batches = order[:full].reshape(-1, self.batch_size)  # (full batches, batch_size)
        order[:full] = batches[rng.permutation(len(batches))].ravel()
        start, self.skip = self.skip, 0
        yield from order[start:].tolist()


class EvalDataset(Dataset):
    """Evaluation cases, returned with their row index.

    Args:
        cases: the held-out events.
    """

    def __init__(self, cases: Sequence[EvalCase]):
        self.cases = list(cases)

    def __len__(self) -> int:
        return len(self.cases)

    def __getitem__(self, i: int) -> tuple[int, EvalCase]:
        return i, self.cases[i]


def collate_train(windows: Sequence[Sequence[int]], max_len: int, mean_positions: float | None = None) -> TrainBatch:
    """Windows of <= max_len + 1 items -> inputs = w[:-1], targets = w[1:], left-padded to max_len.

    Args:
        windows: from `TrainDataset`.
        max_len: model context length T.
        mean_positions: passed on to the batch (see `TrainBatch`).
    """
    return TrainBatch(_left_padded([w[:-1] for w in windows], max_len), _left_padded([w[1:] for w in windows], max_len),
                      mean_positions)


def collate_eval(cases: Sequence[tuple[int, EvalCase]], max_len: int) -> EvalBatch:
    """Cases -> last max_len history items (left-padded), targets, and seen items (right-padded).

    Args:
        cases: (row, case) pairs from `EvalDataset`.
        max_len: model context length T.
    """
    histories = [case.history for _, case in cases]
    return EvalBatch(
        rows=torch.tensor([i for i, _ in cases], dtype=torch.long),
        inputs=_left_padded(histories, max_len),
        targets=torch.tensor([int(case.target) for _, case in cases], dtype=torch.long),
        seen=_seen(histories),  # (B, L)
    )


class PredictBatch(NamedTuple):
    """Whole histories to recommend after (`predict`).

    Args:
        rows: (B,) position of each user in `user_sequences` order.
        users: the user ids.
        inputs: (B, T) the last T items of the whole history, left-padded with 0.
        seen: (B, L) distinct items of the whole history, right-padded with 0.
    """

    rows: Tensor
    users: list[str]
    inputs: Tensor
    seen: Tensor


def user_sequences(split: Split) -> dict[str, Sequence[int]]:
    """Every user's whole encoded sequence (training part and held-out items), in input order."""
    sequences: dict[str, Sequence[int]] = dict(split.train)
    for case in (*split.valid, *split.test):
        sequences[case.user] = case.items  # a case holds the whole sequence
    return sequences


def collate_predict(rows: Sequence[tuple[int, tuple[str, Sequence[int]]]], max_len: int) -> PredictBatch:
    """(row, (user, sequence)) pairs -> the last max_len items (left-padded) and the seen items (right-padded).

    Args:
        rows: from `StreamRecDataModule.predict_dataloader`'s dataset.
        max_len: model context length T.
    """
    sequences = [seq for _, (_, seq) in rows]
    return PredictBatch(
        rows=torch.tensor([i for i, _ in rows], dtype=torch.long),
        users=[user for _, (user, _) in rows],
        inputs=_left_padded(sequences, max_len),
        seen=_seen(sequences),  # (B, L)
    )


def item_counts(histories: Iterable[Sequence[int]], num_items: int) -> Tensor:
    """How often each item occurs in the histories, (N + 1,) int64 with 0 at padding.

    Args:
        histories: encoded item sequences.
        num_items: N.
    """
    flat = np.concatenate([np.zeros(0, dtype=np.int64), *(np.asarray(h, dtype=np.int64) for h in histories)])
    return torch.from_numpy(np.bincount(flat, minlength=num_items + 1)[: num_items + 1])
