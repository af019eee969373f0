"""StreamRec recipes on several data sets at once: which settings travel, judged on validation only.

Each variant is a set of `StreamRecModule` arguments over a base recipe (the module's defaults
plus `--set`); every (data set, variant) trial trains with early stopping on validation NDCG@10
(full ranking, seen items removed; `_streamrec_trials.train_ours`) and keeps its best epoch. The
table shows each trial's best validation NDCG@10 and, per variant, the geometric mean over the
data sets of its ratio to the first variant: a recipe is chosen on all data sets together, not
on one. The test split is never scored here (the race, `streamrec_rectools.py`, scores the pick).

Trials are appended to `OUT/trials.jsonl` as they end; a rerun skips those already there.

    python benchmarks/streamrec_recipe.py --datasets beauty sports \\
        --variants base: small_init:item_init_std=0.01 wd:weight_decay=0.1 --max-epochs 30 --json runs/recipe.json
    python benchmarks/streamrec_recipe.py --datasets beauty --variants a:lr=1e-3 b:lr=3e-3 --set dropout=0.5

JSON keys: D_V_val_ndcg@10, D_V_best_epoch, D_V_epochs, D_V_epoch_s per data set D and variant V;
V_geomean_ratio per variant (against the first).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import warnings
from pathlib import Path

import yaml
from _common import ROOT, print_table, write_json
from _streamrec_trials import (
    DATA,
    DATASETS,
    GROUPED,
    PRECISIONS,
    TrialLog,
    keep_freed_memory,
    load_data,
    train_ours,
)
from rich.console import Console

MAX_LEN_KEY = "max_len"  # a data setting, not a module argument: variants may set it too
PREFIXES_KEY = "prefixes"  # the data module's `prefixes` (every prefix its own example), also a data setting
EMA_KEY = "ema_decay"  # a trainer callback (Lightning's EMAWeightAveraging), not a module argument


def scalar(text: str) -> object:
    """An int, a float (1e-3, which YAML 1.1 would leave a string), or a YAML scalar (null, true, full)."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return yaml.safe_load(text)


def parse_assignments(text: str, where: str) -> dict[str, object]:
    """`key=value,key=value` -> dict; values read as YAML scalars (1e-3, null, full, true)."""
    out: dict[str, object] = {}
    for part in filter(None, text.split(",")):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise argparse.ArgumentTypeError(f"{where}: {part!r} is not key=value")
        out[key.strip()] = scalar(value.strip())
    return out


def parse_variant(text: str) -> tuple[str, dict[str, object]]:
    """`name:key=value,...` -> (name, assignments); `name:` is the base recipe unchanged."""
    name, sep, rest = text.partition(":")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"variant {text!r}: write NAME:key=value,... (NAME: alone for the base)")
    return name, parse_assignments(rest, f"variant {name}")


def trial_key(dataset: str, kwargs: dict[str, object], max_len: int, args: argparse.Namespace) -> dict[str, object]:
    return {"dataset": dataset, "data": str(args.paths[dataset]), "module": kwargs, "max_len": max_len,
            "max_epochs": args.max_epochs, "patience": args.patience, "trial_minutes": args.trial_minutes,
            "batch_size": args.batch_size, "seed": args.seed, "precision": args.precision, "threads": args.threads,
            "limit_batches": args.limit_batches or 0,
            # Added later: present only when set, so trials stored before the option still match.
            **({"group_by_length": GROUPED} if args.group_by_length else {})}


def run(args: argparse.Namespace, console: Console, log: Console) -> dict[str, float]:
    trials = TrialLog(args.out / "trials.jsonl")
    results: dict[tuple[str, str], dict[str, object]] = {}
    for dataset in args.datasets:
        cache: dict[tuple[int, bool], object] = {}
        for name, assignments in args.variants:
            kwargs = {**args.base, **assignments}
            max_len = int(kwargs.pop(MAX_LEN_KEY, args.max_len))
            prefixes = bool(kwargs.pop(PREFIXES_KEY, False))
            # Stored as a module setting in the key only when on, so earlier trials' keys still match.
            key = trial_key(dataset, {**kwargs, **({PREFIXES_KEY: True} if prefixes else {})}, max_len, args)
            result = trials.get(key)
            if result is None:
                if (max_len, prefixes) not in cache:
                    cache[max_len, prefixes] = load_data(dataset, argparse.Namespace(
                        **{**vars(args), "max_len": max_len, PREFIXES_KEY: prefixes}))
                data = cache[max_len, prefixes]
                log.log(f"{dataset}: {name} {kwargs} max_len {max_len} ...")
                module_kwargs = {k: v for k, v in kwargs.items() if k != EMA_KEY}
                keeper, _ = train_ours(data, module_kwargs, argparse.Namespace(
                    **{**vars(args), "max_len": max_len, EMA_KEY: kwargs.get(EMA_KEY)}))
                result = {"val_ndcg@10": keeper.best, "best_epoch": keeper.best_epoch, "epochs": len(keeper.seconds),
                          "stopped_by": keeper.stopped_by, "val_curve": [round(v, 5) for v in keeper.val],
                          "epoch_s": sorted(keeper.seconds)[len(keeper.seconds) // 2], "train_s": sum(keeper.seconds)}
                trials.add(key, result)
            log.log(f"{dataset}: {name}: val NDCG@10 {result['val_ndcg@10']:.4f} at epoch {result['best_epoch']} "
                    f"of {result['epochs']} ({result['stopped_by']}), {result['epoch_s']:.1f} s/epoch")
            results[dataset, name] = result
    return report(args, console, results)


def report(args: argparse.Namespace, console: Console, results: dict[tuple[str, str], dict]) -> dict[str, float]:
    f: dict[str, float] = {}
    first = args.variants[0][0]
    rows = []
    for name, assignments in args.variants:
        cells = [name, ", ".join(f"{k}={v}" for k, v in assignments.items()) or "(base)"]
        logs = []
        for dataset in args.datasets:
            r = results[dataset, name]
            for field in ("val_ndcg@10", "best_epoch", "epochs", "epoch_s"):
                f[f"{dataset}_{name}_{field}"] = float(r[field])
            cells.append(f"{r['val_ndcg@10']:.4f} ({r['best_epoch']}/{r['epochs']})")
            logs.append(math.log(max(r["val_ndcg@10"], 1e-9) / max(results[dataset, first]["val_ndcg@10"], 1e-9)))
        f[f"{name}_geomean_ratio"] = math.exp(sum(logs) / len(logs))
        cells.append(f"{f[f'{name}_geomean_ratio']:.3f}")
        rows.append(cells)
    base = ", ".join(f"{k}={v}" for k, v in args.base.items()) or "module defaults"
    print_table(console, f"validation NDCG@10 (best epoch / epochs run); base: {base}, max_len {args.max_len}; "
                f"ratio = geometric mean over data sets against '{first}'",
                ["variant", "changes", *args.datasets, "ratio"], rows)
    best = max(args.variants, key=lambda v: f[f"{v[0]}_geomean_ratio"])[0]
    console.print(f"best on all data sets together: {best} ({f[f'{best}_geomean_ratio']:.3f}x '{first}')")
    return f


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--datasets", nargs="+", choices=tuple(DATASETS), default=list(DATASETS))
    p.add_argument("--data-dir", type=Path, default=DATA, help="folder holding ml-1m/, amazon-beauty/, ...")
    p.add_argument("--variants", nargs="+", type=parse_variant, default=[("base", {})],
                   help="NAME:key=value,... (StreamRecModule arguments, max_len, or ema_decay: Lightning's "
                        "EMAWeightAveraging with that decay, validated on the averaged weights); the first is the "
                        "reference")
    p.add_argument("--set", dest="base", type=lambda t: parse_assignments(t, "--set"), default={},
                   help="key=value,... applied to every variant (the base recipe)")
    p.add_argument("--max-epochs", type=int, default=50, help="epoch budget per trial")
    p.add_argument("--patience", type=int, default=5, help="stop after this many epochs without a gain")
    p.add_argument("--trial-minutes", type=float, default=30.0, help="training-time cap per trial")
    p.add_argument("--max-len", type=int, default=50, help="history length unless a variant sets max_len")
    p.add_argument("--precision", choices=tuple(PRECISIONS), default="bf16", help="training precision")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--malloc", choices=("default", "keep"), default="keep",
                   help="keep: glibc keeps freed memory (no per-step page faults on big tensors)")
    p.add_argument("--random-batches", action="store_true",
                   help="ours: random batches (data.group_by_length false), not fit's default length-grouped ones")
    p.add_argument("--group-by-length", action="store_true", help=argparse.SUPPRESS)  # the default; older commands
    p.add_argument("--limit-batches", type=int, help="train on only the first N batches an epoch (smoke runs only)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "recipe", help="folder for trials.jsonl")
    p.add_argument("--json", metavar="PATH", help="write every figure as one flat JSON object name -> number")
    args = p.parse_args(argv)
    args.group_by_length = not args.random_batches
    names = [name for name, _ in args.variants]
    if len(set(names)) != len(names):
        p.error(f"--variants: names must differ, got {names}")
    args.paths = {name: args.data_dir / DATASETS[name].relative_to(DATA) for name in args.datasets}
    for name, path in args.paths.items():
        if not path.is_file():
            p.error(f"{name}: data file {path} not found; pass --data-dir")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.malloc == "keep" and not keep_freed_memory():
        sys.exit("error: --malloc keep needs glibc's mallopt; run without it")
    import logging

    import torch

    torch.set_num_threads(args.threads)
    for message in (".*does not have many workers.*", ".*val_dataloader.*"):
        warnings.filterwarnings("ignore", message)
    for name in ("lightning", "lightning.pytorch", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    console = Console(width=None if sys.stdout.isatty() else 160)
    log = Console(stderr=True, log_path=False, width=None if sys.stderr.isatty() else 160)
    console.print(f"StreamRec recipes on {', '.join(args.datasets)}: up to {args.max_epochs} epochs, patience "
                  f"{args.patience}, {args.trial_minutes:g} min cap, precision {args.precision}, torch "
                  f"{torch.__version__}, threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.2f}; "
                  "validation only (leave-one-out, full ranking, seen items removed)")
    f = run(args, console, log)
    if args.json:
        write_json(args.json, f)
        console.print(f"figures written to {args.json}")
    console.print(json.dumps({"variants": {n: v for n, v in args.variants}, "base": args.base}, default=str))


if __name__ == "__main__":
    main()
