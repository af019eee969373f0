"""Translate's chunked R-Drop loss against the same loss on materialised logits with autograd.

One forward + backward of the loss alone: M target tokens seen by two dropout passes, D width, V subwords. The
baseline is R-Drop as its paper's code writes it ((2, M, V) logits, cross-entropy on both passes, KL both ways);
ours (`core.rdrop_cross_entropy`) computes loss and gradients chunk by chunk. Interleaved rounds; time = median,
ratio = median of per-round ratios; peak RSS above the inputs from a separate pass of each.

    python benchmarks/translate_rdrop_loss.py --threads 2 --precision bf16    # Multi30k: M 3,500, V 10,000, D 128

JSON keys: {naive,chunked}_{ms,peak_mib}, speedup, memory_ratio, loss_abs_diff, plus the setting.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F
from _common import compare_loss_steps, console, print_table, write_json

from core.nn import rdrop_cross_entropy

SMOOTHING = 0.1


def naive(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, alpha: float) -> torch.Tensor:
    logits = (hidden @ weight.T.to(hidden.dtype)).float()  # (2, M, V)
    ce = (F.cross_entropy(logits[0], targets, label_smoothing=SMOOTHING)
          + F.cross_entropy(logits[1], targets, label_smoothing=SMOOTHING)) / 2
    logp = logits.log_softmax(-1)
    kl = (F.kl_div(logp[0], logp[1], log_target=True, reduction="sum")
          + F.kl_div(logp[1], logp[0], log_target=True, reduction="sum"))
    return ce + alpha / 4 * kl / targets.shape[0]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--positions", type=int, default=3_500, help="M target tokens (default 3,500, a Multi30k batch)")
    p.add_argument("--vocab", type=int, default=10_000, help="V subwords (default 10,000)")
    p.add_argument("--d-model", type=int, default=128, help="width D (default 128)")
    p.add_argument("--alpha", type=float, default=5.0, help="R-Drop weight (default 5)")
    p.add_argument("--precision", choices=("32", "bf16"), default="32", help="fp32 or bf16 autocast")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--repeats", type=int, default=7, help="interleaved rounds (default 7)")
    p.add_argument("--json", metavar="PATH", help="write the figures as one flat JSON object")
    args = p.parse_args(argv)
    if min(args.positions, args.vocab, args.d_model, args.repeats) < 1 or args.alpha < 0:
        p.error("--positions, --vocab, --d-model and --repeats must be positive and --alpha >= 0")
    torch.set_num_threads(args.threads)
    out = console(width=120)
    bf16 = args.precision == "bf16"

    g = torch.Generator().manual_seed(0)
    base = torch.randn(args.positions, args.d_model, generator=g)
    hidden = torch.stack([base, base + 0.3 * torch.randn(base.shape, generator=g)]).requires_grad_()  # two passes
    weight = (torch.randn(args.vocab, args.d_model, generator=g) * args.d_model**-0.5).requires_grad_()
    targets = torch.randint(0, args.vocab, (args.positions,), generator=g)
    losses = {"naive": lambda: naive(hidden, weight, targets, args.alpha),
              "chunked": lambda: rdrop_cross_entropy(hidden, weight, targets, SMOOTHING, args.alpha)}
    figures, _, rows = compare_loss_steps(losses, (hidden, weight), bf16, args.repeats)
    f = {"positions": args.positions, "vocab": args.vocab, "d_model": args.d_model, "alpha": args.alpha,
         "bf16": int(bf16), "threads": torch.get_num_threads(), "load_avg": os.getloadavg()[0], **figures}
    title = (f"R-Drop loss (alpha {args.alpha:g}), 2 x M {args.positions}, V {args.vocab}, D {args.d_model}, "
             f"{'bf16 autocast' if bf16 else 'fp32'}, {f['threads']} thread(s), load {f['load_avg']:.1f}")
    print_table(out, title, ["", "logits + autograd", "chunked (ours)", "ratio"], rows)
    write_json(args.json, f)


if __name__ == "__main__":
    main()
