"""fp32 linear layers on CPU: `core.nn.cpu_fastpath.linear` (oneDNN's GEMM) against `F.linear` (MKL's).

Shapes: the Translate decoder's per-step layers (160 rows = beam 5 x 32 sentences, 32 at the first step; d_model
256, FFN 1024, vocabulary 8,000) and a Multi30k training batch's (3,500 tokens; 128, 256, 10,000). "fwd" =
inference; "train" = forward + backward for input and weight. Interleaved rounds; ratio = median of per-round
ratios F.linear / fast path (> 1: the fast path is faster). Without oneDNN's linear op both columns time F.linear.

    python benchmarks/linear.py --threads 1 --json runs/bench/linear_t1.json

JSON keys: {fwd,train}_{name}_{mkl,onednn}_gflops, {fwd,train}_{name}_speedup, threads, onednn.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch
import torch.nn.functional as F
from _common import console, grad_step, interleave, median_ratio, print_table, write_json

from core.nn.cpu_fastpath import linear, onednn_available

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
    return {name: grad_step(lambda fn=fn: fn(x, w, b), train, lambda out: torch.autograd.grad(out, (x, w, b), grad))
            for name, fn in (("mkl", F.linear), ("onednn", linear))}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--repeats", type=int, default=15, help="interleaved rounds (default 15)")
    ap.add_argument("--number", type=int, default=20, help="calls per timing (default 20)")
    ap.add_argument("--json", metavar="PATH", help="write the figures as one flat JSON object")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = console(width=120)
    if not onednn_available():
        out.print("[yellow]this torch has no oneDNN linear op: both columns time F.linear[/]")
    figures: dict[str, float] = {"threads": args.threads, "onednn": int(onednn_available())}
    for train in (False, True):
        mode = "train" if train else "fwd"
        table = []
        for name, (rows, k, n) in SHAPES.items():
            times = interleave(case(rows, k, n, train), args.repeats, number=args.number, warmup=True)
            flop = 2 * rows * k * n * (3 if train else 1)
            gflops = {sys_: flop / statistics.median(t) / 1e9 for sys_, t in times.items()}
            ratio = median_ratio(times["mkl"], times["onednn"])
            key = f"{mode}_{name}"
            figures |= {f"{key}_mkl_gflops": gflops["mkl"], f"{key}_onednn_gflops": gflops["onednn"],
                        f"{key}_speedup": ratio}
            table.append([name, f"{rows}x{k}x{n}", f"{gflops['mkl']:.0f}", f"{gflops['onednn']:.0f}", f"{ratio:.2f}x"])
        columns = ["layer", "rows x in x out", "F.linear GFLOP/s", "fast path GFLOP/s", "speed-up"]
        print_table(out, f"fp32 linear {'forward + backward' if train else 'forward'}, {args.threads} thread(s)",
                    columns, table)
    write_json(args.json, figures)


if __name__ == "__main__":
    main()
