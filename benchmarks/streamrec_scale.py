"""StreamRec scoring at scale: users/s and peak RSS against catalogue size and log size, old path against new.

End to end through `python -m streamrec.score` (its `main`, in a fresh child process per measurement):
a synthetic checkpoint (random weights, N items "i0".."i<N-1>", --d-model wide, 2 blocks) scores the
first --users users of a synthetic log of R rows (R/40 users; `streamrec_ingest.generate`, Parquet, items
popularity-skewed over the first --log-items ids so every catalogue size knows them). The whole log is
read, so its size counts in memory and time; only --users users are ranked, so a point takes seconds to
minutes.
  old   the tree at --baseline-commit (323717e: the full (B, N+1) score matrix, the csv-module reader),
        extracted with `git archive` into a temporary folder and imported from there
  new   today's tree (item chunks, the columnar reader), --item-chunk items at a time; the checkpoint
        memory-mapped, the fp32 item table read from the file chunk by chunk (`streamrec.score.item_table`)
  bf16  (with --bf16) today's tree with `--precision bf16` (exact bf16 scan of a bf16 copy held in memory,
        fp32 rows read from the file only for the re-scored items)
users/s = users scored / seconds inside `_score_all` (ranking and writing; both trees have it), total_s
the whole run (checkpoint load and log read included). Peak RSS is the child's whole-process high-water
mark (`os.wait4`, imports and the item table included; `table_mib` is the fp32 table alone); file pages
the new path reads with `pread` sit in the kernel's page cache, shared and reclaimable, not in the RSS. A point that
runs past --budget seconds is killed and recorded as `..._timed_out`; the old path is not run above
--skip-old-above items (its score matrix alone is batch-size x N x 4 bytes). Where both ran, the share of
users with the same top-K lists is checked (`..._same_topk_share`, ties aside 1.0).

    python benchmarks/streamrec_scale.py --items 100000,1000000 --rows 200000 --users 1000   # about 2 minutes
    python benchmarks/streamrec_scale.py --json runs/scale.json --plot runs/scale.png         # the full grid

--train-items measures training instead: for each N and each item optimizer, a child
builds the model with `loss: sampled` (256 shared negatives) and runs --train-steps steps on random
(128, 50) batches with the optimizer `StreamRecModule.make_optimizer` builds:
  adamw            (old, the default) AdamW on everything: a dense item gradient and two N x D states
  rowwise_adagrad  (new) sparse item gradients (the rows a step reads) and row-wise AdaGrad, one
                   accumulator per row; AdamW on the rest
Figures per optimizer: peak RSS above the built model (`train_N{n}_{opt}_peak_above_model_mib`), seconds
per step after the first (`..._s_per_step`; the first allocates the optimizer's states) and, between the
smallest and largest N, how many item tables (N x D fp32) each extra table's worth of items adds to the
peak (`train_{opt}_tables_per_table`; the model holds one more). --train-bf16 runs the steps under bf16
autocast, where the old path also casts the whole table every step.

Targets at 5M items: new peak RSS <= 1.5 GB and >= 3x the old users/s. JSON keys:
N{items}_R{rows}_{old,new,bf16}_{users_per_s,peak_rss_mib,total_s,score_s}; new against old:
N{items}_R{rows}_{speedup,rss_ratio,same_topk_share}, bf16 the same as N{items}_R{rows}_bf16_{...}.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from _common import ROOT, print_table, write_json
from rich.console import Console
from streamrec_ingest import BASELINE_COMMIT, generate, run_child, run_in_process

PATHS = ("old", "new", "bf16")


def old_tree(commit: str, folder: Path, packages: tuple[str, ...] = ("core", "streamrec"),
             option: str = "--baseline-commit") -> Path:
    """`packages` at `commit`, extracted into `folder` (the old scorer imports only core/, streamrec/ and libraries).

    `option` is the command-line option that names the commit, for the error when git cannot read it.
    """
    archive = folder / "old.tar"
    res = subprocess.run(["git", "archive", "-o", str(archive), commit, *packages], cwd=ROOT,
                         capture_output=True, text=True)
    if res.returncode:
        names = ", ".join(f"{p}/" for p in packages)
        sys.exit(f"error: cannot read {names} at {commit} ({res.stderr.strip()}); "
                 f"run from a git checkout that has that commit, or pass another {option}")
    tree = folder / "old_tree"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    archive.unlink()
    return tree


def make_checkpoint(path: Path, n_items: int, d_model: int, max_len: int, seed: int) -> None:
    """A checkpoint as `python -m streamrec fit` writes it (hyper-parameters, weights, vocabulary), untrained.

    The weights are those of `StreamRecModule(**hp)` seeded alike (its state is its `model`'s, under `model.`),
    built without the LightningModule, so that making the checkpoint does not import Lightning.
    """
    import torch

    from streamrec.data.vocab import VOCAB_KEY
    from streamrec.model.network import StreamRecModel

    torch.manual_seed(seed)
    hp = {"num_items": n_items, "max_len": max_len, "d_model": d_model, "n_heads": 2, "n_layers": 2,
          "d_ff": 4 * d_model}
    module = torch.nn.Module()
    module.model = StreamRecModel(n_items, **{k: v for k, v in hp.items() if k != "num_items"})
    torch.save({"hyper_parameters": hp, "state_dict": module.state_dict(),
                VOCAB_KEY: {"items": [f"i{k}" for k in range(n_items)]}}, path)


def run_point(cmd: list[str], what: str, args: argparse.Namespace) -> dict | None:
    """`run_child` on this script's child command line, or with --in-process the same command run in this process."""
    if args.in_process:
        return run_in_process(main, cmd)
    return run_child(cmd, what, args.budget)


def prepare(cmd: list[str], args: argparse.Namespace) -> None:
    """A child that writes a log or a checkpoint (its memory stays out of the measured children's), or with
    --in-process the same command run in this process."""
    if args.in_process:
        main([str(arg) for arg in cmd[2:]])
    else:
        subprocess.run(cmd, cwd=ROOT, check=True)


def child_score(args: argparse.Namespace) -> None:
    """One scoring run of the old or new tree; prints its figures as JSON on the last line of stdout."""
    sys.path.insert(0, str(args.tree))
    import logging

    import streamrec.score as score

    assert Path(score.__file__).is_relative_to(args.tree), score.__file__  # the tree asked for, not another
    timed = {}
    inner = score._score_all

    def score_all(*a, **kw):
        start = time.perf_counter()
        inner(*a, **kw)
        timed["score_s"] = time.perf_counter() - start

    score._score_all = score_all
    if args.threads:  # before main: the old tree has no --threads option
        import torch

        torch.set_num_threads(args.threads)
    argv = ["--ckpt", args.ckpt, "--input", args.log, "--output", args.output, "--users", args.users_file,
            "--top-k", str(args.top_k), "--batch-size", str(args.batch_size), "--device", "cpu"]
    if args.child != "old":
        argv += ["--item-chunk", str(args.item_chunk), "--precision", "bf16" if args.child == "bf16" else "fp32"]
    start = time.perf_counter()
    score.main(argv)
    total = time.perf_counter() - start
    logging.shutdown()
    print(json.dumps({"total_s": total, "score_s": timed["score_s"]}))


def child_train(args: argparse.Namespace) -> None:
    """Peak RSS and seconds per step of sampled-softmax training above the built model; prints JSON."""
    sys.path.insert(0, str(ROOT))
    import contextlib

    import torch
    from _common import peak_rss_bytes, reset_peak_rss, rss_bytes

    from streamrec.model.module import StreamRecModule

    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    n = int(args.items)
    module = StreamRecModule(num_items=n, max_len=50, d_model=args.d_model, n_heads=2, n_layers=2,
                             d_ff=4 * args.d_model, loss="sampled", num_negatives=256, popularity_baseline=False,
                             item_optimizer=args.item_optimizer)
    opt = module.make_optimizer()
    inputs, targets = torch.randint(1, n + 1, (128, 50)), torch.randint(1, n + 1, (128, 50))  # (B, T)
    autocast = torch.autocast("cpu", torch.bfloat16) if args.train_bf16 else contextlib.nullcontext()
    base = rss_bytes()
    reset_peak_rss()
    times = []
    for _ in range(args.train_steps):  # the first step allocates the optimizer's states; later ones are steady
        start = time.perf_counter()
        with autocast:
            hidden = module.model.encode(inputs)  # (B, T, D)
            loss = module.compute_loss(hidden.reshape(-1, args.d_model), targets.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - start)
    table = module.model.item_vectors.numel() * 4
    steady = times[1:] or times
    print(json.dumps({"peak_above_model_mib": max(0, peak_rss_bytes() - base) / 2**20, "table_mib": table / 2**20,
                      "s_per_step": sum(steady) / len(steady), "first_step_s": times[0]}))


TRAIN_OPTIMIZERS = ("adamw", "rowwise_adagrad")  # old (the default), new


def run_train(args: argparse.Namespace) -> tuple[dict[str, float], list[list[str]]]:
    figures: dict[str, float] = {"d_model": args.d_model, "train_steps": args.train_steps,
                                 "train_bf16": int(args.train_bf16), "threads": args.threads}
    table = []
    for n in ints(args.train_items):
        for name in args.train_optimizers.split(","):
            cmd = [sys.executable, __file__, "--child-train", "--items", str(n), "--d-model", str(args.d_model),
                   "--seed", str(args.seed), "--item-optimizer", name, "--train-steps", str(args.train_steps),
                   "--threads", str(args.threads), *(["--train-bf16"] if args.train_bf16 else [])]
            f = run_point(cmd, f"{name} training run at {n:,} items", args)
            tag = f"train_N{n}_{name}"
            if f is None:
                figures[f"{tag}_timed_out"] = 1
                table.append([f"{n:,} items", name, "timed out", "", "", "", ""])
                continue
            for key in ("peak_above_model_mib", "s_per_step", "first_step_s", "peak_mib"):
                figures[f"{tag}_{key.replace('peak_mib', 'peak_rss_mib')}"] = f[key]
            figures[f"train_N{n}_table_mib"] = f["table_mib"]
            old = figures.get(f"train_N{n}_adamw_s_per_step")
            if name != "adamw" and old:
                figures[f"{tag}_step_speedup"] = old / f["s_per_step"]
            tables = f["peak_above_model_mib"] / f["table_mib"]
            table.append([f"{n:,} items", name, f"{f['table_mib']:.0f}", f"{f['peak_above_model_mib']:.0f}",
                          f"{tables:.2f}", f"{f['peak_mib']:.0f}", f"{f['s_per_step']:.3f}"])
    for name in TRAIN_OPTIMIZERS:
        done = [n for n in ints(args.train_items) if f"train_N{n}_{name}_peak_above_model_mib" in figures]
        if len(done) >= 2 and min(done) != max(done):
            lo, hi = min(done), max(done)
            extra = (figures[f"train_N{hi}_{name}_peak_above_model_mib"]
                     - figures[f"train_N{lo}_{name}_peak_above_model_mib"])
            figures[f"train_{name}_tables_per_table"] = extra / (figures[f"train_N{hi}_table_mib"]
                                                                 - figures[f"train_N{lo}_table_mib"])
    return figures, table


def same_topk_share(a: Path, b: Path) -> float:
    """Share of users whose ranked item lists are identical in two outputs."""
    import pyarrow.parquet as pq

    def lists(path: Path) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for row in sorted(pq.read_table(path, columns=["user_id", "rank", "item_id"]).to_pylist(),
                          key=lambda r: (r["user_id"], r["rank"])):
            out.setdefault(row["user_id"], []).append(row["item_id"])
        return out

    la, lb = lists(a), lists(b)
    return sum(la[u] == lb.get(u) for u in la) / max(len(la), 1)


def scored_users(path: Path) -> int:
    import pyarrow.parquet as pq

    return len(set(pq.read_table(path, columns=["user_id"]).column("user_id").to_pylist()))


def measure_point(kind: str, tree: Path, ckpt: Path, log: Path, users_file: Path, out: Path,
                  args: argparse.Namespace) -> dict | None:
    cmd = [sys.executable, __file__, "--child", kind, "--tree", str(tree), "--ckpt", str(ckpt), "--log", str(log),
           "--users-file", str(users_file), "--output", str(out), "--top-k", str(args.top_k), "--batch-size",
           str(args.batch_size), "--item-chunk", str(args.item_chunk), "--threads", str(args.threads)]
    what = f"{kind} scoring of {ckpt.name} on {log.name}"
    # The old tree is imported from its own folder: a child of its own even with --in-process.
    figures = run_child(cmd, what, args.budget) if kind == "old" else run_point(cmd, what, args)
    if figures is not None:
        figures["users"] = scored_users(out)
        figures["users_per_s"] = figures["users"] / figures["score_s"]
    return figures


def table_row(figures: dict[str, float], got: dict[str, dict], tag: str, kind: str, label: str) -> list[str]:
    if kind not in got:
        return [label, "timed out" if f"{tag}_{kind}_timed_out" in figures else "skipped", "", "", "", "", ""]
    pre, f = tag if kind == "new" else f"{tag}_{kind}", got[kind]
    ratio = [f"{figures[k]:.2f}x" if k in figures else "" for k in (f"{pre}_speedup", f"{pre}_rss_ratio")]
    same = f"{figures[f'{pre}_same_topk_share']:.4f}" if kind != "old" and f"{pre}_same_topk_share" in figures else ""
    return [label, f"{f['users_per_s']:.0f}", f"{f['peak_mib']:.0f}", f"{f['total_s']:.1f}", *ratio, same]


def plot(path: str, figures: dict[str, float], sizes: list[int], rows: list[int]) -> None:
    """Two panels against catalogue size (log x): users/s and peak RSS, a line per path and log size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for r in rows:
        for kind, style in (("old", "--"), ("new", "-"), ("bf16", ":")):
            xs = [n for n in sizes if f"N{n}_R{r}_{kind}_users_per_s" in figures]
            if not xs:
                continue
            label = f"{kind}, {r:,} rows"
            left.plot(xs, [figures[f"N{n}_R{r}_{kind}_users_per_s"] for n in xs], style, marker="o", label=label)
            right.plot(xs, [figures[f"N{n}_R{r}_{kind}_peak_rss_mib"] for n in xs], style, marker="o", label=label)
    right.axhline(1.5e9 / 2**20, color="grey", lw=0.8, ls=":", label="target 1.5 GB")
    for ax, title in ((left, "users/s (scoring)"), (right, "peak RSS, MiB (whole process)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("catalogue size (items)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"python -m streamrec.score, old ({figures.get('baseline', '')}) vs new")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def ints(text: str) -> list[int]:
    return [int(s.replace("_", "")) for s in text.split(",")]


def run(args: argparse.Namespace) -> tuple[dict[str, float], list[list[str]]]:
    sizes, row_counts = ints(args.items), ints(args.rows)
    figures: dict[str, float] = {"users": args.users, "batch_size": args.batch_size, "d_model": args.d_model,
                                 "top_k": args.top_k, "item_chunk": args.item_chunk, "log_items": args.log_items,
                                 "skip_old_above": args.skip_old_above, "budget_s": args.budget,
                                 "threads": args.threads}
    table = []
    paths = [k for k in PATHS if k != "bf16" or args.bf16]
    with tempfile.TemporaryDirectory(prefix="streamrec_scale_", dir=args.tmp) as tmp:
        folder = Path(tmp)
        tree = old_tree(args.baseline_commit, folder)
        logs = {}
        for r in row_counts:  # in children (but with --in-process): a big parent would raise every child's ru_maxrss
            logs[r] = folder / f"log_{r}"
            logs[r].mkdir()
            prepare([sys.executable, __file__, "--generate", str(logs[r]), "--rows", str(r), "--log-items",
                     str(args.log_items), "--seed", str(args.seed)], args)
        users_file = folder / "users.txt"
        users_file.write_text("".join(f"u{i}\n" for i in range(args.users)))
        for n in sizes:
            ckpt = folder / f"items_{n}.ckpt"
            prepare([sys.executable, __file__, "--make-checkpoint", str(ckpt), "--items", str(n),
                     "--d-model", str(args.d_model), "--seed", str(args.seed)], args)
            for r in row_counts:
                tag = f"N{n}_R{r}"
                got = {}
                for kind in paths:
                    if kind == "old" and n > args.skip_old_above:
                        continue
                    out = folder / f"{tag}_{kind}.parquet"
                    f = measure_point(kind, tree if kind == "old" else ROOT, ckpt, logs[r] / "log.parquet",
                                      users_file, out, args)
                    if f is None:
                        figures[f"{tag}_{kind}_timed_out"] = 1
                        continue
                    got[kind] = f
                    for key in ("users_per_s", "peak_mib", "total_s", "score_s"):
                        figures[f"{tag}_{kind}_{key.replace('peak_mib', 'peak_rss_mib')}"] = f[key]
                for kind in got.keys() - {"old"}:
                    pre = tag if kind == "new" else f"{tag}_{kind}"
                    if "old" in got:
                        figures[f"{pre}_speedup"] = got[kind]["users_per_s"] / got["old"]["users_per_s"]
                        figures[f"{pre}_rss_ratio"] = got["old"]["peak_mib"] / got[kind]["peak_mib"]
                    ref = "old" if "old" in got else "new"  # bf16 against the exact ranking the run has
                    if kind != ref:
                        figures[f"{pre}_same_topk_share"] = same_topk_share(folder / f"{tag}_{ref}.parquet",
                                                                            folder / f"{tag}_{kind}.parquet")
                for kind in paths:
                    table.append(table_row(figures, got, tag, kind, f"{n:,} items, {r:,} rows, {kind}"))
            figures[f"N{n}_table_mib"] = (n + 1) * args.d_model * 4 / 2**20
            ckpt.unlink()
    return figures, table


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--items", default="100000,1000000,5000000,10000000", help="catalogue sizes, comma-separated")
    p.add_argument("--rows", default="2000000,20000000", help="log sizes (events), comma-separated")
    p.add_argument("--users", type=int, default=5000, help="users scored per point (default 5,000)")
    p.add_argument("--batch-size", type=int, default=256, help="users per forward pass (the scorer's default)")
    p.add_argument("--item-chunk", type=int, default=65_536, help="new path: items ranked at once")
    p.add_argument("--top-k", type=int, default=10)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--bf16", action="store_true", help="also time today's scorer with --precision bf16")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads of every scoring child, old and new (default 0: torch's default, the cores); "
                        "1 where other jobs keep the cores busy")
    p.add_argument("--log-items", type=int, default=100_000, help="distinct items the log draws from")
    p.add_argument("--skip-old-above", type=int, default=5_000_000, help="no old run above this many items")
    p.add_argument("--budget", type=float, default=900, help="seconds per measurement before it is killed")
    p.add_argument("--baseline-commit", default=BASELINE_COMMIT, help="commit whose tree is 'old'")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tmp", help="folder for the logs and checkpoints (default: the system's; 10M items ~2.6 GB)")
    p.add_argument("--json", metavar="PATH", help="write the figures as one flat JSON object")
    p.add_argument("--plot", metavar="PATH", help="write a PNG: users/s and peak RSS against catalogue size")
    p.add_argument("--train-items", metavar="SIZES",
                   help="measure sampled-softmax training memory at these catalogue sizes instead of scoring")
    p.add_argument("--train-steps", type=int, default=4,
                   help="--train-items: steps per run; s/step averages all but the first (default 4)")
    p.add_argument("--train-bf16", action="store_true", help="--train-items: run the steps under bf16 autocast")
    p.add_argument("--train-optimizers", default=",".join(TRAIN_OPTIMIZERS),
                   help="--train-items: item optimizers to run, comma-separated (default both: adamw,rowwise_adagrad)")
    p.add_argument("--in-process", action="store_true",
                   help="run today's tree in this process, one step after another, instead of a fresh child "
                        "process each: the logs, the checkpoints, the new and bf16 points and every --train-items "
                        "run (the old tree's points still run in children of their own). Quick, for checking that "
                        "the script runs and the trees agree; peak RSS is then this process's since a point began "
                        "(imports and earlier points included) and --budget stops children only, so do not compare "
                        "the memory figures")
    p.add_argument("--item-optimizer", choices=TRAIN_OPTIMIZERS, help=argparse.SUPPRESS)
    p.add_argument("--child", choices=PATHS, help=argparse.SUPPRESS)
    p.add_argument("--child-train", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--tree", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--ckpt", help=argparse.SUPPRESS)
    p.add_argument("--log", help=argparse.SUPPRESS)
    p.add_argument("--users-file", help=argparse.SUPPRESS)
    p.add_argument("--output", help=argparse.SUPPRESS)
    p.add_argument("--generate", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--make-checkpoint", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child_score(args)
    if args.child_train:
        return child_train(args)
    if args.train_items:
        if args.train_steps < 1:
            p.error(f"--train-steps must be >= 1, got {args.train_steps}")
        if not set(args.train_optimizers.split(",")) <= set(TRAIN_OPTIMIZERS):
            p.error(f"--train-optimizers takes {', '.join(TRAIN_OPTIMIZERS)}, got {args.train_optimizers!r}")
        figures, table = run_train(args)
        print_table(Console(width=150), f"sampled-softmax training (256 negatives, batch 128 x 50, "
                    f"{'bf16 autocast' if args.train_bf16 else 'fp32'}), d_model {args.d_model}",
                    ["catalogue", "item optimizer", "item table MiB", "peak above model MiB",
                     "peak above model / table", "peak RSS MiB", "s/step"], table)
        for name in TRAIN_OPTIMIZERS:
            if f"train_{name}_tables_per_table" in figures:
                print(f"{name}: each item table's worth of items adds {figures[f'train_{name}_tables_per_table']:.2f} "
                      "item tables of peak memory above the model (the model holds one more)")
        if args.json:
            write_json(args.json, figures)
        return None
    if args.generate:
        rows = int(args.rows)
        return generate(args.generate, rows, max(1, rows // 40), args.log_items, args.seed, formats=("parquet",))
    if args.make_checkpoint:
        sys.path.insert(0, str(ROOT))
        return make_checkpoint(args.make_checkpoint, int(args.items), args.d_model, 50, args.seed)
    try:
        sizes, row_counts = ints(args.items), ints(args.rows)
    except ValueError:
        p.error("--items and --rows take comma-separated integers, e.g. 100000,1000000")
    if min(sizes) < args.log_items:
        p.error(f"--items: every catalogue must hold the log's --log-items ({args.log_items:,}) items")
    if min(row_counts) < 40 * args.users:
        p.error(f"--rows: every log needs at least 40 x --users ({40 * args.users:,}) rows to hold those users")
    if min(args.users, args.batch_size, args.item_chunk, args.top_k, args.log_items, args.budget) <= 0:
        p.error("--users, --batch-size, --item-chunk, --top-k, --log-items and --budget must be positive")
    figures, table = run(args)
    print_table(Console(width=150), f"python -m streamrec.score, {args.users:,} users per point, top-{args.top_k}, "
                f"batch {args.batch_size}, d_model {args.d_model}, item chunk {args.item_chunk:,} (old = "
                f"{args.baseline_commit[:7]})",
                ["catalogue, log, path", "users/s", "peak RSS MiB", "total s", "speed vs old", "RSS old/this",
                 "same top-K"], table)
    for r in row_counts:
        tag = f"N5000000_R{r}"
        if f"{tag}_new_peak_rss_mib" in figures:
            rss = figures[f"{tag}_new_peak_rss_mib"] * 2**20 / 1e9
            speed = figures.get(f"{tag}_speedup")
            bf16 = figures.get(f"{tag}_bf16_speedup")
            print(f"target at 5M items, {r:,} rows: peak RSS {rss:.2f} GB (<= 1.5), speed vs old "
                  + (f"{speed:.2f}x (>= 3)" if speed else "n/a (old not run)")
                  + (f", bf16 {bf16:.2f}x" if bf16 else ""))
    if args.json:
        write_json(args.json, figures)
    if args.plot:
        figures_for_plot = dict(figures, baseline=args.baseline_commit[:7])
        plot(args.plot, figures_for_plot, sizes, row_counts)


if __name__ == "__main__":
    main()
