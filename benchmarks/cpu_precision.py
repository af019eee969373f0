"""fp32 against bf16 autocast for a training step of each app on this CPU, beside the start-up probe's verdict.

`core.runtime.precision.cpu_has_fast_bf16` decides from one timed matmul whether bf16 pays here; this
checks that decision against what it stands for, whole training steps at the shipped configs' shapes
(those of `benchmarks/cpu_fastpath.py`, with the fast path on as the configs train):

- streamrec_ml1m: configs/streamrec/ml1m.yaml (3,416 items, 128 histories x 200, d_model 128, 3 layers);
- streamrec_beauty: configs/streamrec/beauty.yaml's network (12,101 items, 128 x 50, d_model 64);
- translate_multi30k: configs/translate/multi30k_en_de.yaml (vocabulary 10,000, 4+4 layers, 128 x 32 tokens).

Interleaved rounds (fp32, bf16, fp32, ...); time = median; speed-up = median of per-round ratios
fp32 / bf16 (> 1: bf16 is faster). "agrees": the probe's verdict (bf16 at least
`FAST_BF16_MIN_SPEEDUP` times faster) names the faster precision of the step, or the step is within
10% either way (then either choice costs little).

    python benchmarks/cpu_precision.py --json runs/bench/cpu_precision.json
    python benchmarks/cpu_precision.py --quick      # tiny sizes, seconds (the smoke test)

JSON keys: probe_speedup, probe_fast_bf16, {case}_{fp32,bf16}_ms, {case}_speedup, {case}_agrees, threads,
quick, load_avg_start, load_avg_end.
"""

from __future__ import annotations

import os
import statistics

from _common import interleave, median_ratio, print_table, require_bf16_kernels, write_json
from cpu_fastpath import STREAMREC, TRANSLATE, build, parse_step_args, streamrec_batch, train_step, translate_batch

from core.runtime.precision import FAST_BF16_MIN_SPEEDUP, cpu_bf16_speedup, cpu_has_fast_bf16
from streamrec.model.module import StreamRecModule
from translate.model.module import TranslationModule

CASES = ("streamrec_ml1m", "streamrec_beauty", "translate_multi30k")
NEAR = 0.1  # a step within this fraction of level is no wrong verdict either way


def steps(name: str, quick: bool) -> dict[str, object]:
    """{"fp32": step, "bf16": step} on two modules with the same weights and batch."""
    fns = {}
    for key in ("fp32", "bf16"):
        if name.startswith("streamrec"):
            module = build(StreamRecModule, STREAMREC[name], True, quick)
            batch = streamrec_batch(module, quick)
        else:
            module = build(TranslationModule, TRANSLATE, True, quick)
            batch = translate_batch(module.hparams.tgt_vocab_size, quick)
        fns[key] = train_step(module, batch, bf16=key == "bf16")
    return fns


def main(argv: list[str] | None = None) -> None:
    args, console = parse_step_args(__doc__, CASES, 2, argv)
    require_bf16_kernels("benchmarks/cpu_precision.py")
    probe, fast = cpu_bf16_speedup(), cpu_has_fast_bf16()
    figures: dict[str, float] = {"threads": args.threads, "quick": int(args.quick), "probe_speedup": probe,
                                 "probe_fast_bf16": int(fast), "load_avg_start": os.getloadavg()[0]}
    rows = [["start-up probe (one matmul)", "", "", f"{probe:.2f}x", "bf16" if fast else "fp32"]]
    for name in args.cases:
        fns = steps(name, args.quick)
        for fn in fns.values():  # warm-up (oneDNN builds its kernels on the first call)
            fn()
        times = interleave(fns, args.repeats, number=args.number)
        ms = {key: statistics.median(t) * 1e3 for key, t in times.items()}
        ratio = median_ratio(times["fp32"], times["bf16"])
        agrees = abs(ratio - 1) <= NEAR or (ratio >= FAST_BF16_MIN_SPEEDUP) == fast
        figures |= {f"{name}_fp32_ms": ms["fp32"], f"{name}_bf16_ms": ms["bf16"], f"{name}_speedup": ratio,
                    f"{name}_agrees": int(agrees)}
        rows.append([name, f"{ms['fp32']:.1f}", f"{ms['bf16']:.1f}", f"{ratio:.2f}x", "yes" if agrees else "NO"])
    figures["load_avg_end"] = os.getloadavg()[0]
    print_table(console, f"fp32 against bf16 autocast, ms per training step, {args.threads} thread(s), load average "
                f"{figures['load_avg_start']:.1f} -> {figures['load_avg_end']:.1f}",
                ["case", "fp32 ms", "bf16 ms", "bf16 speed-up", "probe agrees"], rows)
    if args.json:
        write_json(args.json, figures)
        console.print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
