"""Training windows held as spans of one flat (memory-mapped) array equal the per-history reference
`training_windows`; batches from numpy views equal hand-written ones; the encoded-log cache gives the
same batches as reading the file, from a read-only memory map."""

from __future__ import annotations

import collections
import itertools
import os
import random

import numpy as np
import pytest
import torch

from streamrec.data.datamodule import StreamRecDataModule
from streamrec.data.datasets import (
    LengthGroupedBatchSampler,
    SameTargetWindows,
    TrainDataset,
    collate_eval,
    collate_predict,
    collate_train,
    training_windows,
)
from streamrec.data.splits import EvalCase, leave_one_out_split

CSV = "user_id,item_id,timestamp\n"


@pytest.mark.parametrize("sliding_window", [False, True])
@pytest.mark.parametrize("max_len", [1, 2, 3, 7])
def test_spans_equal_training_windows_of_each_history(sliding_window, max_len):
    rng = random.Random(max_len)
    histories = [[rng.randint(1, 50) for _ in range(rng.randint(0, 20))] for _ in range(40)]
    expected = [w for h in histories for w in training_windows(h, max_len, sliding_window)]
    assert TrainDataset(histories, max_len, sliding_window).windows == expected
    flat = np.array([i for h in histories for i in h], dtype=np.int32)
    ends = np.cumsum([len(h) for h in histories])
    spans = TrainDataset.from_spans(flat, ends - [len(h) for h in histories], ends, max_len, sliding_window)
    assert [spans[k].tolist() for k in range(len(spans))] == expected
    assert spans.items is flat  # kept, not copied


@pytest.mark.parametrize("max_len", [1, 3, 50])
def test_prefix_windows_are_every_prefix_cut_to_max_len_with_one_target_each(max_len):
    # Reference: each prefix of >= 2 items, by hand from its definition; spans and the naive cut agree with it.
    rng = random.Random(max_len)
    histories = [[rng.randint(1, 50) for _ in range(rng.randint(0, 12))] for _ in range(30)]
    expected = [h[max(0, e - max_len - 1) : e] for h in histories for e in range(2, len(h) + 1)]
    assert [w for h in histories for w in training_windows(h, max_len, prefixes=True)] == expected
    flat = np.array([i for h in histories for i in h], dtype=np.int32)
    ends = np.cumsum([len(h) for h in histories])
    spans = TrainDataset.from_spans(flat, ends - [len(h) for h in histories], ends, max_len, prefixes=True)
    assert spans.windows == expected
    assert spans.targets.tolist() == [1] * len(expected)
    assert spans.lengths.tolist() == [len(w) - 1 for w in expected]
    batch = collate_train([np.array([4, 5, 6]), np.array([7, 8])], max_len=3, last_only=True)
    assert batch.inputs.tolist() == [[0, 4, 5], [0, 0, 7]] and batch.targets.tolist() == [[0, 0, 6], [0, 0, 8]]


def test_prefix_datamodule_batches_hold_each_training_transition_once_as_a_last_target(write):
    # Every training transition (history item -> next training item) is the last target of exactly one window,
    # and no other column holds a target: the same targets as one window per user, one example each.
    rng = random.Random(1)
    path = write("log.csv", CSV + "".join(f"u{rng.randint(0, 9)},i{rng.randint(0, 30)},{t}\n" for t in range(120)))
    dm = StreamRecDataModule(str(path), max_len=4, batch_size=5, prefixes=True)
    dm.setup("fit")
    got = []
    for b in dm.train_dataloader():
        assert not b.targets[:, :-1].any()
        rows = zip(b.inputs.tolist(), b.targets[:, -1].tolist(), strict=True)
        got += [(tuple(x for x in row if x), t) for row, t in rows]
    want = [(tuple(h[max(0, e - 5) : e - 1]), h[e - 1]) for h in (x.tolist() for x in dm.splits.train.values())
            for e in range(2, len(h) + 1)]
    assert sorted(got) == sorted(want)


def test_collate_of_numpy_views_builds_the_hand_written_batches():
    flat = np.array([1, 2, 3, 4, 5, 7, 8, 3, 1, 3], dtype=np.int32)
    batch = collate_train([flat[0:5], flat[5:7], flat[7:10]], max_len=4)
    assert torch.equal(batch.inputs, torch.tensor([[1, 2, 3, 4], [0, 0, 0, 7], [0, 0, 3, 1]]))
    assert torch.equal(batch.targets, torch.tensor([[2, 3, 4, 5], [0, 0, 0, 8], [0, 0, 1, 3]]))
    assert batch.inputs.dtype == batch.targets.dtype == torch.long
    seq = np.array([5, 6, 7, 6, 9], dtype=np.int32)
    ev = collate_eval([(0, EvalCase("a", seq, 4)), (1, EvalCase("b", seq[:3], 1))], max_len=3)
    assert ev.inputs.tolist() == [[6, 7, 6], [0, 0, 5]] and ev.targets.tolist() == [9, 6]
    assert ev.seen.tolist() == [[5, 6, 7], [5, 0, 0]]  # distinct in first-seen order, right-padded
    pred = collate_predict([(3, ("a", seq)), (4, ("b", seq[:1]))], max_len=2)
    assert pred.rows.tolist() == [3, 4] and pred.users == ["a", "b"]
    assert pred.inputs.tolist() == [[6, 9], [0, 5]] and pred.seen.tolist() == [[5, 6, 7, 9], [5, 0, 0, 0]]


def test_leave_one_out_of_views_shares_the_array():
    flat = np.arange(1, 8, dtype=np.int32)
    split = leave_one_out_split({"a": flat[0:5], "b": flat[5:7]})
    assert split.train["a"].tolist() == [1, 2, 3] and split.train["b"].tolist() == [6, 7]
    assert np.shares_memory(split.train["a"], flat) and split.test[0].target == 5 and split.valid[0].target == 4


def _batches(dm: StreamRecDataModule) -> list[list[list[int]]]:
    dm.setup("fit")
    torch.manual_seed(0)
    out = [[b.inputs.tolist(), b.targets.tolist()] for b in dm.train_dataloader()]
    out += [[b.inputs.tolist(), b.targets.tolist(), b.seen.tolist()] for b in dm.test_dataloader()]
    return out + [[b.inputs.tolist(), b.seen.tolist()] for b in dm.predict_dataloader()]


def test_cached_encoded_log_is_memory_mapped_and_gives_the_same_batches(write, tmp_path, caplog):
    rng = random.Random(0)
    path = write("log.csv", CSV + "".join(f"u{rng.randint(0, 20)},i{rng.randint(0, 30)},{t}\n" for t in range(400)))
    kwargs = {"max_len": 5, "batch_size": 7, "sliding_window": True}
    plain = _batches(StreamRecDataModule(str(path), **kwargs))
    cache = tmp_path / "cache"
    first = StreamRecDataModule(str(path), cache_dir=str(cache), **kwargs)
    assert _batches(first) == plain
    assert sorted(p.suffix for p in cache.iterdir()) == [".json", ".npy", ".npy", ".npy"]
    again = StreamRecDataModule(str(path), cache_dir=str(cache), **kwargs)
    assert _batches(again) == plain
    assert isinstance(again.train_set.items, np.memmap) and not again.train_set.items.flags.writeable
    assert again.vocab.items == first.vocab.items

    st = os.stat(path)  # an edited log is read again, not served from the old cache
    path.write_text(path.read_text() + "u0,i99,1000\n")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert StreamRecDataModule(str(path), cache_dir=str(cache), **kwargs).num_items == first.num_items + 1


@pytest.mark.parametrize("n, batch_size, group_batches", [(1000, 32, 4), (1000, 32, 100), (33, 8, 2), (5, 8, 3)])
def test_length_grouped_batches_hold_equal_targets_in_runs_of_each_sorted_group(n, batch_size, group_batches):
    # Reference: the same permutation, cut into groups and sorted by brute force. Every window comes once; there are
    # as many batches as random batches of batch_size; the batches tile the sorted groups in contiguous runs and
    # each holds total / K targets, give or take one window.
    lengths = np.random.default_rng(n).integers(1, 60, n)
    sampler = LengthGroupedBatchSampler(lengths, batch_size, seed=7, group_batches=group_batches)
    batches = list(sampler)
    assert sorted(i for b in batches for i in b) == list(range(n))
    assert len(batches) == len(sampler) == -(-n // batch_size)
    perm = np.random.default_rng([7, 0]).permutation(n)
    group = batch_size * group_batches
    sorted_order = []
    for start in range(0, n, group):
        sorted_order += sorted(perm[start : start + group].tolist(), key=lambda i: lengths[i])  # stable sort
    position = {i: p for p, i in enumerate(sorted_order)}
    runs = sorted((min(position[i] for i in b), max(position[i] for i in b), len(b)) for b in batches)
    assert all(last - first + 1 == size for first, last, size in runs)  # contiguous runs
    assert [r[0] for r in runs] == [0, *np.cumsum([r[2] for r in runs])[:-1].tolist()]  # tiling the sorted order
    share = lengths.sum() / len(batches)
    assert all(abs(lengths[b].sum() - share) <= lengths.max() for b in batches)


def test_length_grouped_batches_share_given_targets_and_sort_by_length():
    # One target per window (prefixes): batches hold equal window counts, however long the windows are, and
    # each is a run of its group sorted by length.
    lengths = np.random.default_rng(5).integers(1, 50, 1000)
    sampler = LengthGroupedBatchSampler(lengths, 32, seed=2, group_batches=16, targets=np.ones(1000, dtype=int))
    batches = list(sampler)
    assert sorted(i for b in batches for i in b) == list(range(1000)) and len(batches) == -(-1000 // 32)
    assert {len(b) for b in batches} <= {31, 32}
    spread = [lengths[b].max() - lengths[b].min() for b in batches]
    assert np.median(spread) < 0.2 * (lengths.max() - lengths.min())  # random batches: about 0.9


def test_length_grouped_order_is_fixed_by_seed_and_epoch_and_cuts_padding():
    lengths = np.random.default_rng(0).integers(1, 201, 6000)
    sampler = LengthGroupedBatchSampler(lengths, 128, seed=3)
    first = list(sampler)
    assert list(LengthGroupedBatchSampler(lengths, 128, seed=3)) == first
    second = list(sampler)  # each iteration advances the epoch
    assert sorted(map(sorted, second)) != sorted(map(sorted, first))
    sampler.set_epoch(0)
    assert list(sampler) == first

    def padded(batches):  # positions a batch trimmed to its longest window computes
        return sum(len(b) * lengths[b].max() for b in batches)

    shuffled = np.random.default_rng(0).permutation(len(lengths))
    assert padded(first) < 0.6 * padded([shuffled[i : i + 128] for i in range(0, len(lengths), 128)])


def test_length_grouped_sampler_never_cuts_an_empty_batch():
    # One window holds most of the targets: a cut every total / ceil(W / batch_size) targets would leave empty batches.
    lengths = np.array([500, *([1] * 20)])
    sampler = LengthGroupedBatchSampler(lengths, 2, seed=0)
    batches = list(sampler)
    assert len(batches) == len(sampler) == 1 and sorted(batches[0]) == list(range(21))
    with pytest.raises(ValueError, match="at least one target"):
        LengthGroupedBatchSampler(np.array([3, 0]), 2)


def test_length_grouped_sampler_skips_for_a_mid_epoch_resume():
    lengths = np.arange(100) % 17 + 1
    sampler = LengthGroupedBatchSampler(lengths, 10, seed=1)
    full = list(sampler)
    sampler.set_epoch(0)
    sampler.skip_batches(3)
    assert list(sampler) == full[3:]
    sampler.set_epoch(0)
    assert list(sampler) == full  # the skip holds for one iteration only


@pytest.mark.parametrize("group_by_length", [True, False])
def test_datamodule_trains_on_every_window_once_an_epoch(write, group_by_length):
    rng = random.Random(0)
    rows = [f"u{u},i{rng.randint(1, 30)},{t}" for u in range(50) for t in range(rng.randint(3, 25))]
    dm = StreamRecDataModule(write("log.csv", CSV + "\n".join(rows) + "\n"), max_len=8, batch_size=4,
                             group_by_length=group_by_length)
    dm.setup("fit")
    batches = list(dm.train_dataloader())
    seen = sorted(tuple(w[w > 0].tolist()) for b in batches for w in torch.cat([b.inputs, b.targets[:, -1:]], dim=1))
    assert seen == sorted(tuple(w) for w in dm.train_set.windows)
    if group_by_length:  # 50 windows fit one group: the batches tile the sorted lengths, with equal target counts
        spans = sorted((int(w.min()), int(w.max())) for w in (((b.inputs > 0).sum(1)) for b in batches))
        assert all(high <= next_low for (_, high), (next_low, _) in itertools.pairwise(spans))
        targets = [int((b.targets > 0).sum()) for b in batches]
        assert len(batches) == -(-len(dm.train_set) // 4)
        assert max(targets) - min(targets) <= 2 * int(dm.train_set.lengths.max())


@pytest.mark.parametrize("sliding_window", [False, True])
def test_same_target_partners_are_drawn_uniformly_from_the_windows_ending_in_the_target(sliding_window):
    histories = [[1, 2, 3], [4, 3], [5, 6], [7, 2, 3], [8, 9, 6, 1, 2, 3]]
    dataset = TrainDataset(histories, max_len=3, sliding_window=sliding_window)
    partners = SameTargetWindows(dataset, num_items=9)
    # Reference: the windows themselves, picked by their last item.
    ending = {t: [tuple(w[:-1]) for w in dataset.windows if w[-1] == t] for t in (3, 6)}
    assert ending[6] == ([(5,), (8, 9)] if sliding_window else [(5,)])  # sliding: the last history's first window
    targets = torch.tensor([3, 6, 3])
    drawn = {t: collections.Counter() for t in ending}
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        rows = partners.draw(targets, 4, g)
        for t, row in zip(targets.tolist(), rows.tolist(), strict=True):
            drawn[t][tuple(i for i in row if i)] += 1
    for t, windows in ending.items():
        assert set(drawn[t]) == set(windows)  # only windows ending in t, each of them
        per = sum(drawn[t].values()) / len(windows)
        assert all(abs(n - per) < 5 * per**0.5 for n in drawn[t].values())  # uniform (5 sigma)
    assert partners.draw(targets, 4, torch.Generator().manual_seed(1)).tolist() == \
        partners.draw(targets, 4, torch.Generator().manual_seed(1)).tolist()  # the generator decides
    with pytest.raises(ValueError, match="no training window ends in item 4"):
        partners.draw(torch.tensor([3, 4]), 4, g)
