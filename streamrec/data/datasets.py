"""SASRec-style causal training windows and evaluation batches; evaluation batches carry every item already
seen, for filtering. Legend: B batch, T time (= max_len), L longest seen-item list in the batch, N items."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from core.runtime.resume import EpochBatchSampler
from streamrec.data.constants import PAD_ID
from streamrec.data.splits import EvalCase, Split

log = logging.getLogger(__name__)


def training_windows(history: Sequence[int], max_len: int, sliding_window: bool = False,
                     prefixes: bool = False) -> list[list[int]]:
    """Windows of at most max_len + 1 items: only the last, as SASRec; with `sliding_window` stepping back by
    max_len and overlapping by one item, so every transition is a target once; with `prefixes` one per prefix of
    two or more items, whose last item alone is the target (`collate_train(last_only=True)`)."""
    windows = []
    end = len(history)
    while end >= 2:
        windows.append(list(history[max(0, end - max_len - 1) : end]))
        if not (sliding_window or prefixes):
            break
        end -= 1 if prefixes else max_len
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
    seen = [np.asarray(h, dtype=np.int64) for h in histories]
    seen = [h[np.sort(np.unique(h, return_index=True)[1])] for h in seen]
    out = np.full((len(seen), max(len(s) for s in seen)), PAD_ID, dtype=np.int64)
    for r, s in enumerate(seen):
        out[r, : len(s)] = s
    return torch.from_numpy(out)


class TrainBatch(NamedTuple):
    """Causal next-item batch: (B, T) inputs, (B, T) targets (0 = ignore); `last_only`: only the last column
    holds targets (prefix windows), so the model may compute the final layer there alone."""

    inputs: Tensor
    targets: Tensor
    last_only: bool = False


class EvalBatch(NamedTuple):
    """Held-out next-item batch: (B,) rows of the cases in their `EvalDataset` (maps scores back to users),
    (B, T) inputs, (B,) targets, (B, L) distinct items of the whole history, right-padded with 0."""

    rows: Tensor
    inputs: Tensor
    targets: Tensor
    seen: Tensor


class TrainDataset(Dataset):
    """Training windows (cut as `training_windows` does) of every user with at least two training items, as
    spans of one flat int32 array: a read-only memory map (`from_spans`) is shared by the workers and ranks."""

    def __init__(self, histories: Iterable[Sequence[int]], max_len: int, sliding_window: bool = False,
                 prefixes: bool = False):
        histories = [np.asarray(h, dtype=np.int32) for h in histories]
        lengths = np.array([len(h) for h in histories], dtype=np.int64)
        ends = np.cumsum(lengths)
        flat = np.concatenate(histories) if histories else np.zeros(0, dtype=np.int32)
        self._init(flat, ends - lengths, ends, max_len, sliding_window, prefixes)

    @classmethod
    def from_spans(cls, items: np.ndarray, starts: np.ndarray, ends: np.ndarray, max_len: int,
                   sliding_window: bool = False, prefixes: bool = False) -> TrainDataset:
        """Histories items[starts[k] : ends[k]] of one flat (E,) array (e.g. a memory map), kept, not copied."""
        dataset = cls.__new__(cls)
        dataset._init(items, np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64), max_len,
                      sliding_window, prefixes)
        return dataset

    def _init(self, items: np.ndarray, starts: np.ndarray, ends: np.ndarray, max_len: int,
              sliding_window: bool, prefixes: bool) -> None:
        # The windows `training_windows` cuts, for all histories at once: window j (0 = the last) of a
        # history ends j * step items before its end; each history's windows go oldest first.
        lengths = ends - starts
        step = 1 if prefixes else max_len
        counts = np.where(lengths >= 2, (lengths - 2) // step + 1 if sliding_window or prefixes else 1, 0)
        too_short = int((lengths < 2).sum())
        if too_short:
            log.info("%d users have fewer than 2 training interactions and give no training example", too_short)
        history = np.repeat(np.arange(len(lengths)), counts)
        first = np.cumsum(counts) - counts  # (U,) index of each history's first window
        j = counts[history] - 1 - (np.arange(len(history)) - first[history])  # counts down to 0 per history
        self.items, self.prefixes = items, prefixes
        self.ends = ends[history] - j * step
        self.starts = np.maximum(starts[history], self.ends - max_len - 1)

    @property
    def windows(self) -> list[list[int]]:
        """Every window as a list, for inspection."""
        return [self.items[a:b].tolist() for a, b in zip(self.starts.tolist(), self.ends.tolist(), strict=True)]

    @property
    def lengths(self) -> np.ndarray:
        """(len(self),) input length of every window (its items less the last, which is only a target)."""
        return self.ends - self.starts - 1

    @property
    def targets(self) -> np.ndarray:
        """(len(self),) targets of every window: its length, or 1 with `prefixes`."""
        return np.ones_like(self.starts) if self.prefixes else self.lengths

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.items[self.starts[i] : self.ends[i]]


class SameTargetWindows:
    """Training windows by their last item, to draw each row a partner with the same last target (DuoRec's
    supervised positive, Qiu et al., 2022): uniform over those windows, the row's own among them, so a target
    ending one window gives the row its own back (a second dropout view of it)."""

    def __init__(self, dataset: TrainDataset, num_items: int):
        last = np.asarray(dataset.items[dataset.ends - 1], dtype=np.int64)  # (W,) each window's last item
        self.dataset = dataset
        self.order = np.argsort(last, kind="stable")  # window indices, grouped by last item
        self.offsets = np.concatenate([[0], np.cumsum(np.bincount(last, minlength=num_items + 1))])  # (N+2,)

    def draw(self, targets: Tensor, length: int, generator: torch.Generator) -> Tensor:
        """(B, length) inputs (a window less its last item, left-padded with 0) of one window per (B,) last target,
        drawn with `generator`."""
        t = targets.cpu().numpy()
        count = self.offsets[t + 1] - self.offsets[t]
        if (count < 1).any():
            raise ValueError(f"no training window ends in item {int(t[count < 1][0])}: these are not the training "
                             "windows the batch came from")
        u = torch.rand(len(t), generator=generator, dtype=torch.float64).numpy()
        picks = self.order[self.offsets[t] + np.minimum((u * count).astype(np.int64), count - 1)]
        return _left_padded([self.dataset[k][:-1] for k in picks], length)


class LengthGroupedBatchSampler(EpochBatchSampler):
    """Shuffled batches of windows of similar length, each holding the same number of targets. The model skips columns
    that are padding in every row (`StreamRecModel.encode(trim=True)`), so similar lengths compute little padding. Each
    epoch sorts groups of `group_batches` x `batch_size` windows of a (seed, epoch) permutation by length and cuts them
    into batches of equal total `targets`, ± one window, so every step's loss is a mean over as many targets (equal
    window counts lose accuracy: docs/results.md, "Length-grouped batches"). Every window is seen once an epoch."""

    def __init__(self, lengths: np.ndarray, batch_size: int, seed: int = 0, group_batches: int = 64,
                 targets: np.ndarray | None = None):
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.targets = self.lengths if targets is None else np.asarray(targets, dtype=np.int64)
        if len(self.targets) and self.targets.min() < 1:
            raise ValueError("every window needs at least one target (length >= 1)")
        super().__init__(seed)
        self.batch_size, self.group_batches = batch_size, group_batches
        total, longest = int(self.targets.sum()), int(self.targets.max(initial=1))
        # No batch may be empty: every cut must be at least one window (the longest) apart.
        self.num_batches = max(1, min(-(-len(self.lengths) // batch_size), total // longest)) if total else 0

    def __len__(self) -> int:
        return self.num_batches

    def epoch_batches(self, rng: np.random.Generator) -> list[np.ndarray]:
        order = rng.permutation(len(self.lengths))
        group = self.group_batches * self.batch_size
        for start in range(0, len(order), group):
            chunk = order[start : start + group]
            order[start : start + group] = chunk[np.argsort(self.lengths[chunk], kind="stable")]
        # Window i goes to batch floor(targets before it x K / total): K runs of equal target counts; a cut falls
        # in every run because no window is longer than total / K.
        targets = self.targets[order]
        before = np.cumsum(targets) - targets
        batch_of = before * self.num_batches // max(int(targets.sum()), 1)
        batches = np.split(order, np.flatnonzero(np.diff(batch_of)) + 1) if len(order) else []
        return [batches[b] for b in rng.permutation(len(batches))]


class EvalDataset(Dataset):
    """Evaluation cases (the held-out events), returned with their row index."""

    def __init__(self, cases: Sequence[EvalCase]):
        self.cases = list(cases)

    def __len__(self) -> int:
        return len(self.cases)

    def __getitem__(self, i: int) -> tuple[int, EvalCase]:
        return i, self.cases[i]


def collate_train(windows: Sequence[Sequence[int]], max_len: int, last_only: bool = False) -> TrainBatch:
    """Inputs w[:-1], targets w[1:] (0 = ignore), left-padded to max_len; `last_only`: only the last target."""
    targets = [w[-1:] if last_only else w[1:] for w in windows]
    return TrainBatch(_left_padded([w[:-1] for w in windows], max_len), _left_padded(targets, max_len), last_only)


def collate_eval(cases: Sequence[tuple[int, EvalCase]], max_len: int) -> EvalBatch:
    """`EvalDataset`'s (row, case) pairs -> `EvalBatch`."""
    histories = [case.history for _, case in cases]
    rows = torch.tensor([i for i, _ in cases], dtype=torch.long)
    return EvalBatch(rows=rows, inputs=_left_padded(histories, max_len),
                     targets=torch.tensor([int(case.target) for _, case in cases], dtype=torch.long),
                     seen=_seen(histories))  # seen: (B, L)


class PredictBatch(NamedTuple):
    """Whole histories to recommend after (`predict`): rows are positions in `user_sequences` order."""

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
    """(row, (user, sequence)) pairs of `StreamRecDataModule.predict_dataloader`'s dataset."""
    sequences = [seq for _, (_, seq) in rows]
    return PredictBatch(rows=torch.tensor([i for i, _ in rows], dtype=torch.long), users=[u for _, (u, _) in rows],
                        inputs=_left_padded(sequences, max_len), seen=_seen(sequences))  # seen: (B, L)


def item_counts(histories: Iterable[Sequence[int]], num_items: int) -> Tensor:
    """How often each item occurs in the encoded histories, (N + 1,) int64 with 0 at padding; `num_items`: N."""
    flat = np.concatenate([np.zeros(0, dtype=np.int64), *(np.asarray(h, dtype=np.int64) for h in histories)])
    return torch.from_numpy(np.bincount(flat, minlength=num_items + 1)[: num_items + 1])
