"""StreamRec against RecTools' SASRecModel: training throughput, scoring time and full-ranking quality, one run.

Both models get the same leave-one-out split (`streamrec.data.leave_one_out_split`: last item
test, second-to-last validation, the rest training), the same size (d_model 64, 2 blocks,
1 head, feed-forward width 64 with ReLU: RecTools' SASRec block uses `n_factors` as its FFN
width; dropout 0.2 on embeddings, attention weights, inside and after the FFN), learned
positions, tied item embeddings, full-softmax loss, batch 128, max_len and the epoch budget.
The optimisers stay each library's own recipe (ours: AdamW with warmup-cosine, warmup = 10% of
the steps up to 100; RecTools: Adam, betas 0.9/0.98, constant lr); both at lr 1e-3 unless `--our-lr`
gives ours its own peak (our item table starts at std d^-1/2, RecTools' at 1, so ours needs a larger step).

- Training: sequences/s per epoch, excluding start-up (a callback times on_train_epoch_start ->
  on_train_epoch_end; neither trainer runs validation). One training sequence per user.
- Scoring: all test users, top-10, seen items filtered, from in-memory histories = training +
  validation items (ours: `streamrec.score.recommend` in batches of 256 sorted by history length; theirs:
  `SASRecModel.recommend(..., filter_viewed=True)`, recommend_batch_size 256, on a RecTools
  `Dataset` built beforehand). Interleaved A B A B; time = median, ratio = median of per-round ratios.
- Quality: OUR metric code (`streamrec.metrics.RankingMetrics`) on both models' full (B, N+1)
  score matrices: full ranking over all N items, seen items removed, ties pessimistic,
  leave-one-out test, K=10. RecTools' scores come from its own network (`encode_sessions`, last
  position, dot product with its item embeddings) on the same histories; items RecTools never saw
  in training score -inf. As a cross-check the same metric is also computed from the timed
  top-10 lists of both (they differ only when a target repeats a seen item).

Both models run in one process in `.venv-rectools` (RecTools 0.19.0 needs numpy 1.26 and Lightning
2.5.x, so it cannot live in `.venv`; our package installs there unchanged, torch is the same
2.13.0 CPU wheel). Started from another interpreter the script re-runs itself there.

    make bench-env-rectools                                              # once: creates .venv-rectools
    python benchmarks/streamrec_rectools.py --max-len 200 --epochs 1    # ML-1M prefix file
    python benchmarks/streamrec_rectools.py --max-len 50 --epochs 1 --json runs/rectools_ml1m_50.json
    python benchmarks/streamrec_rectools.py --dataset beauty --max-len 50 --epochs 1
    python benchmarks/streamrec_rectools.py --precision bf16 ...        # bf16-mixed training for both

Targets (same run, same size, max_len and loss): `train_speedup` >= 4, `score_speedup` >= 3,
`ndcg_rel_diff` >= 0.03 (ours vs RecTools' NDCG@10, relative).

JSON keys: {ours,rectools}_{epoch_s, seq_per_s, fit_s, score_s, ndcg@10, hr@10, list_ndcg@10,
list_hr@10}, train_speedup, score_speedup, ndcg_rel_diff, plus the setting (max_len, epochs,
threads, bf16, num_users, num_items, train_sequences, score_repeats, load_avg_start, load_avg_end).

Legend: U test users, B batch, T max_len, N items (ours 1..N, 0 = padding), K top-K.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from _common import ROOT, ensure_peer_venv

if __name__ == "__main__":
    ensure_peer_venv(__file__, ["rectools"], ".venv-rectools", "bench-env-rectools")

# ruff: noqa: E402  (imports after the venv check on purpose)
import argparse
import ctypes
import logging
import statistics
import time
import warnings
from collections.abc import Sequence
from functools import partial

import lightning as L
import numpy as np
import pandas as pd
import pytorch_lightning as PL
import torch
from _common import interleave, median_ratio, print_table, write_json
from rectools import Columns
from rectools.dataset import Dataset
from rectools.models import SASRecModel
from rich.console import Console
from torch import Tensor
from torch.utils.data import DataLoader

from streamrec.data import EvalCase, EvalDataset, StreamRecDataModule, collate_eval
from streamrec.metrics import RankingMetrics
from streamrec.model import PAD_ID, StreamRecModel
from streamrec.module import StreamRecModule
from streamrec.score import length_batches, recommend

DATASETS = {
    "ml-1m": ROOT.parent / "shared" / "data" / "ml-1m" / "ml-1m.sasrec-prefix.txt",
    "beauty": ROOT.parent / "shared" / "data" / "amazon-beauty" / "Beauty.txt",
}
TARGETS = {"train_speedup": 4.0, "score_speedup": 3.0, "ndcg_rel_diff": 0.03}
K = 10
SCORE_BATCH = 256  # users per forward pass when scoring, both libraries (RecTools' default)
PRECISIONS = {"32": "32-true", "bf16": "bf16-mixed"}


# ----------------------------------------------------------------------------- timing


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


def epoch_timer(base: type) -> object:
    """A callback (subclass of `base`, Lightning's or pytorch_lightning's Callback) timing each training epoch."""

    class EpochTimer(base):
        def __init__(self) -> None:
            self.seconds: list[float] = []
            self._start = 0.0

        def on_train_epoch_start(self, trainer, pl_module) -> None:
            self._start = time.perf_counter()

        def on_train_epoch_end(self, trainer, pl_module) -> None:
            self.seconds.append(time.perf_counter() - self._start)

    return EpochTimer()


def trainer_kwargs(args: argparse.Namespace) -> dict[str, object]:
    """The same trainer settings for both libraries: CPU, no validation, no logging or checkpoints."""
    return dict(max_epochs=args.epochs, min_epochs=args.epochs, accelerator="cpu", devices=1,
                precision=PRECISIONS[args.precision], logger=False, enable_checkpointing=False,
                enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                limit_train_batches=args.limit_batches or 1.0)


# ----------------------------------------------------------------------------- StreamRec side


def fit_ours(dm: StreamRecDataModule, args: argparse.Namespace) -> tuple[StreamRecModel, list[float], float]:
    """Train StreamRec; returns the model (eval mode), epoch seconds and the whole fit's seconds."""
    steps = args.epochs * (args.limit_batches or -(-len(dm.train_set) // args.batch_size))
    L.seed_everything(args.seed, verbose=False)
    module = StreamRecModule(
        num_items=dm.num_items, max_len=args.max_len, d_model=args.d_model, n_heads=args.n_heads,
        n_layers=args.n_layers, d_ff=args.d_model, dropout=args.dropout, attn_dropout=args.attn_dropout,
        activation="relu", loss="full", lr=args.our_lr or args.lr, warmup_steps=min(100, max(1, steps // 10)), ks=(K,),
        popularity_baseline=False,
    )
    timer = epoch_timer(L.Callback)
    trainer = L.Trainer(callbacks=[timer], **trainer_kwargs(args))
    start = time.perf_counter()
    trainer.fit(module, train_dataloaders=dm.train_dataloader())
    return module.model.eval(), timer.seconds, time.perf_counter() - start


def ours_recommend_all(model: StreamRecModel, histories: Sequence[Sequence[int]]) -> Tensor:
    """Top-K of every user, seen items filtered, in batches of similar length as `streamrec.score` runs them:
    (U, K) item ids in the users' order."""
    tops = torch.empty(len(histories), K, dtype=torch.long)
    for batch in length_batches([len(h) for h in histories], SCORE_BATCH):
        tops[batch] = recommend(model, [histories[i] for i in batch], K)[1]
    return tops


@torch.no_grad()
def ours_scores(model: StreamRecModel, batch) -> Tensor:
    """(B, N+1) float32 scores of one `EvalBatch`."""
    return model.recommend_scores(batch.inputs).float()


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


def fit_rectools(train: Dataset, args: argparse.Namespace) -> tuple[SASRecModel, list[float], float]:
    """Train RecTools' SASRecModel; returns the model, epoch seconds and the whole fit's seconds."""
    model = SASRecModel(
        n_blocks=args.n_layers, n_heads=args.n_heads, n_factors=args.d_model, dropout_rate=args.dropout,
        session_max_len=args.max_len, loss="softmax", lr=args.lr, batch_size=args.batch_size, epochs=args.epochs,
        recommend_batch_size=SCORE_BATCH, recommend_torch_device="cpu",
    )
    # A trainer like ours; RecTools deep-copies it into `fit_trainer`, so the timer is read from there.
    model._trainer = PL.Trainer(callbacks=[epoch_timer(PL.Callback)], **trainer_kwargs(args))
    PL.seed_everything(args.seed, verbose=False)
    start = time.perf_counter()
    model.fit(train)
    seconds = time.perf_counter() - start
    timer = next(c for c in model.fit_trainer.callbacks if hasattr(c, "seconds"))
    return model, timer.seconds, seconds


def rectools_recommend_all(model: SASRecModel, dataset: Dataset, users: np.ndarray) -> pd.DataFrame:
    """RecTools' own top-K with seen items filtered."""
    return model.recommend(users=users, dataset=dataset, k=K, filter_viewed=True)


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


# ----------------------------------------------------------------------------- evaluation


def evaluate(score_fn, cases: Sequence[EvalCase], max_len: int) -> dict[str, float]:
    """Full-ranking HR@K / NDCG@K with our metric code: scores (B, N+1) per `EvalBatch`."""
    metrics = RankingMetrics(ks=(K,), filter_seen=True)
    loader = DataLoader(EvalDataset(cases), batch_size=SCORE_BATCH, collate_fn=partial(collate_eval, max_len=max_len))
    for batch in loader:
        metrics.update(score_fn(batch), batch.targets, batch.seen)
    return {name: float(value) for name, value in metrics.compute().items()}


def evaluate_lists(tops: Tensor, cases: Sequence[EvalCase], num_items: int) -> dict[str, float]:
    """The same metric from top-K lists: listed items score K..1, the rest -inf (ties count against the target).

    A target in the list at position p then has rank p; one outside it has rank >= K.
    """
    scores = torch.full((tops.shape[0], num_items + 1), float("-inf"))
    listed = tops != PAD_ID
    rank_score = torch.arange(K, 0, -1, dtype=torch.float).expand_as(tops)
    scores.scatter_(1, tops.clamp_min(0), torch.where(listed, rank_score, float("-inf")))
    targets = torch.tensor([c.target for c in cases])
    metrics = RankingMetrics(ks=(K,), filter_seen=False)  # the lists are already filtered
    metrics.update(scores, targets)
    return {name: float(value) for name, value in metrics.compute().items()}


def rectools_tops(recs: pd.DataFrame, users: Sequence[str]) -> Tensor:
    """RecTools' recommendation table -> (U, K) our item ids in rank order (0 where a user got fewer)."""
    row_of = {u: i for i, u in enumerate(users)}
    tops = torch.zeros(len(users), K, dtype=torch.long)
    rows = recs[Columns.User].map(row_of).to_numpy()
    ranks = recs[Columns.Rank].to_numpy() - 1
    tops[torch.as_tensor(rows), torch.as_tensor(ranks)] = torch.as_tensor(recs[Columns.Item].to_numpy(np.int64))
    return tops


# ----------------------------------------------------------------------------- report


def _s(x: float) -> str:
    return f"{x:.2f}" if x < 10 else f"{x:.1f}"


def report(console: Console, f: dict[str, float]) -> None:
    rows = [
        ["epoch time, s (median)", _s(f["ours_epoch_s"]), _s(f["rectools_epoch_s"]), ""],
        ["training sequences/s", f"{f['ours_seq_per_s']:.0f}", f"{f['rectools_seq_per_s']:.0f}",
         f"{f['train_speedup']:.2f}x"],
        ["whole fit incl. set-up, s", _s(f["ours_fit_s"]), _s(f["rectools_fit_s"]), ""],
        [f"score all {f['num_users']:.0f} users top-{K}, s", f"{f['ours_score_s']:.2f}", f"{f['rectools_score_s']:.2f}",
         f"{f['score_speedup']:.2f}x"],
        [f"NDCG@{K}", f"{f['ours_ndcg@10']:.4f}", f"{f['rectools_ndcg@10']:.4f}", f"{f['ndcg_rel_diff']:+.1%}"],
        [f"HR@{K}", f"{f['ours_hr@10']:.4f}", f"{f['rectools_hr@10']:.4f}",
         f"{f['ours_hr@10'] / max(f['rectools_hr@10'], 1e-12) - 1:+.1%}"],
        [f"NDCG@{K} from the top-{K} lists", f"{f['ours_list_ndcg@10']:.4f}", f"{f['rectools_list_ndcg@10']:.4f}", ""],
        [f"HR@{K} from the top-{K} lists", f"{f['ours_list_hr@10']:.4f}", f"{f['rectools_list_hr@10']:.4f}", ""],
    ]
    print_table(console, "StreamRec vs RecTools SASRecModel", ["", "StreamRec", "RecTools", "ours/theirs"], rows)
    for name, floor in TARGETS.items():
        verdict = "met" if f[name] >= floor else "[red]MISSED[/]"
        console.print(f"target {name} >= {floor:g}: {f[name]:.3f} {verdict}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", choices=tuple(DATASETS), default="ml-1m", help="named data file (default ml-1m)")
    p.add_argument("--data", help="interaction file instead of --dataset's (read by streamrec.data.read_interactions)")
    p.add_argument("--max-len", type=int, default=200, help="history length T for both models (default 200)")
    p.add_argument("--epochs", type=int, default=1, help="training epochs for both (default 1)")
    p.add_argument("--precision", choices=tuple(PRECISIONS), default="32", help="training precision for both")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    p.add_argument("--batch-size", type=int, default=128, help="training batch size for both (default 128)")
    p.add_argument("--d-model", type=int, default=64, help="model width = RecTools n_factors = FFN width (default 64)")
    p.add_argument("--n-layers", type=int, default=2, help="transformer blocks (default 2)")
    p.add_argument("--n-heads", type=int, default=1, help="attention heads (default 1)")
    p.add_argument("--dropout", type=float, default=0.2, help="dropout everywhere, both models (default 0.2)")
    p.add_argument("--attn-dropout", type=float, help="StreamRec's attention-weight dropout (default --dropout, as "
                   "RecTools' nn.MultiheadAttention; 0 is StreamRec's default and keeps SDPA's fused kernel)")
    p.add_argument("--malloc", choices=("default", "keep"), default="default",
                   help="keep: glibc keeps freed memory (no per-step page faults on big tensors), both models")
    p.add_argument("--lr", type=float, default=1e-3, help="learning rate, both (default 1e-3, RecTools' default)")
    p.add_argument("--our-lr", type=float, help="StreamRec's peak learning rate instead of --lr (our embeddings start "
                   "8x smaller than RecTools' N(0, 1), so our recipe wants a larger step; see README)")
    p.add_argument("--limit-batches", type=int, help="train on only the first N batches an epoch, both (a quick speed "
                   "check: sequences/s then counts N x batch size; quality is not comparable to published runs)")
    p.add_argument("--score-repeats", type=int, default=3, help="interleaved scoring rounds (default 3)")
    p.add_argument("--seed", type=int, default=0, help="seed for both (default 0)")
    p.add_argument("--json", metavar="PATH", help="write every figure as one flat JSON object name -> number")
    args = p.parse_args(argv)
    for name in ("max_len", "epochs", "threads", "batch_size", "score_repeats", "limit_batches"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    args.data = Path(args.data) if args.data else DATASETS[args.dataset]
    args.attn_dropout = args.dropout if args.attn_dropout is None else args.attn_dropout
    if not args.data.is_file():
        p.error(f"data file {args.data} not found; pass --data PATH")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.malloc == "keep" and not keep_freed_memory():
        sys.exit("error: --malloc keep needs glibc's mallopt; run without it")
    torch.set_num_threads(args.threads)
    # Known, harmless noise from Lightning, pydantic and RecTools on this setting (no features, no validation).
    for message in (".*does not have many workers.*", ".*target users were considered cold.*", ".*val_dataloader.*",
                    ".*LeafSpec.*", ".*CatFeaturesItemNet.*", ".*Pydantic serializer.*",
                    ".*unique with argument that is not.*"):
        warnings.filterwarnings("ignore", message)
    for name in ("lightning", "lightning.pytorch", "pytorch_lightning", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    console = Console(width=None if sys.stdout.isatty() else 132)
    log = Console(stderr=True, log_path=False, width=None if sys.stderr.isatty() else 132)
    load_start = os.getloadavg()[0]

    dm = StreamRecDataModule(str(args.data), max_len=args.max_len, batch_size=args.batch_size)
    dm.setup("fit")
    split, num_items = dm.splits, dm.num_items
    cases = split.test
    users = [c.user for c in cases]
    histories = [list(c.history) for c in cases]  # training + validation items
    repeats = sum(c.target in set(c.history) for c in cases)

    import rectools

    console.print(f"[bold]StreamRec vs RecTools {rectools.__version__} SASRecModel[/] on {args.data.name}: "
                  f"{len(split.train)} users, {num_items} items, {len(dm.train_set)} training sequences")
    console.print(f"model: d_model {args.d_model}, {args.n_layers} blocks, {args.n_heads} head, "
                  f"FFN {args.d_model} ReLU, "
                  f"dropout {args.dropout} (StreamRec attention weights {args.attn_dropout}), max_len {args.max_len}, "
                  f"full softmax, batch {args.batch_size}, {args.epochs} epoch(s)"
                  f"{f' of {args.limit_batches} batches' if args.limit_batches else ''}, precision {args.precision}, "
                  f"lr {args.lr:g} (StreamRec {args.our_lr or args.lr:g}), malloc {args.malloc}")
    console.print(f"protocol: full ranking over {num_items} items, seen items removed, leave-one-out test "
                  f"({len(cases)} users; {repeats} targets repeat a seen item), K={K}; our RankingMetrics on both")
    console.print(f"torch {torch.__version__} | threads {torch.get_num_threads()} | Lightning {L.__version__} | "
                  f"load average {load_start:.2f} on {os.cpu_count()} cores")
    if load_start > (os.cpu_count() or 1):
        console.print(f"[yellow]load average {load_start:.1f} on {os.cpu_count()} cores: other jobs share the CPU, "
                      "absolute times are inflated; compare the ratios[/]")

    log.log("training StreamRec")
    ours, ours_epochs, ours_fit = fit_ours(dm, args)
    log.log(f"StreamRec epochs: {', '.join(f'{s:.1f} s' for s in ours_epochs)}")
    train_rt = rectools_dataset(split.train)
    log.log("training RecTools SASRecModel")
    theirs, rt_epochs, rt_fit = fit_rectools(train_rt, args)
    log.log(f"RecTools epochs: {', '.join(f'{s:.1f} s' for s in rt_epochs)}")
    n_seq_rt = theirs.data_preparator.train_dataset.user_id_map.size
    if n_seq_rt != len(dm.train_set):
        log.log(f"[yellow]RecTools trains on {n_seq_rt} sequences, StreamRec on {len(dm.train_set)}[/]")

    log.log("scoring all users (interleaved)")
    recommend_rt = rectools_dataset(dict(zip(users, histories, strict=True)))
    user_array = np.array(users, dtype=object)
    out: dict[str, object] = {}  # the last round's top-K of each side, for the list-based cross-check

    def score_ours() -> None:
        out["ours"] = ours_recommend_all(ours, histories)

    def score_rectools() -> None:
        out["rectools"] = rectools_recommend_all(theirs, recommend_rt, user_array)

    times = interleave({"ours": score_ours, "rectools": score_rectools}, args.score_repeats)

    log.log("evaluating")
    scorer = RecToolsScorer(theirs, num_items)
    q_ours = evaluate(partial(ours_scores, ours), cases, args.max_len)
    q_rt = evaluate(lambda b: scorer([cases[int(r)].history for r in b.rows]), cases, args.max_len)
    l_ours = evaluate_lists(out["ours"], cases, num_items)
    l_rt = evaluate_lists(rectools_tops(out["rectools"], users), cases, num_items)

    f: dict[str, float] = {
        "max_len": args.max_len, "epochs": args.epochs, "lr": args.lr, "our_lr": args.our_lr or args.lr,
        "threads": torch.get_num_threads(),
        "bf16": int(args.precision == "bf16"), "malloc_keep": int(args.malloc == "keep"),
        "attn_dropout": args.attn_dropout, "num_users": len(cases), "num_items": num_items,
        "train_sequences": len(dm.train_set), "score_repeats": args.score_repeats,
        "limit_batches": args.limit_batches or 0,
        "rectools_unknown_items": scorer.unknown_items, "targets_seen_before": repeats,
    }
    seq_ours, seq_rt = len(dm.train_set), n_seq_rt
    if args.limit_batches:
        seq_ours = min(seq_ours, args.limit_batches * args.batch_size)
        seq_rt = min(seq_rt, args.limit_batches * args.batch_size)
    for side, epochs, fit_s, n_seq in (("ours", ours_epochs, ours_fit, seq_ours),
                                       ("rectools", rt_epochs, rt_fit, seq_rt)):
        f[f"{side}_epoch_s"] = statistics.median(epochs)
        f[f"{side}_seq_per_s"] = n_seq / f[f"{side}_epoch_s"]
        f[f"{side}_fit_s"] = fit_s
        f[f"{side}_score_s"] = statistics.median(times[side])
    for side, q, lq in (("ours", q_ours, l_ours), ("rectools", q_rt, l_rt)):
        for m in ("ndcg", "hr"):
            f[f"{side}_{m}@{K}"] = q[f"{m}@{K}"]
            f[f"{side}_list_{m}@{K}"] = lq[f"{m}@{K}"]
    f["train_speedup"] = f["ours_seq_per_s"] / f["rectools_seq_per_s"]
    f["score_speedup"] = median_ratio(times["rectools"], times["ours"])
    f["ndcg_rel_diff"] = f["ours_ndcg@10"] / max(f["rectools_ndcg@10"], 1e-12) - 1
    f["load_avg_start"], f["load_avg_end"] = load_start, os.getloadavg()[0]

    report(console, f)
    console.print(f"load average: {f['load_avg_start']:.2f} at the start, {f['load_avg_end']:.2f} at the end; "
                  f"RecTools knows {num_items - scorer.unknown_items} of {num_items} items")
    if args.json:
        write_json(args.json, f)
        console.print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
