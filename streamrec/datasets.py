"""Datasets and collate functions: SASRec-style causal training examples and evaluation batches.

`TrainDataset` + `collate_train` give the last max_len+1 training items, inputs = seq[:-1],
targets = seq[1:], both left-padded with 0 (target 0 = ignore). `EvalDataset` + `collate_eval`
give the last max_len history items, the held-out target and every item already seen (for
filtering). `collate_predict` does the same for whole sequences.

Legend: B batch, T time (= max_len), L longest seen-item list in the batch, N items.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor
from torch.utils.data import Dataset

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


def _left_pad(ids: Sequence[int], length: int) -> list[int]:
    return [PAD_ID] * (length - len(ids)) + list(ids)


class TrainBatch(NamedTuple):
    """Causal next-item batch.

    Args:
        inputs: (B, T) item ids, left-padded with 0.
        targets: (B, T) the item after each input position; 0 = ignore.
    """

    inputs: Tensor
    targets: Tensor


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

    Args:
        histories: encoded training histories, one per user.
        max_len: model context length T.
        sliding_window: one window per max_len items instead of only the last one.
    """

    def __init__(self, histories: Iterable[Sequence[int]], max_len: int, sliding_window: bool = False):
        self.windows: list[list[int]] = []
        too_short = 0
        for history in histories:
            windows = training_windows(history, max_len, sliding_window)
            too_short += not windows
            self.windows.extend(windows)
        if too_short:
            log.info("%d users have fewer than 2 training interactions and give no training example", too_short)

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i: int) -> list[int]:
        return self.windows[i]


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


def collate_train(windows: Sequence[Sequence[int]], max_len: int) -> TrainBatch:
    """Windows of <= max_len + 1 items -> inputs = w[:-1], targets = w[1:], left-padded to max_len.

    Args:
        windows: from `TrainDataset`.
        max_len: model context length T.
    """
    inputs = [_left_pad(w[:-1][-max_len:], max_len) for w in windows]
    targets = [_left_pad(w[1:][-max_len:], max_len) for w in windows]
    return TrainBatch(torch.tensor(inputs, dtype=torch.long), torch.tensor(targets, dtype=torch.long))


def collate_eval(cases: Sequence[tuple[int, EvalCase]], max_len: int) -> EvalBatch:
    """Cases -> last max_len history items (left-padded), targets, and seen items (right-padded).

    Args:
        cases: (row, case) pairs from `EvalDataset`.
        max_len: model context length T.
    """
    seen = [list(dict.fromkeys(case.history)) for _, case in cases]
    width = max(len(s) for s in seen)
    return EvalBatch(
        rows=torch.tensor([i for i, _ in cases], dtype=torch.long),
        inputs=torch.tensor([_left_pad(case.history[-max_len:], max_len) for _, case in cases], dtype=torch.long),
        targets=torch.tensor([case.target for _, case in cases], dtype=torch.long),
        seen=torch.tensor([s + [PAD_ID] * (width - len(s)) for s in seen], dtype=torch.long),  # (B, L)
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
    seen = [list(dict.fromkeys(seq)) for _, (_, seq) in rows]
    width = max(len(s) for s in seen)
    return PredictBatch(
        rows=torch.tensor([i for i, _ in rows], dtype=torch.long),
        users=[user for _, (user, _) in rows],
        inputs=torch.tensor([_left_pad(seq[-max_len:], max_len) for _, (_, seq) in rows], dtype=torch.long),
        seen=torch.tensor([s + [PAD_ID] * (width - len(s)) for s in seen], dtype=torch.long),  # (B, L)
    )


def item_counts(histories: Iterable[Sequence[int]], num_items: int) -> Tensor:
    """How often each item occurs in the histories, (N + 1,) int64 with 0 at padding.

    Args:
        histories: encoded item sequences.
        num_items: N.
    """
    flat = [i for h in histories for i in h]
    return torch.bincount(torch.tensor(flat, dtype=torch.long), minlength=num_items + 1)[: num_items + 1]
