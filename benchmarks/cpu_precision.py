"""fp32 against bf16 autocast for a training step of each app on this CPU, beside the start-up probe's verdict.

`core.runtime.precision.cpu_has_fast_bf16` decides from one timed matmul whether bf16 pays here; this checks that
decision against whole training steps at the shipped configs' shapes (`_common.STEP_CASES`, the fast path on as
the configs train). Interleaved rounds (fp32, bf16, ...); time = median; speed-up = median of per-round ratios
fp32 / bf16 (> 1: bf16 is faster). A case "agrees" when the probe's verdict (bf16 at least
`FAST_BF16_MIN_SPEEDUP` times faster) names the faster precision, or the step is within 10% either way.

    python benchmarks/cpu_precision.py --json runs/bench/cpu_precision.json
    python benchmarks/cpu_precision.py --quick      # tiny sizes, seconds (the smoke test)

JSON keys: probe_speedup, probe_fast_bf16, {case}_{fp32,bf16}_ms, {case}_speedup, {case}_agrees, threads,
quick, load_avg_start, load_avg_end.
"""

from __future__ import annotations

from _common import parse_step_args, require_bf16_kernels, step_case, time_pairs, write_json

from core.runtime.precision import FAST_BF16_MIN_SPEEDUP, cpu_bf16_speedup, cpu_has_fast_bf16

CASES = ("streamrec_ml1m", "streamrec_beauty", "translate_multi30k_fp32")
NEAR = 0.1  # a step within this fraction of level is no wrong verdict either way


def main(argv: list[str] | None = None) -> None:
    args, console = parse_step_args(__doc__, CASES, 2, argv)
    require_bf16_kernels("benchmarks/cpu_precision.py")
    probe, fast = cpu_bf16_speedup(), cpu_has_fast_bf16()
    console.print(f"start-up probe (one matmul): bf16 {probe:.2f}x fp32's rate, so {'bf16' if fast else 'fp32'}")
    figures = time_pairs(console, args, "fp32 against bf16 autocast", ("fp32", "bf16"),
                         lambda case, label: step_case(case, bf16=label == "bf16", quick=args.quick))
    figures |= {"probe_speedup": probe, "probe_fast_bf16": int(fast)}
    for case in args.cases:
        ratio = figures[f"{case}_speedup"]
        agrees = abs(ratio - 1) <= NEAR or (ratio >= FAST_BF16_MIN_SPEEDUP) == fast
        figures[f"{case}_agrees"] = int(agrees)
        console.print(f"{case}: bf16 {ratio:.2f}x, the probe {'agrees' if agrees else '[red]DISAGREES[/]'}")
    if args.json:
        write_json(args.json, figures)


if __name__ == "__main__":
    main()
