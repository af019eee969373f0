"""What the StreamRec benchmarks share: the data sets, one trial of our model, early stopping, evaluation, a trial log.

`streamrec_rectools.py` (the race against RecTools) and `streamrec_recipe.py` (our recipe on four
data sets) train the same way: Lightning without its validation loop, a callback that times every
epoch, scores the validation split (full ranking, seen items removed), keeps the best epoch's
weights and stops on patience or a training-time cap. Nothing here imports a peer library.

Legend: U users, B batch, T max_len, N items (1..N, 0 = padding), K top-K.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
import torch
from _common import ROOT
from torch import Tensor
from torch.utils.data import DataLoader

from streamrec.data.datamodule import StreamRecDataModule
from streamrec.data.datasets import EvalDataset, collate_eval
from streamrec.data.splits import EvalCase, Split
from streamrec.model.metrics import RankingMetrics
from streamrec.model.module import StreamRecModule
from streamrec.model.network import StreamRecModel

DATA = ROOT.parent / "shared" / "data"
DATASETS = {
    "ml-1m": DATA / "ml-1m" / "ml-1m.sasrec-prefix.txt",
    "beauty": DATA / "amazon-beauty" / "Beauty.txt",
    "sports": DATA / "amazon-sports" / "Sports_and_Outdoors.txt",
    "yelp": DATA / "yelp" / "Yelp.txt",
}
K = 10
SCORE_BATCH = 256  # users per forward pass when scoring, both libraries (RecTools' default)
SCORE_REPEATS = 3
PRECISIONS = {"32": "32-true", "bf16": "bf16-mixed"}
# Trial-key value of ours with length-grouped batches of equal target counts (`data.group_by_length`, fit's default).
# A stored trial keyed `True` had another grouping (equal window counts, a weighted loss) and is not reused.
GROUPED = "equal_targets"


def keep_freed_memory() -> bool:
    """glibc: serve big blocks from the heap and never trim it, so freed memory is reused without page faults.

    By default every block over 32 MiB (the (M, N) logits and their gradients, ~180 MB at
    max_len 200) is a fresh mmap, zero-filled page by page on first touch and unmapped on free:
    that page-faulting cost ~30% of a StreamRec step at max_len 200. mallopt(M_MMAP_MAX=0,
    M_TRIM_THRESHOLD=2 GiB, M_TOP_PAD=1 GiB); the same as MALLOC_MMAP_MAX_=0 etc. in the environment.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return all(libc.mallopt(option, value) == 1 for option, value in ((-4, 0), (-1, 2**31 - 1), (-2, 1 << 30)))



def best_epoch_keeper(base: type, network, validate, patience: int, cap_s: float, averaging=None) -> object:
    """A callback (subclass of `base`, Lightning's or pytorch_lightning's Callback) shared by both trainers.

    It times each training epoch, then scores the validation split with `validate(net)` (outside the
    timed span), keeps the best epoch's weights, and stops training after `patience` epochs without
    a gain or once the timed epochs add up to `cap_s` seconds. `network(pl_module)` is the nn.Module
    that scores: ours `module.model`, RecTools' `lightning_model.torch_model`. `averaging`: a Lightning
    weight-averaging callback (EMA) of the same trainer, whose averaged weights are swapped in for
    validation through its own validation hooks, as a Lightning validation loop would.
    """

    class BestEpoch(base):
        def __init__(self) -> None:
            self.seconds: list[float] = []
            self.val: list[float] = []
            self.best, self.best_epoch, self.best_state, self.stopped_by = -1.0, 0, None, "max_epochs"
            self._start = 0.0

        def on_train_epoch_start(self, trainer, pl_module) -> None:
            self._start = time.perf_counter()

        def on_train_epoch_end(self, trainer, pl_module) -> None:
            self.seconds.append(time.perf_counter() - self._start)
            if averaging is not None:
                averaging.on_validation_epoch_start(trainer, pl_module)
            net = network(pl_module)
            was_training = net.training
            net.eval()
            score = validate(net)
            net.train(was_training)
            self.val.append(score)
            print(f"  epoch {len(self.val)}: val NDCG@10 {score:.4f} ({self.seconds[-1]:.0f} s)", file=sys.stderr,
                  flush=True)  # long trials show their progress in the log
            if score > self.best:
                self.best, self.best_epoch = score, len(self.val)
                self.best_state = {k: v.detach().clone() for k, v in net.state_dict().items()}
            if averaging is not None:
                averaging.on_validation_epoch_end(trainer, pl_module)
            elif len(self.val) - self.best_epoch >= patience:
                trainer.should_stop, self.stopped_by = True, "patience"
            if sum(self.seconds) >= cap_s and not trainer.should_stop:
                trainer.should_stop, self.stopped_by = True, "time cap"

    return BestEpoch()




def trainer_kwargs(args: argparse.Namespace) -> dict[str, object]:
    """The same trainer settings for both libraries: CPU, no Lightning validation, no logging or checkpoints."""
    return dict(max_epochs=args.max_epochs, accelerator="cpu", devices=1, precision=PRECISIONS[args.precision],
                logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                num_sanity_val_steps=0, limit_val_batches=0, limit_train_batches=args.limit_batches or 1.0)




def median_seconds(fn, repeats: int = SCORE_REPEATS) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)




@dataclass
class Data:
    """One data set's split, as both systems see it."""

    name: str
    dm: StreamRecDataModule
    split: Split
    num_items: int




def evaluate_full(score_fn, cases: Sequence[EvalCase], max_len: int) -> dict[str, float]:
    """Full-ranking HR@K / NDCG@K with our metric code: scores (B, N+1) per `EvalBatch`."""
    metrics = RankingMetrics(ks=(K,), filter_seen=True)
    loader = DataLoader(EvalDataset(cases), batch_size=SCORE_BATCH, collate_fn=partial(collate_eval, max_len=max_len))
    for batch in loader:
        metrics.update(score_fn(batch), batch.targets, batch.seen)
    return {name: float(value) for name, value in metrics.compute().items()}


def evaluate(score_fn, cases: Sequence[EvalCase], max_len: int) -> float:
    """Validation NDCG@K, the figure both searches maximise."""
    return evaluate_full(score_fn, cases, max_len)[f"ndcg@{K}"]




class TrialLog:
    """`OUT/trials.jsonl`: one line per finished trial, appended and flushed as it ends."""

    def __init__(self, path: Path):
        self.path = path
        self.done: dict[str, dict[str, object]] = {}
        if path.exists():
            for n, line in enumerate(path.read_text().splitlines(), start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    self.done[json.dumps(row["key"], sort_keys=True)] = row["result"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    sys.exit(f"error: {path} line {n}: not a trial record; move the file away or pass another --out")

    def get(self, key: dict[str, object]) -> dict[str, object] | None:
        return self.done.get(json.dumps(key, sort_keys=True))

    def add(self, key: dict[str, object], result: dict[str, object]) -> None:
        self.done[json.dumps(key, sort_keys=True)] = result
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps({"key": key, "result": result}) + "\n")
            f.flush()
            os.fsync(f.fileno())




def load_data(name: str, args: argparse.Namespace) -> Data:
    dm = StreamRecDataModule(str(args.paths[name]), max_len=args.max_len, batch_size=args.batch_size,
                             group_by_length=args.group_by_length, prefixes=getattr(args, "prefixes", False))
    dm.setup("fit")
    return Data(name, dm, dm.splits, dm.num_items)


def trial_result(keeper, n_seq: int, test: dict[str, float], score_s: float, args: argparse.Namespace
                 ) -> dict[str, object]:
    epoch_s = statistics.median(keeper.seconds)
    if args.limit_batches:
        n_seq = min(n_seq, args.limit_batches * args.batch_size)
    return {
        "val_ndcg@10": keeper.best, "best_epoch": keeper.best_epoch, "epochs": len(keeper.seconds),
        "stopped_by": keeper.stopped_by, "val_curve": [round(v, 5) for v in keeper.val],
        "epoch_s": epoch_s, "train_s": sum(keeper.seconds), "seq_per_s": n_seq / epoch_s,
        "test_ndcg@10": test[f"ndcg@{K}"], "test_hr@10": test[f"hr@{K}"], "score_s": score_s,
    }


@torch.no_grad()
def ours_scores(model: StreamRecModel, batch) -> Tensor:
    """(B, N+1) float32 scores of one `EvalBatch`."""
    return model.recommend_scores(batch.inputs).float()


def train_ours(data: Data, module_kwargs: dict[str, Any], args: argparse.Namespace) -> tuple[Any, StreamRecModel]:
    """Train StreamRec with `module_kwargs` (num_items, max_len and warmup filled in); the keeper and the
    best epoch's model, in eval mode. The warmup is a tenth of the epoch budget's steps, at most 100."""
    batches = args.limit_batches or -(-len(data.dm.train_set) // args.batch_size)
    kwargs = {"warmup_steps": min(100, max(1, args.max_epochs * batches // 10)), "ks": (K,),
              "popularity_baseline": False, **module_kwargs}
    L.seed_everything(args.seed, verbose=False)
    module = StreamRecModule(num_items=data.num_items, max_len=args.max_len, **kwargs)
    ema_decay = getattr(args, "ema_decay", None)
    averaging = None
    if ema_decay:  # imported here: Lightning < 2.6 (the RecTools venv's) has no EMAWeightAveraging
        from lightning.pytorch.callbacks import EMAWeightAveraging

        averaging = EMAWeightAveraging(decay=ema_decay)
    keeper = best_epoch_keeper(
        L.Callback, lambda m: m.model, lambda net: evaluate(partial(ours_scores, net), data.split.valid, args.max_len),
        args.patience, 60 * args.trial_minutes, averaging,
    )
    # The averaging callback first: its epoch-end update precedes the keeper's validation.
    trainer = L.Trainer(callbacks=[c for c in (averaging, keeper) if c is not None], **trainer_kwargs(args))
    trainer.fit(module, train_dataloaders=data.dm.train_dataloader())
    model = module.model.eval()
    model.load_state_dict(keeper.best_state)
    return keeper, model
