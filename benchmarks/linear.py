"""fp32 linear layers on CPU: `core.linear` (oneDNN's GEMM) against `F.linear` (MKL's), forward and training.

The shapes are the Translate decoder's per-step layers (160 rows = beam 5 x 32 sentences, 32 at the first step, at the
speed benchmark's d_model 256 / FFN 1024 / vocabulary 8,000) and a Multi30k training batch's
(3,500 tokens, d_model 128, FFN 256, vocabulary 10,000). "train" = forward + backward for the input
and the weight. The forward is also timed as inference ("packed": no gradient, so `core.linear`
reuses the weight in oneDNN's blocked layout, packed for `--pack-rows` rows). Interleaved rounds;
time = median; ratio = median of per-round ratios F.linear / core.linear (> 1: core is faster);
GFLOP/s from the median times. On a CPU where `core.linear` keeps `F.linear` (no AVX-512) the
columns time the same thing and the script says so.

    python benchmarks/linear.py --threads 1 --json runs/bench/linear_t1.json

JSON keys: {fwd,train}_{name}_{mkl,onednn}_gflops, {fwd,train}_{name}_speedup, fwd_{name}_packed_gflops,
fwd_{name}_packed_speedup, threads, onednn, pack_rows.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from _common import interleave, median_ratio, print_table, write_json
from rich.console import Console

import core.linear
from core.linear import linear, onednn_available

# name -> (rows, in features, out features)
SHAPES = {
    "decode_qkv": (160, 256, 768),
    "decode_ffn_up": (160, 256, 1024),
    "decode_ffn_down": (160, 1024, 256),
    "decode_vocab": (160, 256, 8000),
    "first_step_vocab": (32, 256, 8000),  # a search's first step: one row per sentence
    "train_qkv": (3500, 128, 384),
    "train_ffn_up": (3500, 128, 256),
    "train_ffn_down": (3500, 256, 128),
}


def case(rows: int, k: int, n: int, train: bool) -> dict[str, Callable[[], None]]:
    x = torch.randn(rows, k, requires_grad=train)
    w = torch.randn(n, k, requires_grad=train)
    b = torch.randn(n, requires_grad=train)
    grad = torch.randn(rows, n)

    def run(fn: Callable[..., torch.Tensor], *params: torch.Tensor) -> Callable[[], None]:
        def step() -> None:
            with torch.set_grad_enabled(train):
                out = fn(x, *params)
                if train:
                    torch.autograd.grad(out, (x, w, b), grad)
        return step

    fns = {"mkl": run(F.linear, w, b), "onednn": run(linear, w, b)}
    if not train:  # weights that need no gradient: the packed path
        fns["packed"] = run(linear, w.detach().clone(), b.detach().clone())
    return fns


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--repeats", type=int, default=15, help="interleaved rounds (default 15)")
    ap.add_argument("--number", type=int, default=20, help="calls per timing (default 20)")
    ap.add_argument("--pack-rows", type=int, default=core.linear.PACK_ROWS,
                    help=f"rows oneDNN packs the weight for (default core.linear.PACK_ROWS = {core.linear.PACK_ROWS})")
    ap.add_argument("--json", metavar="PATH", help="write the figures as one flat JSON object")
    args = ap.parse_args(argv)
    core.linear.PACK_ROWS = args.pack_rows
    torch.set_num_threads(args.threads)
    console = Console(width=None if sys.stdout.isatty() else 120)
    if not onednn_available():
        console.print("[yellow]core.linear uses F.linear on this CPU (no AVX-512): both columns time MKL[/]")
    figures: dict[str, float] = {"threads": args.threads, "onednn": int(onednn_available()),
                                 "pack_rows": args.pack_rows}
    for train in (False, True):
        mode = "train" if train else "fwd"
        table = []
        for name, (rows, k, n) in SHAPES.items():
            fns = case(rows, k, n, train)
            for fn in fns.values():  # warm-up
                fn()
            times = interleave(fns, args.repeats, number=args.number)
            flop = 2 * rows * k * n * (3 if train else 1)
            gflops = {sys_: flop / statistics.median(t) / 1e9 for sys_, t in times.items()}
            ratio = median_ratio(times["mkl"], times["onednn"])
            key = f"{mode}_{name}"
            figures |= {f"{key}_mkl_gflops": gflops["mkl"], f"{key}_onednn_gflops": gflops["onednn"],
                        f"{key}_speedup": ratio}
            row = [name, f"{rows}x{k}x{n}", f"{gflops['mkl']:.0f}", f"{gflops['onednn']:.0f}", f"{ratio:.2f}x"]
            if not train:
                packed = median_ratio(times["mkl"], times["packed"])
                figures |= {f"{key}_packed_gflops": gflops["packed"], f"{key}_packed_speedup": packed}
                row += [f"{gflops['packed']:.0f}", f"{packed:.2f}x"]
            table.append(row)
        columns = ["layer", "rows x in x out", "F.linear GFLOP/s", "core.linear GFLOP/s", "speed-up"]
        if not train:
            columns += ["packed GFLOP/s", "packed speed-up"]
        print_table(console, f"fp32 linear {'forward + backward' if train else 'forward'}, {args.threads} thread(s)",
                    columns, table)
    if args.json:
        write_json(args.json, figures)
        console.print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
