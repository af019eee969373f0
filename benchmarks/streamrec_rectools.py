"""StreamRec against RecTools' SASRecModel, a fair race: same split, same budget, same search, four data sets.

For every data set both systems run the same validation-driven search: every lr in `--lrs` times every loss in
`--losses` (softmax; gbce: gSASRec's loss, 256 uniform negatives, t 0.75). A trial trains up to `--max-epochs`,
scores validation NDCG@10 after every epoch (full ranking, seen items removed, our `RankingMetrics` on both
networks' scores), stops after `--patience` epochs without a gain or at `--trial-minutes` of training, and keeps
its best epoch. Each system's pick (best validation NDCG@10) alone is scored on the test split.

Same for both: the leave-one-out split, the block (d_model 64, 2 blocks, 1 head, FFN 64 ReLU, dropout 0.2:
RecTools'), learned positions, tied item embeddings, batch 128, max_len, precision, threads; each keeps its own
optimiser (ours AdamW with warmup-cosine, RecTools Adam). `--ours-recipe default` races one trial of
`StreamRecModule`'s defaults instead (with `--ours-config YAML`: that config's model block over them, as
`fit --config` trains; pass its `data.max_len` as `--max-len`) against RecTools' full search.

Reported per data set: both picks' test HR@10 / NDCG@10, settings, training sequences/s (median epoch) and the
time to score every test user top-10. Every trial is appended to `OUT/trials.jsonl`; a rerun with the same
settings reads them back, so a search resumes, and two processes (`--systems ours`, `--systems rectools`, one per
core) can share the work before a run with both prints the tables.

    make bench-env-rectools                                    # once: creates .venv-rectools
    python benchmarks/streamrec_rectools.py --datasets beauty --out runs/race --json runs/race.json
    python benchmarks/streamrec_rectools.py --datasets beauty --lrs 1e-3 --losses softmax --max-epochs 1   # smoke run

Targets per data set: ours test NDCG@10 >= 1.03 x RecTools', training sequences/s >= 4x.

JSON keys, per data set D: D_{ours,rectools}_{test_ndcg@10, test_hr@10, val_ndcg@10, lr, gbce, best_epoch,
epochs, seq_per_s, score_s, trials}, D_ndcg_rel_diff, D_train_speedup, D_score_speedup, D_num_users,
D_num_items, plus the setting (max_len, max_epochs, patience, trial_minutes, threads, bf16, dropout).

Legend: U users, B batch, T max_len, N items (ours 1..N, 0 = padding), K top-K.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from _common import ROOT, ensure_peer_venv, for_signature

if __name__ == "__main__":
    ensure_peer_venv(__file__, ["rectools"], ".venv-rectools", "bench-env-rectools")

# ruff: noqa: E402  (imports after the venv check on purpose)
import argparse
import ctypes
import inspect
import json
import logging
import statistics
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import lightning as L
import numpy as np
import pandas as pd
import pytorch_lightning as PL
import torch
import yaml
from _common import print_table, time_call, write_json
from rectools import Columns
from rectools.dataset import Dataset
from rectools.models import SASRecModel
from rich.console import Console
from torch import Tensor
from torch.utils.data import DataLoader

from streamrec.data.datamodule import StreamRecDataModule
from streamrec.data.datasets import EvalDataset, collate_eval
from streamrec.data.splits import EvalCase, Split
from streamrec.model.metrics import RankingMetrics
from streamrec.model.module import StreamRecModule
from streamrec.model.network import StreamRecModel
from streamrec.ranking.batch import RankingOptions, length_batches, recommend

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


TARGETS = {"ndcg_rel_diff": 0.03, "train_speedup": 4.0}
LOSSES = {"softmax": {"ours": "full", "rectools": "softmax"}, "gbce": {"ours": "gbce", "rectools": "gBCE"}}
GBCE_NEGATIVES, GBCE_T = 256, 0.75  # gSASRec's setting, which RecTools' tutorial uses for gBCE
SYSTEMS = ("ours", "rectools")
DEFAULT = "default"  # the loss label of ours' one trial with `--ours-recipe default`


def config_recipe(path: Path | None) -> dict[str, object]:
    """The `model:` block of a StreamRec YAML config (`--ours-config`), its option groups flattened: what
    `fit --config PATH` trains over the module's defaults. Its `base:` file holds no model settings."""
    if path is None:
        return {}
    recipe: dict[str, object] = {}
    for name, value in ((yaml.safe_load(path.read_text()) or {}).get("model") or {}).items():
        recipe.update(value if isinstance(value, dict) else {name: value})
    try:
        for_signature(StreamRecModule, **recipe)
    except TypeError as e:
        sys.exit(f"error: {path}: {e}")
    return recipe


def ours_recipe(args: argparse.Namespace) -> dict[str, object]:
    """What one `--ours-recipe default` trial trains: a config's model block over the defaults, with the fast path
    when `--cpu-fastpath` asks."""
    return {**config_recipe(args.ours_config), **({"cpu_fastpath": True} if args.cpu_fastpath else {})}


def default_lr(args: argparse.Namespace) -> float:
    lr = ours_recipe(args).get("lr", inspect.signature(StreamRecModule).parameters["lr"].default)
    return float(lr)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- training and evaluation


def keep_freed_memory() -> bool:
    """glibc: serve big blocks from the heap and never trim it, so freed memory is reused without page faults.

    By default every block over 32 MiB (the (M, N) logits and their gradients at max_len 200) is a fresh mmap,
    zero-filled page by page on first touch: mallopt(M_MMAP_MAX=0, M_TRIM_THRESHOLD=2 GiB, M_TOP_PAD=1 GiB).
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return all(libc.mallopt(option, value) == 1 for option, value in ((-4, 0), (-1, 2**31 - 1), (-2, 1 << 30)))


def best_epoch_keeper(base: type, network, validate, patience: int, cap_s: float) -> object:
    """A callback (subclass of `base`, Lightning's or pytorch_lightning's Callback) shared by both trainers.

    It times each training epoch, then scores the validation split with `validate(net)` (outside the
    timed span), keeps the best epoch's weights, and stops training after `patience` epochs without
    a gain or once the timed epochs add up to `cap_s` seconds. `network(pl_module)` is the nn.Module
    that scores: ours `module.model`, RecTools' `lightning_model.torch_model`.
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
            if len(self.val) - self.best_epoch >= patience:
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
    return statistics.median(time_call(fn) for _ in range(repeats))


@dataclass
class Data:
    """One data set's split, as both systems see it."""

    name: str
    dm: StreamRecDataModule
    split: Split
    num_items: int


def evaluate_full(score_fn, cases: Sequence[EvalCase], max_len: int) -> dict[str, float]:
    """Full-ranking HR@K / NDCG@K with our metric code: scores (B, N+1) per `EvalBatch`."""
    metrics = RankingMetrics(ks=(K,), exclude_seen=True)
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
                             group_by_length=not args.random_batches)
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


def train_ours(data: Data, recipe: dict[str, object], args: argparse.Namespace) -> tuple[Any, StreamRecModel]:
    """Train StreamRec with `recipe` (flat argument names, `_common.for_signature`); the keeper and the best epoch's
    model, in eval mode."""
    L.seed_everything(args.seed, verbose=False)
    module = StreamRecModule(**for_signature(StreamRecModule, num_items=data.num_items, max_len=args.max_len,
                                             ks=(K,), popularity_baseline=False, **recipe))
    keeper = best_epoch_keeper(
        L.Callback, lambda m: m.model, lambda net: evaluate(partial(ours_scores, net), data.split.valid, args.max_len),
        args.patience, 60 * args.trial_minutes,
    )
    trainer = L.Trainer(callbacks=[keeper], **trainer_kwargs(args))
    trainer.fit(module, train_dataloaders=data.dm.train_dataloader())
    model = module.model.eval()
    model.load_state_dict(keeper.best_state)
    return keeper, model


# ----------------------------------------------------------------------------- one trial per system


def matched_recipe(data: Data, loss: str, lr: float, args: argparse.Namespace) -> dict[str, object]:
    """Ours with RecTools' block, the trial's loss and lr; the warmup a tenth of the budget's steps, at most 100."""
    batches = args.limit_batches or -(-len(data.dm.train_set) // args.batch_size)
    return dict(d_model=args.d_model, n_heads=args.n_heads, n_layers=args.n_layers, d_ff=args.d_model,
                dropout=args.dropout, attn_dropout=args.dropout, activation="relu", loss=LOSSES[loss]["ours"],
                num_negatives=GBCE_NEGATIVES, gbce_t=GBCE_T, lr=lr, cpu_fastpath=args.cpu_fastpath,
                warmup_steps=min(100, max(1, args.max_epochs * batches // 10)))


def trial_ours(data: Data, recipe: dict[str, object], args: argparse.Namespace) -> dict[str, object]:
    """Train StreamRec with early stopping on validation; the best epoch's test metrics and scoring time."""
    keeper, model = train_ours(data, recipe, args)
    cases = data.split.test
    test = evaluate_full(partial(ours_scores, model), cases, args.max_len)
    histories = [list(c.history) for c in cases]
    score_s = median_seconds(lambda: ours_recommend_all(model, histories))
    return trial_result(keeper, len(data.dm.train_set), test, score_s, args)


def trial_rectools(data: Data, loss: str, lr: float, args: argparse.Namespace) -> dict[str, object]:
    """Train RecTools' SASRecModel the same way; cold users get recommendations with a warning, not a crash."""
    rt_loss = LOSSES[loss]["rectools"]
    model = SASRecModel(
        n_blocks=args.n_layers, n_heads=args.n_heads, n_factors=args.d_model, dropout_rate=args.dropout,
        session_max_len=args.max_len, loss=rt_loss, lr=lr, batch_size=args.batch_size, epochs=args.max_epochs,
        recommend_batch_size=SCORE_BATCH, recommend_torch_device="cpu",
        **({"n_negatives": GBCE_NEGATIVES, "gbce_t": GBCE_T} if rt_loss == "gBCE" else {}),
    )
    scorers: dict[int, RecToolsScorer] = {}  # built once the data preparator knows RecTools' item ids

    def validate(net) -> float:
        scorer = scorers.setdefault(id(net), RecToolsScorer(model, data.num_items))
        return evaluate(lambda b: scorer([data.split.valid[int(r)].history for r in b.rows]), data.split.valid,
                        args.max_len)

    keeper = best_epoch_keeper(PL.Callback, lambda m: m.torch_model, validate, args.patience,
                               60 * args.trial_minutes)
    # RecTools deep-copies this trainer into `fit_trainer`; the keeper is read from there.
    model._trainer = PL.Trainer(callbacks=[keeper], **trainer_kwargs(args))
    PL.seed_everything(args.seed, verbose=False)
    model.fit(rectools_dataset(data.split.train))
    keeper = next(c for c in model.fit_trainer.callbacks if hasattr(c, "best_state"))
    model.torch_model.load_state_dict(keeper.best_state)
    model.torch_model.eval()
    cases = data.split.test
    scorer = RecToolsScorer(model, data.num_items)
    test = evaluate_full(lambda b: scorer([cases[int(r)].history for r in b.rows]), cases, args.max_len)
    users = [c.user for c in cases]
    recommend_rt = rectools_dataset({c.user: list(c.history) for c in cases})
    user_array = np.array(users, dtype=object)
    score_s = median_seconds(lambda: model.recommend(users=user_array, dataset=recommend_rt, k=K, filter_viewed=True,
                                                     on_unsupported_targets="warn"))
    n_seq = model.data_preparator.train_dataset.user_id_map.size
    result = trial_result(keeper, n_seq, test, score_s, args)
    result["unknown_items"] = scorer.unknown_items
    return result


# ----------------------------------------------------------------------------- StreamRec scoring


def ours_recommend_all(model: StreamRecModel, histories: Sequence[Sequence[int]]) -> Tensor:
    """Top-K of every user, seen items filtered, in batches of similar length as `streamrec.score` runs them:
    (U, K) item ids in the users' order."""
    tops = torch.empty(len(histories), K, dtype=torch.long)
    for batch in length_batches([len(h) for h in histories], SCORE_BATCH):
        tops[batch] = recommend(model, [histories[i] for i in batch], RankingOptions(top_k=K))[1]
    return tops


# ----------------------------------------------------------------------------- RecTools side


def rectools_dataset(histories: dict[str, Sequence[int]]) -> Dataset:
    """A RecTools Dataset of the given histories; item ids are ours, datetime = position (order is all it needs)."""
    users = np.repeat(np.array(list(histories), dtype=object), [len(h) for h in histories.values()])
    items = np.concatenate([np.asarray(h, dtype=np.int64) for h in histories.values()])
    positions = np.concatenate([np.arange(len(h)) for h in histories.values()])
    df = pd.DataFrame({
        Columns.User: users, Columns.Item: items, Columns.Weight: 1.0,
        Columns.Datetime: pd.to_datetime(positions, unit="s"),
    })
    return Dataset.construct(df)


class RecToolsScorer:
    """(B, N+1) scores in our item ids from RecTools' network, the way its `recommend` computes them.

    Its `recommend` drops history items unknown to the trained model and encodes the last
    max_len of the rest; so does this. Items without a RecTools id score -inf.
    """

    def __init__(self, model: SASRecModel, num_items: int):
        self.net = model.torch_model.eval()
        item_map = model.data_preparator.item_id_map
        external = item_map.get_external_sorted_by_internal()  # internal id -> our id ("PAD" first)
        n_extra = model.data_preparator.n_item_extra_tokens
        self.ours_of_internal = torch.as_tensor(external[n_extra:].astype(np.int64))  # (n_known,)
        self.internal_of_ours = torch.zeros(num_items + 1, dtype=torch.long)  # 0 = unknown / padding
        self.internal_of_ours[self.ours_of_internal] = torch.arange(n_extra, n_extra + len(self.ours_of_internal))
        self.n_extra, self.num_items, self.max_len = n_extra, num_items, model.data_preparator.session_max_len
        self.unknown_items = num_items - len(self.ours_of_internal)

    @torch.no_grad()
    def __call__(self, histories: Sequence[Sequence[int]]) -> Tensor:
        x = torch.zeros(len(histories), self.max_len, dtype=torch.long)  # (B, T), RecTools' pad id is 0
        for row, h in enumerate(histories):
            ids = self.internal_of_ours[torch.as_tensor(list(h), dtype=torch.long)]
            ids = ids[ids != 0][-self.max_len :]
            if len(ids):
                x[row, self.max_len - len(ids) :] = ids
        item_embs = self.net.item_model.get_all_embeddings()
        hidden = self.net.encode_sessions({"x": x}, item_embs)[:, -1]  # (B, D)
        internal = (hidden @ item_embs[self.n_extra :].T).float()  # (B, n_known)
        scores = torch.full((len(histories), self.num_items + 1), float("-inf"))
        scores[:, self.ours_of_internal] = internal
        return scores


# ----------------------------------------------------------------------------- the search


def trial_key(data: Data, system: str, loss: str, lr: float, args: argparse.Namespace) -> dict[str, object]:
    """Everything that decides a trial's outcome; a stored trial with the same key is not run again."""
    return {"dataset": data.name, "data": str(args.paths[data.name]), "system": system, "loss": loss, "lr": lr,
            "max_len": args.max_len, "max_epochs": args.max_epochs, "patience": args.patience,
            "trial_minutes": args.trial_minutes, "d_model": args.d_model, "n_layers": args.n_layers,
            "n_heads": args.n_heads, "dropout": args.dropout, "batch_size": args.batch_size, "seed": args.seed,
            "precision": args.precision, "threads": args.threads, "limit_batches": args.limit_batches or 0,
            **({"recipe": ours_recipe(args)} if loss == DEFAULT else {}),
            **({"random_batches": True} if args.random_batches and system == "ours" else {}),
            **({"cpu_fastpath": True} if args.cpu_fastpath and system == "ours" else {})}


def search(data: Data, args: argparse.Namespace, trials: TrialLog, log: Console) -> dict[str, list[dict]]:
    """Every (system, loss, lr) trial of one data set, run or read from the log."""
    runs: dict[str, list[dict]] = {system: [] for system in SYSTEMS}
    plan = [(system, loss, lr) for loss in args.losses for lr in args.lrs for system in args.systems
            if not (system == "ours" and args.ours_recipe == DEFAULT)]
    if "ours" in args.systems and args.ours_recipe == DEFAULT:
        plan.insert(0, ("ours", DEFAULT, default_lr(args)))
    for system, loss, lr in plan:
        key = trial_key(data, system, loss, lr, args)
        result = trials.get(key)
        if result is None:
            log.log(f"{data.name}: {system} loss {loss} lr {lr:g} ...")
            if system == "rectools":
                result = trial_rectools(data, loss, lr, args)
            else:
                recipe = ours_recipe(args) if loss == DEFAULT else matched_recipe(data, loss, lr, args)
                result = trial_ours(data, recipe, args)
            trials.add(key, result)
            log.log(f"{data.name}: {system} loss {loss} lr {lr:g}: val NDCG@10 {result['val_ndcg@10']:.4f} "
                    f"at epoch {result['best_epoch']} of {result['epochs']} ({result['stopped_by']}), "
                    f"{result['epoch_s']:.1f} s/epoch")
        runs[system].append({"loss": loss, "lr": lr, **result})
    return runs


# ----------------------------------------------------------------------------- report


def figures(name: str, data: Data, runs: dict[str, list[dict]]) -> dict[str, float]:
    """The picks (best validation NDCG@10 per system) and their ratios, keys prefixed with the data set."""
    f: dict[str, float] = {f"{name}_num_users": len(data.split.test), f"{name}_num_items": data.num_items}
    pick = {system: max(runs[system], key=lambda r: r["val_ndcg@10"]) for system in SYSTEMS}
    for system, r in pick.items():
        for field in ("test_ndcg@10", "test_hr@10", "val_ndcg@10", "lr", "best_epoch", "epochs", "seq_per_s",
                      "score_s"):
            f[f"{name}_{system}_{field}"] = float(r[field])
        f[f"{name}_{system}_gbce"] = float(r["loss"] == "gbce")
        f[f"{name}_{system}_default_recipe"] = float(r["loss"] == DEFAULT)
        f[f"{name}_{system}_trials"] = float(len(runs[system]))
    f[f"{name}_ndcg_rel_diff"] = f[f"{name}_ours_test_ndcg@10"] / max(f[f"{name}_rectools_test_ndcg@10"], 1e-12) - 1
    f[f"{name}_train_speedup"] = f[f"{name}_ours_seq_per_s"] / f[f"{name}_rectools_seq_per_s"]
    f[f"{name}_score_speedup"] = f[f"{name}_rectools_score_s"] / f[f"{name}_ours_score_s"]
    return f


def report(console: Console, name: str, data: Data, runs: dict[str, list[dict]], f: dict[str, float]) -> None:
    rows = [[system, f"{r['loss']}, lr {r['lr']:g}", f"{r['val_ndcg@10']:.4f} ({r['best_epoch']}/{r['epochs']}, "
             f"{r['stopped_by']})"] for system in SYSTEMS for r in runs[system]]
    print_table(console, f"{name}: every trial, validation NDCG@{K} (best epoch / epochs, why it stopped)",
                ["system", "trial", "validation"], rows)
    o, t = f"{name}_ours_", f"{name}_rectools_"
    rows = [[label, f"{f[o + key]:{fmt}}", f"{f[t + key]:{fmt}}", ratio] for label, key, fmt, ratio in (
        (f"validation NDCG@{K}", "val_ndcg@10", ".4f", ""),
        (f"test NDCG@{K}", "test_ndcg@10", ".4f", f"{f[name + '_ndcg_rel_diff']:+.1%}"),
        (f"test HR@{K}", "test_hr@10", ".4f", ""),
        ("training sequences/s (median epoch)", "seq_per_s", ".0f", f"{f[name + '_train_speedup']:.2f}x"),
        (f"score every test user top-{K}, s", "score_s", ".2f", f"{f[name + '_score_speedup']:.2f}x"))]
    print_table(console, f"{name}: the picks, {len(data.split.test)} users, {data.num_items} items, test split",
                ["", "StreamRec", "RecTools", "ours/theirs"], rows)
    for target, floor in TARGETS.items():
        value = f[f"{name}_{target}"]
        console.print(f"{name}: target {target} >= {floor:g}: {value:.3f} {'met' if value >= floor else 'MISSED'}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--datasets", nargs="+", choices=tuple(DATASETS), default=list(DATASETS),
                   help="data sets to race on")
    p.add_argument("--data-dir", type=Path, default=DATA, help="folder holding ml-1m/, amazon-beauty/, ...")
    p.add_argument("--lrs", nargs="+", type=float, default=[1e-3, 3e-3, 1e-2], help="learning rates, both systems")
    p.add_argument("--losses", nargs="+", choices=tuple(LOSSES), default=list(LOSSES), help="losses, both systems")
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS),
                   help="run only these systems' trials (e.g. two processes, one per core); the tables need both")
    p.add_argument("--max-epochs", type=int, default=100, help="epoch budget per trial, both")
    p.add_argument("--patience", type=int, default=5, help="stop a trial after this many epochs without a gain")
    p.add_argument("--trial-minutes", type=float, default=30.0, help="training-time cap per trial, both")
    p.add_argument("--max-len", type=int, default=50, help="history length T for both models")
    p.add_argument("--precision", choices=tuple(PRECISIONS), default="32", help="training precision for both")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--batch-size", type=int, default=128, help="training batch size for both")
    p.add_argument("--d-model", type=int, default=64, help="model width = RecTools n_factors = FFN width")
    p.add_argument("--n-layers", type=int, default=2, help="transformer blocks")
    p.add_argument("--n-heads", type=int, default=1, help="attention heads")
    p.add_argument("--dropout", type=float, default=0.2, help="dropout everywhere, both models")
    p.add_argument("--ours-recipe", choices=("matched", DEFAULT), default="matched",
                   help="matched: ours gets RecTools' block shape and the same loss x lr search; default: ours trains "
                        "once with StreamRecModule's defaults (what fit gets when only the data is named), no search")
    p.add_argument("--ours-config", type=Path, metavar="YAML",
                   help="with --ours-recipe default: train the model block of this StreamRec config over the "
                        "module's defaults (e.g. configs/streamrec/ml1m.yaml), as fit --config trains it")
    p.add_argument("--malloc", choices=("default", "keep"), default="default",
                   help="keep: glibc keeps freed memory (no per-step page faults on big tensors), both models")
    p.add_argument("--cpu-fastpath", action="store_true",
                   help="ours: model.cpu_fastpath (oneDNN fp32 linears, a cheaper dropout mask), as ml1m.yaml and "
                        "beauty.yaml set it; with --ours-recipe default too")
    p.add_argument("--random-batches", action="store_true",
                   help="ours: random batches (data.group_by_length false), not fit's default length-grouped ones")
    p.add_argument("--limit-batches", type=int, help="train on only the first N batches an epoch (smoke runs only)")
    p.add_argument("--seed", type=int, default=0, help="seed for both")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "rectools_fair", help="folder for trials.jsonl")
    p.add_argument("--json", metavar="PATH", help="write every figure as one flat JSON object name -> number")
    args = p.parse_args(argv)
    if args.ours_config is not None and args.ours_recipe != DEFAULT:
        p.error("--ours-config needs --ours-recipe default (matched races RecTools' block shape)")
    if args.ours_config is not None and not args.ours_config.is_file():
        p.error(f"--ours-config: {args.ours_config} not found")
    for name in ("max_len", "max_epochs", "patience", "threads", "batch_size", "limit_batches"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    args.paths = {name: args.data_dir / DATASETS[name].relative_to(DATA) for name in args.datasets}
    for name, path in args.paths.items():
        if not path.is_file():
            p.error(f"{name}: data file {path} not found; pass --data-dir")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.malloc == "keep" and not keep_freed_memory():
        sys.exit("error: --malloc keep needs glibc's mallopt; run without it")
    torch.set_num_threads(args.threads)
    # Known, harmless noise from Lightning, pydantic and RecTools on this setting (no features, no validation loop).
    for message in (".*does not have many workers.*", ".*target users were considered cold.*", ".*val_dataloader.*",
                    ".*LeafSpec.*", ".*CatFeaturesItemNet.*", ".*Pydantic serializer.*",
                    ".*unique with argument that is not.*", ".*were considered cold.*"):
        warnings.filterwarnings("ignore", message)
    for name in ("lightning", "lightning.pytorch", "pytorch_lightning", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    console = Console(width=None if sys.stdout.isatty() else 132)
    log = Console(stderr=True, log_path=False, width=None if sys.stderr.isatty() else 132)

    import rectools

    console.print(f"[bold]StreamRec vs RecTools {rectools.__version__} SASRecModel[/]: loss {' / '.join(args.losses)} "
                  f"x lr {' / '.join(f'{lr:g}' for lr in args.lrs)}, up to {args.max_epochs} epochs, patience "
                  f"{args.patience}, {args.trial_minutes:g} min a trial; d_model {args.d_model}, {args.n_layers} "
                  f"blocks, {args.n_heads} head(s), max_len {args.max_len}, precision {args.precision}, torch "
                  f"{torch.__version__}, {torch.get_num_threads()} thread(s), load {os.getloadavg()[0]:.2f}")
    if args.ours_recipe == DEFAULT:
        console.print(f"StreamRec: one trial of {args.ours_config or 'its defaults'}: {ours_recipe(args)}")
    trials = TrialLog(args.out / "trials.jsonl")
    f: dict[str, float] = {
        "max_len": args.max_len, "max_epochs": args.max_epochs, "patience": args.patience,
        "trial_minutes": args.trial_minutes, "threads": torch.get_num_threads(), "dropout": args.dropout,
        "bf16": int(args.precision == "bf16"), "load_avg_start": os.getloadavg()[0],
    }
    written = False  # one system's trials alone give no tables and no figures
    for name in args.datasets:
        data = load_data(name, args)
        log.log(f"{name}: {len(data.split.train)} users, {data.num_items} items, {len(data.dm.train_set)} "
                "training sequences")
        runs = search(data, args, trials, log)
        if set(args.systems) != set(SYSTEMS):
            log.log(f"{name}: {' and '.join(args.systems)} trials done; rerun with both systems for the tables")
            continue
        figs = figures(name, data, runs)
        report(console, name, data, runs, figs)
        f.update(figs)
        if args.json:  # after every data set, so a long run leaves its figures so far
            write_json(args.json, {**f, "load_avg_end": os.getloadavg()[0]})
            written = True
    if written:
        console.print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
