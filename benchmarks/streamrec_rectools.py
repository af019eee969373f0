"""StreamRec against RecTools' SASRecModel, a fair race: same split, same budget, same search, four data sets.

Both run every lr in `--lrs` times every loss in `--losses` (softmax; gbce: gSASRec's, 256 negatives, t 0.75). A
trial trains up to `--max-epochs`, scores validation NDCG@10 after every epoch (full ranking, seen items removed,
our metrics on both networks' scores), stops after `--patience` epochs without a gain or `--trial-minutes` of
training and keeps its best epoch; each system's pick alone is scored on the test split. Same for both: the split,
RecTools' block (d_model 64, 2 blocks, 1 head, FFN 64 ReLU, dropout 0.2), batch 128, max_len, precision, threads;
each keeps its optimiser. `--ours-recipe default`: one trial of `StreamRecModule`'s defaults instead (with
`--ours-config YAML`, that config's model block over them). Reported: test HR@10 / NDCG@10, training sequences/s
(median epoch), ours' training FLOP/s (one step per batch shape of an epoch counted) and MFU against this machine's
GEMM peak in the training precision, the time to score every test user. Trials go to `OUT/trials.jsonl`, read
back by a rerun with the same settings (`--systems ours` and `--systems rectools` can share the work).

    make bench-env-rectools                                    # once: creates .venv-rectools
    python benchmarks/streamrec_rectools.py --datasets beauty --out runs/race --json runs/race.json

Targets per data set: ours test NDCG@10 >= 1.03 x RecTools', training sequences/s >= 4x.

JSON keys, per data set D: D_{ours,rectools}_{test_ndcg@10, test_hr@10, val_ndcg@10, lr, gbce, best_epoch, epochs,
seq_per_s, score_s, trials}, D_ours_{flop_s,mfu}, D_ndcg_rel_diff, D_train_speedup, D_score_speedup, plus
peak_flop_s and the setting. Legend: B batch, T max_len, N items (ours 1..N, 0 = padding), K top-K.
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
import copy
import ctypes
import inspect
import itertools
import json
import logging
import statistics
import time
import warnings
from collections.abc import Sequence
from functools import partial
from types import SimpleNamespace

import lightning as L
import numpy as np
import pandas as pd
import pytorch_lightning as PL
import rectools
import torch
import yaml
from _common import console, loader_flops, peak_gemm_flops, print_table, time_call, write_json
from rectools import Columns
from rectools.dataset import Dataset
from rectools.models import SASRecModel
from torch import Tensor
from torch.utils.data import DataLoader

from streamrec.data.datamodule import StreamRecDataModule
from streamrec.data.datasets import EvalDataset, collate_eval
from streamrec.model.metrics import RankingMetrics
from streamrec.model.module import StreamRecModule
from streamrec.model.network import StreamRecModel
from streamrec.ranking.batch import RankingOptions, length_batches, recommend

DATA = ROOT.parent / "shared" / "data"
DATASETS = {"ml-1m": "ml-1m/ml-1m.sasrec-prefix.txt", "beauty": "amazon-beauty/Beauty.txt",
            "sports": "amazon-sports/Sports_and_Outdoors.txt", "yelp": "yelp/Yelp.txt"}
K = 10
SCORE_BATCH = 256  # users per forward pass when scoring, both libraries (RecTools' default)
PRECISIONS = {"32": "32-true", "bf16": "bf16-mixed"}
TARGETS = {"ndcg_rel_diff": 0.03, "train_speedup": 4.0}
LOSSES = {"softmax": {"ours": "full", "rectools": "softmax"}, "gbce": {"ours": "gbce", "rectools": "gBCE"}}
GBCE_NEGATIVES, GBCE_T = 256, 0.75  # gSASRec's setting, which RecTools' tutorial uses for gBCE
SYSTEMS = ("ours", "rectools")
DEFAULT = "default"  # the loss label of ours' one trial with `--ours-recipe default`


def ours_recipe(args: argparse.Namespace) -> dict[str, object]:
    """One `--ours-recipe default` trial: `--ours-config`'s model block (groups flattened) over the defaults."""
    recipe: dict[str, object] = {}
    if args.ours_config is not None:
        for name, value in ((yaml.safe_load(args.ours_config.read_text()) or {}).get("model") or {}).items():
            recipe.update(value if isinstance(value, dict) else {name: value})
        try:
            for_signature(StreamRecModule, **recipe)
        except TypeError as e:
            sys.exit(f"error: {args.ours_config}: {e}")
    return recipe | ({"cpu_fastpath": True} if args.cpu_fastpath else {})


def matched_recipe(data, loss: str, lr: float, args: argparse.Namespace) -> dict[str, object]:
    """Ours with RecTools' block, the trial's loss and lr; the warmup a tenth of the budget's steps, at most 100."""
    batches = args.limit_batches or -(-len(data.dm.train_set) // args.batch_size)
    return dict(d_model=args.d_model, n_heads=args.n_heads, n_layers=args.n_layers, d_ff=args.d_model,
                dropout=args.dropout, attn_dropout=args.dropout, activation="relu", loss=LOSSES[loss]["ours"],
                num_negatives=GBCE_NEGATIVES, gbce_t=GBCE_T, lr=lr, cpu_fastpath=args.cpu_fastpath,
                warmup_steps=min(100, max(1, args.max_epochs * batches // 10)))


def keep_freed_memory() -> bool:
    """glibc: serve big blocks from the heap and never trim it, so freed memory is reused without page faults
    (by default every block over 32 MiB is a fresh mmap, zero-filled page by page on first touch)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    # M_MMAP_MAX 0, M_TRIM_THRESHOLD 2 GiB, M_TOP_PAD 1 GiB
    return all(libc.mallopt(option, value) == 1 for option, value in ((-4, 0), (-1, 2**31 - 1), (-2, 1 << 30)))


def best_epoch_keeper(base: type, network, validate, patience: int, cap_s: float) -> object:
    """A callback (subclass of `base`: Lightning's or pytorch_lightning's Callback) shared by both trainers: it times
    each training epoch, scores validation with `validate(network(pl_module))` outside the timed span, keeps the
    best epoch's weights, and stops after `patience` epochs without a gain or `cap_s` seconds of training."""

    class BestEpoch(base):
        def __init__(self) -> None:
            self.seconds: list[float] = []
            self.val: list[float] = []
            self.best, self.best_epoch, self.best_state, self.stopped_by = -1.0, 0, None, "max_epochs"

        def on_train_epoch_start(self, trainer, pl_module) -> None:
            self._start = time.perf_counter()

        def on_train_epoch_end(self, trainer, pl_module) -> None:
            self.seconds.append(time.perf_counter() - self._start)
            net = network(pl_module)
            was_training = net.training
            score = validate(net.eval())
            net.train(was_training)
            self.val.append(score)
            print(f"  epoch {len(self.val)}: val NDCG@10 {score:.4f} ({self.seconds[-1]:.0f} s)", file=sys.stderr,
                  flush=True)
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


def evaluate(score_fn, cases, max_len: int) -> dict[str, float]:
    """Full-ranking HR@K / NDCG@K with our metric code: `score_fn(EvalBatch)` gives (B, N+1) scores."""
    metrics = RankingMetrics(ks=(K,), exclude_seen=True)
    for batch in DataLoader(EvalDataset(cases), batch_size=SCORE_BATCH, collate_fn=partial(collate_eval,
                                                                                             max_len=max_len)):
        metrics.update(score_fn(batch), batch.targets, batch.seen)
    return {name: float(value) for name, value in metrics.compute().items()}


class TrialLog:
    """`OUT/trials.jsonl`: one line per finished trial, appended and flushed as it ends."""

    def __init__(self, path: Path):
        self.path, self.done = path, {}
        for n, line in enumerate(path.read_text().splitlines() if path.exists() else [], start=1):
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


def trial_result(keeper, n_seq: int, test: dict[str, float], score_s: float, args) -> dict[str, object]:
    epoch_s = statistics.median(keeper.seconds)
    if args.limit_batches:
        n_seq = min(n_seq, args.limit_batches * args.batch_size)
    return {"val_ndcg@10": keeper.best, "best_epoch": keeper.best_epoch, "epochs": len(keeper.seconds),
            "stopped_by": keeper.stopped_by, "val_curve": [round(v, 5) for v in keeper.val], "epoch_s": epoch_s,
            "train_s": sum(keeper.seconds), "seq_per_s": n_seq / epoch_s, "test_ndcg@10": test[f"ndcg@{K}"],
            "test_hr@10": test[f"hr@{K}"], "score_s": score_s}


@torch.no_grad()
def ours_scores(model: StreamRecModel, batch) -> Tensor:
    return model.recommend_scores(batch.inputs).float()


def ours_recommend_all(model: StreamRecModel, histories: Sequence[Sequence[int]]) -> Tensor:
    """Top-K of every user, seen items filtered, in batches of similar length as `streamrec.score` runs them."""
    tops = torch.empty(len(histories), K, dtype=torch.long)
    for batch in length_batches([len(h) for h in histories], SCORE_BATCH):
        tops[batch] = recommend(model, [histories[i] for i in batch], RankingOptions(top_k=K))[1]
    return tops


def trial_ours(data, recipe: dict[str, object], args) -> dict[str, object]:
    """Train StreamRec with `recipe` (flat names) and early stopping on validation; the best epoch's test metrics,
    scoring time and training FLOP/s."""
    L.seed_everything(args.seed, verbose=False)
    module = StreamRecModule(**for_signature(StreamRecModule, num_items=data.num_items, max_len=args.max_len,
                                             ks=(K,), popularity_baseline=False, **recipe))
    probe = copy.deepcopy(module)  # one training epoch's FLOPs, counted on a copy
    flops = loader_flops(lambda b: probe.training_step(b, 0).backward(),
                         itertools.islice(data.dm.train_dataloader(), args.limit_batches), lambda b: b.inputs.shape)
    keeper = best_epoch_keeper(L.Callback, lambda m: m.model,
                               lambda net: evaluate(partial(ours_scores, net), data.split.valid, args.max_len)
                               [f"ndcg@{K}"], args.patience, 60 * args.trial_minutes)
    L.Trainer(callbacks=[keeper], **trainer_kwargs(args)).fit(module, train_dataloaders=data.dm.train_dataloader())
    model = module.model.eval()
    model.load_state_dict(keeper.best_state)
    test = evaluate(partial(ours_scores, model), data.split.test, args.max_len)
    histories = [list(c.history) for c in data.split.test]
    score_s = statistics.median(time_call(lambda: ours_recommend_all(model, histories)) for _ in range(3))
    result = trial_result(keeper, len(data.dm.train_set), test, score_s, args)
    flop_s = flops / result["epoch_s"]
    return result | {"epoch_gflop": flops / 1e9, "flop_s": flop_s, "mfu": flop_s / args.peak}


def rectools_dataset(histories: dict[str, Sequence[int]]) -> Dataset:
    """A RecTools Dataset of the given histories; item ids are ours, datetime = position (order is all it needs)."""
    users = np.repeat(np.array(list(histories), dtype=object), [len(h) for h in histories.values()])
    items = np.concatenate([np.asarray(h, dtype=np.int64) for h in histories.values()])
    positions = np.concatenate([np.arange(len(h)) for h in histories.values()])
    return Dataset.construct(pd.DataFrame({Columns.User: users, Columns.Item: items, Columns.Weight: 1.0,
                                           Columns.Datetime: pd.to_datetime(positions, unit="s")}))


class RecToolsScorer:
    """(B, N+1) scores in our item ids from RecTools' network, the way its `recommend` computes them: history items
    unknown to the trained model dropped, the last max_len of the rest encoded; items without a RecTools id -inf."""

    def __init__(self, model: SASRecModel, num_items: int):
        self.net = model.torch_model.eval()
        external = model.data_preparator.item_id_map.get_external_sorted_by_internal()  # internal -> ours, PAD first
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
        scores = torch.full((len(histories), self.num_items + 1), float("-inf"))
        scores[:, self.ours_of_internal] = (hidden @ item_embs[self.n_extra :].T).float()  # (B, n_known)
        return scores


def trial_rectools(data, loss: str, lr: float, args) -> dict[str, object]:
    """Train RecTools' SASRecModel the same way; cold users get recommendations with a warning, not a crash."""
    rt_loss = LOSSES[loss]["rectools"]
    model = SASRecModel(
        n_blocks=args.n_layers, n_heads=args.n_heads, n_factors=args.d_model, dropout_rate=args.dropout,
        session_max_len=args.max_len, loss=rt_loss, lr=lr, batch_size=args.batch_size, epochs=args.max_epochs,
        recommend_batch_size=SCORE_BATCH, recommend_torch_device="cpu",
        **({"n_negatives": GBCE_NEGATIVES, "gbce_t": GBCE_T} if rt_loss == "gBCE" else {}))
    scorers: dict[int, RecToolsScorer] = {}  # built once the data preparator knows RecTools' item ids

    def validate(net) -> float:
        scorer = scorers.setdefault(id(net), RecToolsScorer(model, data.num_items))
        return evaluate(lambda b: scorer([data.split.valid[int(r)].history for r in b.rows]), data.split.valid,
                        args.max_len)[f"ndcg@{K}"]

    keeper = best_epoch_keeper(PL.Callback, lambda m: m.torch_model, validate, args.patience, 60 * args.trial_minutes)
    model._trainer = PL.Trainer(callbacks=[keeper], **trainer_kwargs(args))  # RecTools deep-copies it to fit_trainer
    PL.seed_everything(args.seed, verbose=False)
    model.fit(rectools_dataset(data.split.train))
    keeper = next(c for c in model.fit_trainer.callbacks if hasattr(c, "best_state"))
    model.torch_model.load_state_dict(keeper.best_state)
    model.torch_model.eval()
    cases = data.split.test
    scorer = RecToolsScorer(model, data.num_items)
    test = evaluate(lambda b: scorer([cases[int(r)].history for r in b.rows]), cases, args.max_len)
    users = np.array([c.user for c in cases], dtype=object)
    recommend_rt = rectools_dataset({c.user: list(c.history) for c in cases})
    score_s = statistics.median(time_call(lambda: model.recommend(
        users=users, dataset=recommend_rt, k=K, filter_viewed=True, on_unsupported_targets="warn")) for _ in range(3))
    n_seq = model.data_preparator.train_dataset.user_id_map.size
    return trial_result(keeper, n_seq, test, score_s, args) | {"unknown_items": scorer.unknown_items}


def trial_key(data, system: str, loss: str, lr: float, args: argparse.Namespace) -> dict[str, object]:
    """Everything that decides a trial's outcome; a stored trial with the same key is not run again."""
    return {"dataset": data.name, "data": str(args.paths[data.name]), "system": system, "loss": loss, "lr": lr,
            **{name: getattr(args, name) for name in ("max_len", "max_epochs", "patience", "trial_minutes",
                                                      "d_model", "n_layers", "n_heads", "dropout", "batch_size",
                                                      "seed", "precision", "threads")},
            "limit_batches": args.limit_batches or 0, **({"recipe": ours_recipe(args)} if loss == DEFAULT else {}),
            **({"random_batches": True} if args.random_batches and system == "ours" else {}),
            **({"cpu_fastpath": True} if args.cpu_fastpath and system == "ours" else {})}


def search(data, args: argparse.Namespace, trials: TrialLog, log) -> dict[str, list[dict]]:
    """Every (system, loss, lr) trial of one data set, run or read from the log."""
    runs: dict[str, list[dict]] = {system: [] for system in SYSTEMS}
    default = args.ours_recipe == DEFAULT
    plan = [(s, loss, lr) for loss in args.losses for lr in args.lrs for s in args.systems
            if not (s == "ours" and default)]
    if "ours" in args.systems and default:
        lr = ours_recipe(args).get("lr", inspect.signature(StreamRecModule).parameters["lr"].default)
        plan.insert(0, ("ours", DEFAULT, float(lr)))
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
            log.log(f"{data.name}: {system} loss {loss} lr {lr:g}: val NDCG@10 {result['val_ndcg@10']:.4f} at epoch "
                    f"{result['best_epoch']} of {result['epochs']} ({result['stopped_by']}), {result['epoch_s']:.1f} "
                    "s/epoch")
        runs[system].append({"loss": loss, "lr": lr, **result})
    return runs


def figures(name: str, data, runs: dict[str, list[dict]]) -> dict[str, float]:
    """The picks (best validation NDCG@10 per system) and their ratios, keys prefixed with the data set."""
    f: dict[str, float] = {f"{name}_num_users": len(data.split.test), f"{name}_num_items": data.num_items}
    for system in SYSTEMS:
        r = max(runs[system], key=lambda r: r["val_ndcg@10"])
        fields = ("test_ndcg@10", "test_hr@10", "val_ndcg@10", "lr", "best_epoch", "epochs", "seq_per_s", "score_s",
                  *(("flop_s", "mfu") if "mfu" in r else ()))  # trials stored before the FLOP count have none
        f |= {f"{name}_{system}_{field}": float(r[field]) for field in fields}
        f |= {f"{name}_{system}_gbce": float(r["loss"] == "gbce"), f"{name}_{system}_trials": float(len(runs[system])),
              f"{name}_{system}_default_recipe": float(r["loss"] == DEFAULT)}
    f[f"{name}_ndcg_rel_diff"] = f[f"{name}_ours_test_ndcg@10"] / max(f[f"{name}_rectools_test_ndcg@10"], 1e-12) - 1
    f[f"{name}_train_speedup"] = f[f"{name}_ours_seq_per_s"] / f[f"{name}_rectools_seq_per_s"]
    f[f"{name}_score_speedup"] = f[f"{name}_rectools_score_s"] / f[f"{name}_ours_score_s"]
    return f


def report(out, name: str, data, runs: dict[str, list[dict]], f: dict[str, float]) -> None:
    rows = [[system, f"{r['loss']}, lr {r['lr']:g}", f"{r['val_ndcg@10']:.4f} ({r['best_epoch']}/{r['epochs']}, "
             f"{r['stopped_by']})"] for system in SYSTEMS for r in runs[system]]
    print_table(out, f"{name}: every trial, validation NDCG@{K} (best epoch / epochs, why it stopped)",
                ["system", "trial", "validation"], rows)
    o, t = f"{name}_ours_", f"{name}_rectools_"
    rows = [[label, f"{f[o + key]:{fmt}}", f"{f[t + key]:{fmt}}", ratio] for label, key, fmt, ratio in (
        (f"validation NDCG@{K}", "val_ndcg@10", ".4f", ""),
        (f"test NDCG@{K}", "test_ndcg@10", ".4f", f"{f[name + '_ndcg_rel_diff']:+.1%}"),
        (f"test HR@{K}", "test_hr@10", ".4f", ""),
        ("training sequences/s (median epoch)", "seq_per_s", ".0f", f"{f[name + '_train_speedup']:.2f}x"),
        (f"score every test user top-{K}, s", "score_s", ".2f", f"{f[name + '_score_speedup']:.2f}x"))]
    if o + "mfu" in f:
        rows.append(["training GFLOP/s, MFU", f"{f[o + 'flop_s'] / 1e9:,.1f}, {100 * f[o + 'mfu']:.1f}%", "", ""])
    print_table(out, f"{name}: the picks, {len(data.split.test)} users, {data.num_items} items, test split",
                ["", "StreamRec", "RecTools", "ours/theirs"], rows)
    for target, floor in TARGETS.items():
        value = f[f"{name}_{target}"]
        out.print(f"{name}: target {target} >= {floor:g}: {value:.3f} {'met' if value >= floor else 'MISSED'}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add = p.add_argument
    add("--datasets", nargs="+", choices=tuple(DATASETS), default=list(DATASETS))
    add("--data-dir", type=Path, default=DATA, help="folder holding ml-1m/, amazon-beauty/, ...")
    add("--lrs", nargs="+", type=float, default=[1e-3, 3e-3, 1e-2], help="learning rates, both systems")
    add("--losses", nargs="+", choices=tuple(LOSSES), default=list(LOSSES), help="losses, both systems")
    add("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS), help="run only these systems' trials")
    add("--max-epochs", type=int, default=100, help="epoch budget per trial")
    add("--patience", type=int, default=5, help="stop a trial after this many epochs without a gain")
    add("--trial-minutes", type=float, default=30.0, help="training-time cap per trial")
    add("--max-len", type=int, default=50, help="history length T for both models")
    add("--precision", choices=tuple(PRECISIONS), default="32", help="training precision for both")
    add("--threads", type=int, default=1, help="torch CPU threads")
    add("--batch-size", type=int, default=128)
    add("--d-model", type=int, default=64, help="model width = RecTools n_factors = FFN width")
    add("--n-layers", type=int, default=2)
    add("--n-heads", type=int, default=1)
    add("--dropout", type=float, default=0.2, help="dropout everywhere, both models")
    add("--ours-recipe", choices=("matched", DEFAULT), default="matched",
        help="matched: RecTools' block and the same search; default: one trial of StreamRecModule's defaults")
    add("--ours-config", type=Path, metavar="YAML", help="with --ours-recipe default: this config's model block")
    add("--malloc", choices=("default", "keep"), default="default", help="keep: glibc keeps freed memory, both")
    add("--cpu-fastpath", action="store_true", help="ours: speed.cpu_fastpath, as the shipped configs set it")
    add("--random-batches", action="store_true", help="ours: random batches, not fit's length-grouped ones")
    add("--limit-batches", type=int, help="train on only the first N batches an epoch (smoke runs)")
    add("--seed", type=int, default=0)
    add("--out", type=Path, default=ROOT / "runs" / "rectools_fair", help="folder for trials.jsonl")
    add("--json", metavar="PATH", help="write every figure as one flat JSON object name -> number")
    args = p.parse_args(argv)
    if args.ours_config is not None and (args.ours_recipe != DEFAULT or not args.ours_config.is_file()):
        p.error(f"--ours-config needs --ours-recipe default and an existing file, got {args.ours_config}")
    for name in ("max_len", "max_epochs", "patience", "threads", "batch_size", "limit_batches"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    args.paths = {name: args.data_dir / DATASETS[name] for name in args.datasets}
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
    for message in (".*does not have many workers.*", ".*considered cold.*", ".*val_dataloader.*", ".*LeafSpec.*",
                    ".*CatFeaturesItemNet.*", ".*Pydantic serializer.*", ".*unique with argument that is not.*",
                    ".*self.log.*"):
        warnings.filterwarnings("ignore", message)
    for name in ("lightning", "lightning.pytorch", "pytorch_lightning", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    out, log = console(), console(stderr=True)
    args.peak = peak_gemm_flops("bf16" if args.precision == "bf16" else "fp32", args.threads)
    out.print(f"[bold]StreamRec vs RecTools {rectools.__version__} SASRecModel[/]: loss {' / '.join(args.losses)} x lr "
              f"{' / '.join(f'{lr:g}' for lr in args.lrs)}, up to {args.max_epochs} epochs, patience {args.patience}, "
              f"{args.trial_minutes:g} min a trial; d_model {args.d_model}, {args.n_layers} blocks, {args.n_heads} "
              f"head(s), max_len {args.max_len}, precision {args.precision}, torch {torch.__version__}, "
              f"{args.threads} thread(s), peak GEMM {args.peak / 1e9:,.1f} GFLOP/s, load {os.getloadavg()[0]:.2f}")
    if args.ours_recipe == DEFAULT:
        out.print(f"StreamRec: one trial of {args.ours_config or 'its defaults'}: {ours_recipe(args)}")
    trials = TrialLog(args.out / "trials.jsonl")
    f: dict[str, float] = {name: getattr(args, name) for name in ("max_len", "max_epochs", "patience",
                                                                  "trial_minutes", "threads", "dropout")}
    f |= {"bf16": int(args.precision == "bf16"), "peak_flop_s": args.peak, "load_avg_start": os.getloadavg()[0]}
    for name in args.datasets:
        dm = StreamRecDataModule(str(args.paths[name]), max_len=args.max_len, batch_size=args.batch_size,
                                 group_by_length=not args.random_batches)
        dm.setup("fit")
        data = SimpleNamespace(name=name, dm=dm, split=dm.splits, num_items=dm.num_items)
        log.log(f"{name}: {len(data.split.train)} users, {data.num_items} items, {len(dm.train_set)} sequences")
        runs = search(data, args, trials, log)
        if set(args.systems) != set(SYSTEMS):
            log.log(f"{name}: {' and '.join(args.systems)} trials done; rerun with both systems for the tables")
            continue
        figs = figures(name, data, runs)
        report(out, name, data, runs, figs)
        f.update(figs)
        write_json(args.json, {**f, "load_avg_end": os.getloadavg()[0]})  # after every data set


if __name__ == "__main__":
    main()
