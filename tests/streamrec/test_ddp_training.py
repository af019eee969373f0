"""Training on two CPU ranks: the ranks share each epoch's windows and end with the same weights.

`ddp_fork` (ddp_spawn's launcher, with ranks forked rather than importing torch again), not `ddp`: inside
pytest `ddp` relaunches the whole pytest command as rank 1
(shared/ENVIRONMENT.md). Each rank records the windows of its batches and its final weights in
files; the reference is the windows of a single-process `setup` of the same data.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch

from streamrec.data.datamodule import StreamRecDataModule
from streamrec.model.module import StreamRecModule

EPOCHS = 2


class RecordRanks(L.Callback):
    """Writes, per rank, the training windows of each epoch and the final weights under `folder`."""

    def __init__(self, folder: Path):
        self.folder, self.seen = folder, []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        for inputs, targets in zip(batch.inputs.tolist(), batch.targets.tolist(), strict=True):
            # collate_train: inputs = window[:-1], targets = window[1:], both left-padded with 0.
            self.seen.append([i for i in inputs if i] + [targets[-1]])

    def on_train_epoch_end(self, trainer, pl_module):
        path = self.folder / f"rank{trainer.global_rank}_epoch{trainer.current_epoch}.json"
        path.write_text(json.dumps(self.seen))
        self.seen = []

    def on_train_end(self, trainer, pl_module):
        torch.save(pl_module.state_dict(), self.folder / f"rank{trainer.global_rank}.pt")


def test_a_rank_holds_views_of_the_mapped_log_not_copies(tiny_log, tmp_path):
    """What every rank materialises: index structures per user; the items stay in the shared, read-only map."""
    StreamRecDataModule(str(tiny_log), max_len=8, cache_dir=str(tmp_path)).setup("fit")  # writes the cache
    data = StreamRecDataModule(str(tiny_log), max_len=8, cache_dir=str(tmp_path))
    data.setup("fit")
    mapped = data.train_set.items
    assert isinstance(mapped, np.memmap) and not mapped.flags.writeable
    histories = [*data.splits.train.values(), *(case.items for case in data.splits.test)]
    # Plain ndarray views (a np.memmap view costs ~4x the bytes per user) over the map's pages.
    assert all(type(h) is np.ndarray and np.shares_memory(h, mapped) for h in histories)


@pytest.mark.slow  # two spawned processes, each importing torch and Lightning
def test_two_ranks_see_each_window_once_per_epoch_and_end_with_equal_weights(tiny_log, tmp_path):
    data = StreamRecDataModule(str(tiny_log), max_len=8, batch_size=16, cache_dir=str(tmp_path / "cache"))
    reference = StreamRecDataModule(str(tiny_log), max_len=8, batch_size=16)
    reference.setup("fit")
    windows = Counter(tuple(w) for w in reference.train_set.windows)
    assert len(windows) == len(reference.train_set) == 81  # 81 users, one window each, all distinct
    L.seed_everything(0, verbose=False)
    module = StreamRecModule(num_items=data.num_items, max_len=8, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                             lr=1e-2, evaluation={"popularity_baseline": False})
    start = {k: v.clone() for k, v in module.state_dict().items()}
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_fork", max_epochs=EPOCHS, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=0, callbacks=[RecordRanks(tmp_path)])
    trainer.fit(module, data)

    for epoch in range(EPOCHS):
        shares = [Counter(tuple(w) for w in json.loads((tmp_path / f"rank{r}_epoch{epoch}.json").read_text()))
                  for r in (0, 1)]
        assert sum(shares[0].values()) == sum(shares[1].values()) == 41  # ceil(81 / 2): equal steps per rank
        together = shares[0] + shares[1]
        assert set(together) == set(windows)  # every window, and nothing but windows of the data
        # Lightning's DistributedSampler pads 81 to 82 with one repeated window; all others exactly once.
        assert sorted(together.values()) == [1] * 80 + [2]
        assert not (set(shares[0]) & set(shares[1])) - {w for w, n in together.items() if n == 2}
    orders = [json.loads((tmp_path / f"rank0_epoch{e}.json").read_text()) for e in range(EPOCHS)]
    assert orders[0] != orders[1]  # reshuffled each epoch

    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert ranks[0].keys() == ranks[1].keys() == start.keys()
    for name in start:
        assert torch.equal(ranks[0][name], ranks[1][name]), name  # gradients all-reduced: one model
    table = "model.item_embedding.embedding.weight"
    assert not torch.equal(ranks[0][table], start[table])  # it trained
    assert all(torch.equal(module.state_dict()[k], ranks[0][k]) for k in start)  # ddp_fork returns rank 0's
