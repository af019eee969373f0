"""Dropout on CPU: `core.nn.cpu_fastpath.dropout` against `F.dropout`, forward and forward + backward.

`F.dropout` draws one Bernoulli sample per element; the fast path takes four 15-bit uniforms from each 64-bit draw.
A 4096-token batch at the configs' widths; interleaved rounds; ratio = median of per-round ratios F.dropout / core.

    python benchmarks/dropout.py --threads 2 --json runs/bench/dropout.json

JSON keys: {fwd,train}_W{width}_{torch_ms,core_ms,speedup}, threads, tokens, p.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from _common import console, grad_step, interleave, median_ratio, print_table, write_json

from core.nn.cpu_fastpath import dropout

TOKENS = 4096


def case(width: int, p: float, train: bool) -> dict[str, Callable[[], None]]:
    x = torch.randn(TOKENS, width, requires_grad=train)
    grad = torch.randn(TOKENS, width)
    run = partial(grad_step, train=train, backward=lambda out: out.backward(grad))
    return {"torch": run(lambda: F.dropout(x, p, True)), "core": run(lambda: dropout(x, p, True))}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--widths", type=int, nargs="+", default=[64, 128, 256, 1024], help="feature widths")
    ap.add_argument("--p", type=float, default=0.3, help="drop probability (default 0.3, the Multi30k recipe)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--repeats", type=int, default=15, help="interleaved rounds (default 15)")
    ap.add_argument("--json", metavar="PATH", help="write the figures as one flat JSON object")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = console(width=120)
    figures: dict[str, float] = {"threads": args.threads, "tokens": TOKENS, "p": args.p}
    for train in (False, True):
        mode = "train" if train else "fwd"
        rows = []
        for width in args.widths:
            fns = case(width, args.p, train)
            times = interleave(fns, args.repeats, warmup=True)
            ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
            ratio = median_ratio(times["torch"], times["core"])
            key = f"{mode}_W{width}"
            figures |= {f"{key}_torch_ms": ms["torch"], f"{key}_core_ms": ms["core"], f"{key}_speedup": ratio}
            rows.append([str(width), f"{ms['torch']:.2f}", f"{ms['core']:.2f}", f"{ratio:.2f}x"])
        print_table(out, f"dropout p={args.p} {'forward + backward' if train else 'forward'}, "
                             f"({TOKENS}, width), {args.threads} thread(s)",
                    ["width", "F.dropout ms", "fast dropout ms", "speed-up"], rows)
    write_json(args.json, figures)


if __name__ == "__main__":
    main()
