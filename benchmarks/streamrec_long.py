"""StreamRec on long histories: a training step and scoring against the history length, for each attention.

`benchmarks/long_attention.py` times the attention alone; this times what a user runs. For each length T in
--lengths and each `model.attention` (full, window with --window, linear): a `StreamRecModule` of ML-1M's size
(3,416 items, d_model 64, 2 blocks, d_ff 256, 1 head, full-softmax loss) on B random histories of T items with
no padding (every position is a target, as for ML-1M's longest users):
  train  `training_step` (encoder and the full-catalogue loss), backward, one AdamW step
  score  `model.recommend_scores` on the same B histories (the last position against every item)
Time: the median of --repeats rounds, the three attentions interleaved, after a warm-up. Memory: peak RSS above
the model and inputs, each (attention, T, phase) in a fresh process from a forkserver (`long_attention.py`'s way).

Growth between the shortest and the longest length, per attention and phase: (time at T_max / time at T_min) /
(T_max / T_min), the same for memory. 1.0 is linear in T; T_max / T_min is quadratic. Targets: window and linear
training-step growth at most 1.5 in time and in memory (`train_window_time_growth` <= 1.5, ...), so histories of
thousands of items cost in proportion to their length.

    python benchmarks/streamrec_long.py --threads 1 --json runs/streamrec_long.json   # T 512 1024 2048 4096, B 8
    python benchmarks/streamrec_long.py --quick                                        # smoke test

JSON keys: T{T}_{phase}_{attention}_ms and _mem_mib; {phase}_{attention}_time_growth and _mem_growth; batch,
window, repeats.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import warnings
from functools import partial

import torch
from _common import (
    in_fresh_process,
    interleave,
    peak_rss_bytes,
    print_table,
    print_targets,
    reset_peak_rss,
    rss_bytes,
    write_json,
)
from rich.console import Console

from streamrec.data.datasets import TrainBatch
from streamrec.model.module import StreamRecModule

ATTENTIONS = ("full", "window", "linear")
PHASES = ("train", "score")
NUM_ITEMS = 3416  # ML-1M's catalogue
TARGETS = {f"train_{a}_{m}_growth": 1.5 for a in ("window", "linear") for m in ("time", "mem")}


def build(args: argparse.Namespace, attention: str, t: int) -> tuple[StreamRecModule, torch.optim.Optimizer,
                                                                    TrainBatch]:
    torch.manual_seed(0)
    module = StreamRecModule(num_items=NUM_ITEMS, max_len=t, n_heads=1, attention=attention,
                             attention_window=args.window, popularity_baseline=False)
    items = torch.randint(1, NUM_ITEMS + 1, (args.batch, t + 1))
    return module, module.make_optimizer(), TrainBatch(items[:, :-1], items[:, 1:])


def run_phase(phase: str, module: StreamRecModule, opt: torch.optim.Optimizer, batch: TrainBatch) -> None:
    if phase == "score":
        module.eval()
        module.model.recommend_scores(batch.inputs)
        return
    module.train()
    opt.zero_grad(set_to_none=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # `self.log` without a Trainer: nothing to log to here
        loss = module.training_step(batch, 0)
    loss.backward()
    opt.step()


def peak_bytes(args: argparse.Namespace, phase: str, attention: str, t: int) -> int:
    parts = build(args, attention, t)
    base = rss_bytes()
    reset_peak_rss()
    run_phase(phase, *parts)
    return max(0, peak_rss_bytes() - base)


def peak_in_child(args: argparse.Namespace, phase: str, attention: str, t: int) -> int | None:
    """`peak_bytes` in a fresh process (`_common.in_fresh_process`) with --threads; None if it died."""
    return in_fresh_process(peak_bytes, (args, phase, attention, t),
                            ["torch", "rich.console", "_common", "streamrec.model.module", "streamrec.data.datasets"],
                            args.threads)


def measure(args: argparse.Namespace, t: int, log: Console) -> dict[str, float]:
    f: dict[str, float] = {}
    for phase in PHASES:
        for a in ATTENTIONS:
            peak = peak_in_child(args, phase, a, t)
            if peak is not None:
                f[f"T{t}_{phase}_{a}_mem_mib"] = peak / 2**20
        built = {a: build(args, a, t) for a in ATTENTIONS}
        fns = {a: partial(run_phase, phase, *built[a]) for a in ATTENTIONS}
        for fn in fns.values():
            fn()  # warm-up
        times = interleave(fns, args.repeats)
        for a in ATTENTIONS:
            f[f"T{t}_{phase}_{a}_ms"] = statistics.median(times[a]) * 1e3
        log.log(f"T {t} {phase}: " + ", ".join(f"{a} {f[f'T{t}_{phase}_{a}_ms']:.0f} ms" for a in ATTENTIONS))
    return f


def growth(figures: dict[str, float], lengths: list[int]) -> dict[str, float]:
    lo, hi = min(lengths), max(lengths)
    out: dict[str, float] = {}
    for phase in PHASES:
        for a in ATTENTIONS:
            for kind, suffix in (("time", "ms"), ("mem", "mem_mib")):
                first, last = figures.get(f"T{lo}_{phase}_{a}_{suffix}"), figures.get(f"T{hi}_{phase}_{a}_{suffix}")
                if first and last:
                    out[f"{phase}_{a}_{kind}_growth"] = (last / first) / (hi / lo)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", nargs="+", type=int, default=[512, 1024, 2048, 4096], help="history lengths T")
    p.add_argument("--window", type=int, default=256, help="`attention_window` of the window attention")
    p.add_argument("--batch", type=int, default=8, help="histories per step B")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds")
    p.add_argument("--threads", type=int, help="torch CPU threads (default torch's choice)")
    p.add_argument("--quick", action="store_true", help="smoke test: T 64 and 128, W 16, B 2, 1 repeat")
    p.add_argument("--json", metavar="PATH", help="write every figure as one flat JSON object name -> number")
    args = p.parse_args(argv)
    if args.quick:
        args.lengths, args.window, args.batch, args.repeats = [64, 128], 16, 2, 1
    for name in ("window", "batch", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if len(set(args.lengths)) < 2 or min(args.lengths) < 2:
        p.error(f"--lengths needs two or more different lengths >= 2, got {args.lengths}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    console = Console(width=None if sys.stdout.isatty() else 132)
    log = Console(stderr=True, log_path=False, width=None if sys.stderr.isatty() else 132)
    console.print(f"[bold]StreamRec on long histories[/]: training step and scoring, B={args.batch}, "
                  f"{NUM_ITEMS} items, window W={args.window}, fp32 | torch {torch.__version__} | threads "
                  f"{torch.get_num_threads()} | load average {os.getloadavg()[0]:.2f}")
    figures: dict[str, float] = {"batch": args.batch, "window": args.window, "repeats": args.repeats}
    for t in sorted(args.lengths):
        figures.update(measure(args, t, log))
    figures.update(growth(figures, args.lengths))
    rows = []
    for t in sorted(args.lengths):
        for phase in PHASES:
            row = [str(t), phase]
            for a in ATTENTIONS:
                mem = figures.get(f"T{t}_{phase}_{a}_mem_mib")
                row += [f"{figures[f'T{t}_{phase}_{a}_ms']:.0f}", "failed" if mem is None else f"{mem:.0f}"]
            rows.append(row)
    print_table(console, "ms and MiB above the model and inputs",
                ["T", "phase", *(f"{a} {u}" for a in ATTENTIONS for u in ("ms", "MiB"))], rows)
    lo, hi = min(args.lengths), max(args.lengths)
    print_table(console, f"growth from T={lo} to T={hi}, per unit of length (1.0 linear, {hi / lo:g} quadratic)",
                ["phase", *(f"{a} {k}" for a in ATTENTIONS for k in ("time", "mem"))],
                [[phase, *(f"{figures.get(f'{phase}_{a}_{k}_growth', float('nan')):.2f}" for a in ATTENTIONS
                           for k in ("time", "mem"))] for phase in PHASES])
    print_targets(console, TARGETS, figures, ceilings=True)
    if args.json:
        write_json(args.json, figures)
        console.print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
