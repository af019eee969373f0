"""Training windows held as spans of one flat (memory-mapped) array equal the per-history reference
`training_windows`; batches from numpy views equal hand-written ones; the encoded-log cache gives the
same batches as reading the file, from a read-only memory map."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

from streamrec.data import StreamRecDataModule
from streamrec.datasets import TrainDataset, collate_eval, collate_predict, collate_train, training_windows
from streamrec.splits import EvalCase, leave_one_out_split

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
