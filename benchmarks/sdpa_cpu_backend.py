"""Which SDPA path is faster on CPU: flash against math, fp32 and bf16, forward and forward+backward.

CPU flash attention's bf16 backward is far slower than its fp32 one at the lengths translation and recommendation
train on; for bf16 the script also times the fp32 kernel on inputs cast up (`fp32` columns), which
`core.nn.attention.attend` runs where it is the fastest (`FP32_MAX_KEYS`); the `attend` columns time that rule.
B x T stays about constant (a token-count batch), with a key-padding mask. Interleaved rounds; time = median;
ratio = median of per-round ratios flash / math (> 1: math is faster).

    python benchmarks/sdpa_cpu_backend.py --threads 1 --json runs/bench/sdpa_cpu_backend.json

JSON keys: {fp32,bf16}_{fwd,train}_T{T}_{flash_ms,math_ms,flash_over_math}; bf16 also _fp32_ms, _flash_over_fp32,
_math_over_fp32; all also _attend_ms, _flash_over_attend.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from _common import console, grad_step, interleave, median_ratio, print_table, write_json
from torch.nn.attention import SDPBackend, sdpa_kernel

from core.nn.attention import attend
from core.runtime.precision import NO_BF16_KERNELS, cpu_has_bf16_kernels

TOKENS = 4096  # queries x batch per call, like a max_tokens 4096 batch


def case(dtype: torch.dtype, t: int, train: bool, heads: int = 4, head_dim: int = 64) -> dict[str, Callable[[], None]]:
    g = torch.Generator().manual_seed(t)
    b = max(1, TOKENS // t)
    q, k, v = (torch.randn(b, heads, t, head_dim, generator=g).to(dtype).requires_grad_(train) for _ in range(3))
    mask = torch.ones(b, 1, 1, t, dtype=torch.bool)
    mask[: b // 2, ..., t - max(1, t // 8):] = False  # half the rows end in padding
    run = partial(grad_step, train=train, backward=lambda out: out.sum().backward())

    def backend(b: SDPBackend) -> Callable[[], torch.Tensor]:
        def fn() -> torch.Tensor:
            with sdpa_kernel(b):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return fn

    def upcast() -> torch.Tensor:  # bf16 inputs, the fp32 flash kernel, a bf16 output (autocast off inside)
        with torch.autocast("cpu", enabled=False):
            return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask).to(dtype)

    fns = {"flash": run(backend(SDPBackend.FLASH_ATTENTION)), "math": run(backend(SDPBackend.MATH)),
           "attend": run(lambda: attend(q, k, v, mask))}
    if dtype != torch.float32:
        fns["fp32"] = run(upcast)
    return fns


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[16, 32, 64, 128, 192, 256, 512, 1024],
                   help="sequence lengths T (queries = keys)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    p.add_argument("--head-dim", type=int, default=64, help="width of one head (default 64)")
    p.add_argument("--repeats", type=int, default=7, help="interleaved rounds (default 7)")
    p.add_argument("--json", metavar="PATH", help="write the figures as one flat JSON object")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = console(width=120)
    figures: dict[str, float] = {"threads": args.threads, "tokens": TOKENS, "heads": args.heads,
                                 "head_dim": args.head_dim}
    dtypes = [(torch.float32, "fp32"), (torch.bfloat16, "bf16")]
    if not cpu_has_bf16_kernels():
        out.print(f"{NO_BF16_KERNELS}: bf16 is left out, it would time PyTorch's fallback")
        dtypes = dtypes[:1]
    figures["cpu_fast_bf16"] = int(cpu_has_bf16_kernels())
    for dtype, dname in dtypes:
        for train in (False, True):
            mode = "train" if train else "fwd"
            rows = []
            for t in args.lengths:
                times = interleave(case(dtype, t, train, args.heads, args.head_dim), args.repeats, warmup=True)
                key = f"{dname}_{mode}_T{t}"
                ms = {name: statistics.median(ts) * 1e3 for name, ts in times.items()}
                ratio = median_ratio(times["flash"], times["math"])
                figures |= {f"{key}_flash_ms": ms["flash"], f"{key}_math_ms": ms["math"],
                            f"{key}_flash_over_math": ratio}
                row = [str(t), f"{ms['flash']:.2f}", f"{ms['math']:.2f}", f"{ratio:.2f}x"]
                if "fp32" in times:  # the fp32 flash kernel on upcast inputs, against flash and math in bf16
                    up = {name: median_ratio(times[name], times["fp32"]) for name in ("flash", "math")}
                    figures |= {f"{key}_fp32_ms": ms["fp32"], f"{key}_flash_over_fp32": up["flash"],
                                f"{key}_math_over_fp32": up["math"]}
                    row += [f"{ms['fp32']:.2f}", f"{up['flash']:.2f}x", f"{up['math']:.2f}x"]
                rule = median_ratio(times["flash"], times["attend"])
                figures |= {f"{key}_attend_ms": ms["attend"], f"{key}_flash_over_attend": rule}
                row += [f"{ms['attend']:.2f}", f"{rule:.2f}x"]
                rows.append(row)
            up_cols = ["fp32 flash ms", "flash / fp32", "math / fp32"] if dtype != torch.float32 else []
            cols = ["T", "flash ms", "math ms", "flash / math", *up_cols, "attend ms", "flash / attend"]
            print_table(out, f"{dname} {'forward + backward' if train else 'forward'}, {TOKENS} queries a call, "
                                 f"{args.heads} heads of {args.head_dim}, {args.threads} thread(s)", cols, rows)
    write_json(args.json, figures)


if __name__ == "__main__":
    main()
