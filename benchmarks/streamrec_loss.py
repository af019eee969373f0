"""StreamRec's chunked full-softmax loss against plain `F.cross_entropy` on materialised logits.

One forward + backward of the loss alone at a batch's shape (M positions, D width, N items); the baseline holds
three (M, N) float32 buffers, ours computes the gradients chunk by chunk in the forward pass. Interleaved rounds;
time = median, ratio = median of per-round ratios; peak RSS above the inputs from a separate pass of each.

    python benchmarks/streamrec_loss.py                         # ML-1M at max_len 200: M 25,600, N 3,416
    python benchmarks/streamrec_loss.py --baseline-chunk-elements 1048576   # also time another chunk size

JSON keys: {naive,chunked}_{ms,peak_mib}, speedup, memory_ratio, loss_abs_diff, the setting; with
--baseline-chunk-elements also baseline_chunk_ms and speedup_vs_baseline_chunk.
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch
import torch.nn.functional as F
from _common import compare_loss_steps, console, median_ratio, print_table, write_json

from core.nn.loss import CHUNK_ELEMENTS
from streamrec.model.losses import full_softmax


def naive(hidden: torch.Tensor, targets: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
    logits = hidden @ items[1:].T.to(hidden.dtype)
    return F.cross_entropy(logits.float(), targets - 1)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--positions", type=int, default=25_600, help="M rows (default 128 users x 200 = 25,600)")
    p.add_argument("--items", type=int, default=3_416, help="catalogue size N (default ML-1M's 3,416)")
    p.add_argument("--d-model", type=int, default=64, help="width D (default 64)")
    p.add_argument("--precision", choices=("32", "bf16"), default="32", help="fp32 or bf16 autocast")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--repeats", type=int, default=7, help="interleaved rounds (default 7)")
    p.add_argument("--baseline-chunk-elements", type=int, metavar="N",
                   help=f"also time the chunked loss at N logits per chunk (the default is {CHUNK_ELEMENTS:,})")
    p.add_argument("--json", metavar="PATH", help="write the figures as one flat JSON object")
    args = p.parse_args(argv)
    if args.baseline_chunk_elements is not None and args.baseline_chunk_elements < 1:
        p.error("--baseline-chunk-elements must be positive")
    torch.set_num_threads(args.threads)
    out = console(width=120)

    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(args.positions, args.d_model, generator=g).requires_grad_()
    items = (torch.randn(args.items + 1, args.d_model, generator=g) * args.d_model**-0.5).requires_grad_()
    targets = torch.randint(1, args.items + 1, (args.positions,), generator=g)
    bf16 = args.precision == "bf16"
    losses = {"naive": lambda: naive(hidden, targets, items), "chunked": lambda: full_softmax(hidden, targets, items)}
    if args.baseline_chunk_elements:
        losses["baseline_chunk"] = lambda: full_softmax(hidden, targets, items,
                                                        chunk_elements=args.baseline_chunk_elements)
    figures, times, rows = compare_loss_steps(losses, (hidden, items), bf16, args.repeats)
    f = {"positions": args.positions, "items": args.items, "d_model": args.d_model, "bf16": int(bf16),
         "threads": torch.get_num_threads(), "load_avg": os.getloadavg()[0], **figures}
    if args.baseline_chunk_elements:
        f["baseline_chunk_ms"] = 1e3 * statistics.median(times["baseline_chunk"])
        f["speedup_vs_baseline_chunk"] = median_ratio(times["baseline_chunk"], times["chunked"])
        rows.append([f"chunked at {args.baseline_chunk_elements:,} logits a chunk, ms (ours: {CHUNK_ELEMENTS:,})",
                     "", f"{f['baseline_chunk_ms']:.0f}", f"{f['speedup_vs_baseline_chunk']:.2f}x"])
    title = (f"full-softmax loss, M {args.positions}, N {args.items}, D {args.d_model}, "
             f"{'bf16 autocast' if bf16 else 'fp32'}, {f['threads']} thread(s), load {f['load_avg']:.1f}")
    print_table(out, title, ["", "F.cross_entropy", "chunked (ours)", "ratio"], rows)
    write_json(args.json, f)


if __name__ == "__main__":
    main()
