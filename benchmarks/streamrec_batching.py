"""StreamRec training with length-grouped batches (`data.group_by_length`) against random ones, same run.

Both arms train the same model on the same windows for one epoch a round, rounds interleaved
(grouped, free, grouped, free, ...), each round from the same seed; the model trims every batch to
its longest window, so the grouped arm computes fewer padded positions. Reported: sequences/s (median
round), the speed-up (median of per-round ratios) and the share of the max_len x windows positions
each arm computes (counted from the batches, not timed). The model is the RecTools-shaped block of
`benchmarks/streamrec_rectools.py` (d_model 64, 2 blocks, 1 head, FFN 64 ReLU, dropout 0.2) with the
full-catalogue softmax.

    python benchmarks/streamrec_batching.py --data ../shared/data/ml-1m/ml-1m.sasrec-prefix.txt --max-len 200 \\
        --precision bf16 --json runs/batching_ml1m.json
    python benchmarks/streamrec_batching.py --device cuda --precision bf16   # generated log of ML-1M's size
    python benchmarks/streamrec_batching.py --positions-only                  # the positions table alone, no training

Without --data a log is generated (`data/make_streamrec_demo.py`) of ML-1M's shape: 6,040 users, 3,416
items, log-normal history lengths (median 96, 20 to 600).

JSON keys: {grouped,free}_{seq_per_s,positions}, speedup, plus the setting.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import numpy as np
import torch
from _common import ROOT, median_ratio, print_table, require_bf16_kernels, write_json
from rich.console import Console

from streamrec.data.datamodule import StreamRecDataModule
from streamrec.model.module import StreamRecModule

ARMS = ("grouped", "free")
USERS, ITEMS = 6040, 3416  # the generated log's size: ML-1M's
PRECISIONS = {"32": "32-true", "bf16": "bf16-mixed"}


class EpochTimer(L.Callback):
    """Seconds of the training epoch, the GPU's queued work included."""

    def __init__(self, device: str) -> None:
        self.seconds, self._start, self._sync = 0.0, 0.0, torch.cuda.synchronize if device == "cuda" else None

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if self._sync:
            self._sync()
        self._start = time.perf_counter()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if self._sync:
            self._sync()
        self.seconds = time.perf_counter() - self._start


def generated_log(folder: Path, seed: int) -> Path:
    spec = importlib.util.spec_from_file_location("make_streamrec_demo", ROOT / "data" / "make_streamrec_demo.py")
    demo = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look themselves up there
    spec.loader.exec_module(demo)
    # Lengths drawn like ML-1M's (log-normal, median 96, 20 to 600): the padding is what grouping removes.
    rows = demo.generate(users=USERS, items=ITEMS, seed=seed, min_len=600, max_len=600)
    users = sorted({user for user, _, _ in rows})
    left = dict(zip(users, np.clip(np.random.default_rng(seed).lognormal(np.log(96), 0.9, len(users)), 20, 600)
                    .astype(int).tolist(), strict=True))
    kept = []
    for row in rows:  # in time order, so each user keeps its first interactions
        if left[row[0]] > 0:
            left[row[0]] -= 1
            kept.append(row)
    return demo.write_csv(kept, folder / "interactions.csv")


def positions(dm: StreamRecDataModule) -> float:
    """Share of len(windows) x max_len positions that the trimmed batches of one epoch compute."""
    computed = sum(b.inputs.shape[0] * int((b.inputs > 0).sum(1).max()) for b in dm.train_dataloader())
    return computed / (len(dm.train_set) * dm.max_len)


def one_epoch(dm: StreamRecDataModule, args: argparse.Namespace) -> float:
    """Seconds of one training epoch of a fresh model (seeded: both arms start alike)."""
    L.seed_everything(args.seed, verbose=False)
    module = StreamRecModule(num_items=dm.num_items, max_len=args.max_len, d_model=64, n_heads=1, n_layers=2,
                             d_ff=64, dropout=0.2, attn_dropout=0.2, activation="relu", loss="full",
                             popularity_baseline=False, warmup_steps=10)
    timer = EpochTimer(args.device)
    trainer = L.Trainer(max_epochs=1, accelerator=args.device, devices=1, precision=PRECISIONS[args.precision],
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                        limit_train_batches=args.limit_batches or 1.0, callbacks=[timer])
    trainer.fit(module, train_dataloaders=dm.train_dataloader())
    return timer.seconds


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data", type=Path, help="interaction log (any format `fit` reads); default: a generated one")
    p.add_argument("--max-len", type=int, default=200, help="history length T")
    p.add_argument("--batch-size", type=int, default=128, help="windows per batch")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where to train")
    p.add_argument("--precision", choices=tuple(PRECISIONS), default="bf16", help="training precision")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds (one epoch per arm each)")
    p.add_argument("--limit-batches", type=int, help="train on only the first N batches of an epoch")
    p.add_argument("--positions-only", action="store_true", help="count positions only, train nothing")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated log, the models and the order")
    p.add_argument("--json", metavar="PATH", help="write the figures as one flat JSON object")
    args = p.parse_args(argv)
    for name in ("max_len", "batch_size", "threads", "repeats", "limit_batches"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.data is not None and not args.data.is_file():
        p.error(f"--data {args.data}: no such file")
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("error: --device cuda: no CUDA GPU here; run on one or use --device cpu")
    if args.device == "cpu" and args.precision == "bf16" and not args.positions_only:
        require_bf16_kernels("--precision bf16")
    torch.set_num_threads(args.threads)
    console = Console(width=None if sys.stdout.isatty() else 120)

    with tempfile.TemporaryDirectory() as tmp:
        path = args.data or generated_log(Path(tmp), args.seed)
        L.seed_everything(args.seed, verbose=False)  # the loaders take their order's seed from here
        dms = {arm: StreamRecDataModule(str(path), max_len=args.max_len, batch_size=args.batch_size,
                                        group_by_length=arm == "grouped") for arm in ARMS}
        for dm in dms.values():
            dm.setup("fit")
        shares = {arm: positions(dm) for arm, dm in dms.items()}
        times: dict[str, list[float]] = {arm: [] for arm in ARMS}
        if not args.positions_only:
            # Warm-up: on CUDA a whole epoch of each arm, so every batch shape has met its kernels once.
            warmup = argparse.Namespace(**{**vars(args), "limit_batches": None if args.device == "cuda" else 2})
            for arm in ARMS:
                one_epoch(dms[arm], warmup)
            for _ in range(args.repeats):
                for arm in ARMS:
                    times[arm].append(one_epoch(dms[arm], args))

    windows = len(dms["grouped"].train_set)
    if args.limit_batches:
        windows = min(windows, args.limit_batches * args.batch_size)
    device = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU, {torch.get_num_threads()} thread(s)"
    console.print(f"{path if args.data else 'generated log (6,040 users, 3,416 items)'}: {windows} windows an epoch, "
                  f"max_len {args.max_len}, batch {args.batch_size}, {args.precision}, {device}, torch "
                  f"{torch.__version__}, load average {os.getloadavg()[0]:.2f}")
    f: dict[str, float] = {"max_len": args.max_len, "batch_size": args.batch_size, "repeats": args.repeats,
                           "bf16": int(args.precision == "bf16"), "cuda": int(args.device == "cuda"),
                           "threads": torch.get_num_threads(), "windows": windows}
    rows = []
    for arm in ARMS:
        f[f"{arm}_positions"] = shares[arm]
        row = [arm, f"{shares[arm]:.1%}"]
        if times[arm]:
            f[f"{arm}_seq_per_s"] = windows / statistics.median(times[arm])
            row.append(f"{f[f'{arm}_seq_per_s']:,.0f}")
        rows.append(row)
    columns = ["batches", "positions computed"]
    if times["free"]:
        f["speedup"] = median_ratio(times["free"], times["grouped"])
        columns += ["sequences/s (median)", "speed-up"]
        rows[0].append(f"[bold]{f['speedup']:.2f}x[/]")
        rows[1].append("1 (baseline)")
    print_table(console, "Length-grouped against freely shuffled training batches", columns, rows)
    if args.json:
        write_json(args.json, f)
        console.print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
