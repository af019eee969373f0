"""`speed.cpu_fastpath` off against on: a training step of each app (and Translate's beam search), one run, CPU.

Each case (`_common.STEP_CASES`: the shipped configs' shapes) is built twice from the same seed, the fast path
off and on (the same weights), and times `training_step` + backward + AdamW on the same synthetic batch, or beam
5 over 32 sentences for `translate_decode`. Interleaved rounds (off, on, off, on, ...); time = median; speed-up =
median of per-round ratios off / on (> 1: the fast path is faster).

    python benchmarks/cpu_fastpath.py --threads 2 --json runs/bench/cpu_fastpath_t2.json
    python benchmarks/cpu_fastpath.py --quick          # tiny sizes, seconds (the smoke test)

JSON keys: {case}_{off,on}_ms, {case}_speedup for each case run, threads, onednn, fast_bf16, quick,
load_avg_start, load_avg_end.
"""

from __future__ import annotations

from _common import STEP_CASES, parse_step_args, step_case, time_pairs, write_json

from core.nn.cpu_fastpath import onednn_available
from core.runtime.precision import cpu_has_bf16_kernels


def main(argv: list[str] | None = None) -> None:
    args, console = parse_step_args(__doc__, tuple(STEP_CASES), 3, argv)
    if not cpu_has_bf16_kernels():
        skipped = [case for case in args.cases if case.endswith("bf16")]
        console.print(f"[yellow]{', '.join(skipped) or 'no case'} skipped: this CPU has no bf16 matmul kernels[/]")
        args.cases = [case for case in args.cases if case not in skipped]
    figures = time_pairs(console, args, "cpu_fastpath off vs on", ("off", "on"),
                         lambda case, label: step_case(case, fastpath=label == "on", quick=args.quick))
    figures |= {"onednn": int(onednn_available()), "fast_bf16": int(cpu_has_bf16_kernels())}
    if args.json:
        write_json(args.json, figures)


if __name__ == "__main__":
    main()
