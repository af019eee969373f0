"""`model.cpu_fastpath` off against on: a training step of each app (and Translate's beam search), one run, CPU.

Each case builds the app's LightningModule twice from the same seed, `cpu_fastpath=False` and `True`
(the same weights), and times `training_step` + backward + AdamW on the same synthetic batch, at the
shapes of the shipped configs:

- streamrec_ml1m: configs/streamrec/ml1m.yaml (3,416 items, 128 histories x 200, d_model 128, 1 head,
  3 layers, d_ff 256, dropout 0.2), fp32 as the config trains;
- streamrec_beauty: configs/streamrec/beauty.yaml (12,101 items, 128 x 50, 2 heads, dropout 0.35, attention
  dropout 0.2), fp32;
- streamrec_ml1m_bf16: StreamRecModule's defaults (the default recipe: 2 heads, d_ff 256, GELU) at ML-1M's
  shape under bf16 autocast, as `streamrec_rectools.py --ours-recipe default --precision bf16` trains it;
- translate_multi30k_{fp32,bf16}: configs/translate/multi30k_en_de.yaml (vocabulary 10,000, d_model 128,
  4+4 layers, d_ff 256, dropout 0.3, ff_dropout 0; a 4,096-token batch of 128 x 32), in fp32 and under
  bf16 autocast (what the config asks for; only where this CPU has fast bf16);
- translate_decode: beam 5 over 32 sentences, 20 steps, with that model in fp32 (`translate.search.decoding`).

Interleaved rounds (off, on, off, on, ...); time = median; speed-up = median of per-round ratios
off / on (> 1: the fast path is faster).

    python benchmarks/cpu_fastpath.py --threads 2 --json runs/bench/cpu_fastpath_t2.json
    python benchmarks/cpu_fastpath.py --quick          # tiny sizes, seconds (the smoke test)

JSON keys: {case}_{off,on}_ms, {case}_speedup for each case run, threads, onednn, fast_bf16, quick,
load_avg_start, load_avg_end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import warnings
from collections.abc import Callable
from contextlib import nullcontext

import torch
from _common import interleave, median_ratio, print_table, write_json
from rich.console import Console

from core.nn.cpu_fastpath import onednn_available
from core.runtime.precision import cpu_has_bf16_kernels
from streamrec.data.datasets import TrainBatch
from streamrec.model.module import StreamRecModule
from translate.data.corpus import Batch
from translate.data.vocab import BOS_ID, EOS_ID
from translate.model.module import TranslationModule
from translate.search.decoding import beam_search

# case -> module arguments; batch shapes below. "quick" shrinks every size for the smoke test.
STREAMREC = {
    "streamrec_ml1m": dict(num_items=3416, max_len=200, d_model=128, n_heads=1, n_layers=3, d_ff=256, dropout=0.2),
    "streamrec_beauty": dict(num_items=12101, max_len=50, d_model=64, n_heads=2, n_layers=2, d_ff=256, dropout=0.35,
                             attn_dropout=0.2),
    "streamrec_ml1m_bf16": dict(num_items=3416, max_len=200),  # the module's defaults otherwise
}
TRANSLATE = dict(src_vocab_size=10000, tgt_vocab_size=10000, d_model=128, n_heads=4, n_encoder_layers=4,
                 n_decoder_layers=4, d_ff=256, dropout=0.3, ff_dropout=0.0)
QUICK = dict(num_items=50, max_len=12, src_vocab_size=60, tgt_vocab_size=60, d_model=16, n_heads=2, d_ff=32)
BATCH, TRANSLATE_BATCH, TRANSLATE_LEN = 128, (128, 32), 20  # histories; (sentences, tokens); decoder steps
CASES = ("streamrec_ml1m", "streamrec_beauty", "streamrec_ml1m_bf16", "translate_multi30k_fp32",
         "translate_multi30k_bf16", "translate_decode")


def build(cls: type, kwargs: dict, fastpath: bool, quick: bool) -> torch.nn.Module:
    """The module with `cpu_fastpath=fastpath`, seeded so both builds hold the same weights."""
    torch.manual_seed(0)
    if quick:
        kwargs = {**kwargs, **{k: v for k, v in QUICK.items() if k in kwargs}}
    return cls(**kwargs, cpu_fastpath=fastpath)


def train_step(module: torch.nn.Module, batch: object, bf16: bool) -> Callable[[], None]:
    """One optimisation step as Lightning runs it: training_step, backward, AdamW."""
    opt = torch.optim.AdamW(module.parameters(), lr=1e-4)
    module.train()

    def step() -> None:
        with torch.autocast("cpu", torch.bfloat16) if bf16 else nullcontext():
            loss = module.training_step(batch, 0)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def streamrec_case(name: str, quick: bool) -> dict[str, Callable[[], None]]:
    kwargs = STREAMREC[name]
    fns = {}
    for key, on in (("off", False), ("on", True)):
        module = build(StreamRecModule, kwargs, on, quick)
        fns[key] = train_step(module, streamrec_batch(module, quick), bf16=name.endswith("bf16"))
    return fns


def streamrec_batch(module: StreamRecModule, quick: bool) -> TrainBatch:
    """A full batch of random histories at the module's max_len, the same for every build (seed 1)."""
    hp = module.hparams
    g = torch.Generator().manual_seed(1)
    items = torch.randint(1, hp.num_items + 1, (8 if quick else BATCH, hp.max_len + 1), generator=g)
    return TrainBatch(inputs=items[:, :-1], targets=items[:, 1:])


def translate_batch(vocab: int, quick: bool) -> Batch:
    b, t = (4, 6) if quick else TRANSLATE_BATCH
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(4, vocab, (3, b, t), generator=g)
    tgt_in = torch.cat([torch.full((b, 1), BOS_ID), ids[1, :, :-1]], 1)  # bos + target
    return Batch(src=ids[0], tgt_in=tgt_in, tgt_out=ids[1], index=torch.arange(b))


def translate_case(name: str, quick: bool) -> dict[str, Callable[[], None]]:
    fns = {}
    for key, on in (("off", False), ("on", True)):
        module = build(TranslationModule, TRANSLATE, on, quick)
        batch = translate_batch(module.hparams.tgt_vocab_size, quick)
        if name == "translate_decode":
            model, steps = module.model.eval(), 4 if quick else TRANSLATE_LEN
            src = batch.src[: 32 if not quick else 4, :20]

            def decode(model=model, src=src, n=steps - 1) -> None:  # n subwords, then the forced EOS
                beam_search(model, src, BOS_ID, EOS_ID, beam_size=5, max_len_a=0.0, max_len_b=n, max_len=n)
            fns[key] = decode
        else:
            fns[key] = train_step(module, batch, bf16=name.endswith("bf16"))
    return fns


def parse_step_args(doc: str, cases: tuple[str, ...], number: int,
                    argv: list[str] | None) -> tuple[argparse.Namespace, Console]:
    """The options of a script that times training steps case by case, checked; threads and warnings set."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--cases", nargs="+", choices=cases, default=list(cases), help="what to time (default: all)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--repeats", type=int, default=7, help="interleaved rounds (default 7)")
    ap.add_argument("--number", type=int, default=number, help=f"steps per timing (default {number})")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: checks the script runs, times nothing useful")
    ap.add_argument("--json", metavar="PATH", help="write the figures as one flat JSON object")
    args = ap.parse_args(argv)
    if args.threads < 1 or args.repeats < 1 or args.number < 1:
        ap.error("--threads, --repeats and --number must be >= 1")
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", ".*self.log.*")  # training_step logs; there is no trainer here
    return args, Console(width=None if sys.stdout.isatty() else 120)


def main(argv: list[str] | None = None) -> None:
    args, console = parse_step_args(__doc__, CASES, 3, argv)
    figures: dict[str, float] = {"threads": args.threads, "onednn": int(onednn_available()),
                                 "fast_bf16": int(cpu_has_bf16_kernels()), "quick": int(args.quick),
                                 "load_avg_start": os.getloadavg()[0]}
    rows = []
    for name in args.cases:
        if name.endswith("bf16") and not cpu_has_bf16_kernels():
            console.print(f"[yellow]{name}: skipped, this CPU has no bf16 matmul kernels[/]")
            continue
        fns = streamrec_case(name, args.quick) if name.startswith("streamrec") else translate_case(name, args.quick)
        for fn in fns.values():  # warm-up (oneDNN builds its kernels on the first call)
            fn()
        times = interleave(fns, args.repeats, number=args.number)
        ms = {key: statistics.median(t) * 1e3 for key, t in times.items()}
        ratio = median_ratio(times["off"], times["on"])
        figures |= {f"{name}_off_ms": ms["off"], f"{name}_on_ms": ms["on"], f"{name}_speedup": ratio}
        rows.append([name, f"{ms['off']:.1f}", f"{ms['on']:.1f}", f"{ratio:.2f}x"])
    figures["load_avg_end"] = os.getloadavg()[0]
    print_table(console, f"cpu_fastpath off vs on, ms per step (decode: per search), {args.threads} thread(s), "
                f"load average {figures['load_avg_start']:.1f} -> {figures['load_avg_end']:.1f}",
                ["case", "off ms", "on ms", "speed-up"], rows)
    if args.json:
        write_json(args.json, figures)
        console.print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
