"""Multi30k quality of a Translate checkpoint, both ways BLEU is reported for this corpus.

1. Cased, detokenised sacreBLEU and chrF of the raw output against the raw references (signatures printed).
2. Lowercased tokenised BLEU as the Multi30k literature reports it: the output lowercased, punctuation-normalised
   and Moses-tokenised (sacremoses), scored with `tokenize="none"` against the official `tok/*.lc.norm.tok.*`
   files; the script first checks that this pipeline turns the raw references into the official ones.

    python benchmarks/translate_bleu.py --ckpt runs/multi30k_en_de/avg.ckpt --json runs/multi30k_test.json
    python benchmarks/translate_bleu.py --hyp out.de          # score an existing translation
    python benchmarks/translate_bleu.py --ckpt A.ckpt B.ckpt   # an ensemble

A model trained on `data/prepare_multi30k.py`'s lowercased tokenised text is scored with `--prepared DIR`: DIR's
source translated, its output scored as it is against `tok/`. sacremoses: `pip install -c constraints.txt ".[bench]"`.

JSON keys: bleu, chrf, bleu_lc_tok, tok_pipeline_match, lines, models (0 with --hyp), beam, alpha, bf16, int8,
seconds (no bleu, chrf, tok_pipeline_match with --prepared).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import sacrebleu
from _common import ROOT, console, write_json

sys.path.insert(0, str(ROOT / "data"))
from prepare_multi30k import MULTI30K, moses_lc_tok, read_lines  # noqa: E402  (a script in data/, not a package)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src_or_hyp = p.add_mutually_exclusive_group(required=True)
    src_or_hyp.add_argument("--ckpt", nargs="+", metavar="CKPT", help="translate the split's source and score it; "
                            "several checkpoints translate as an ensemble")
    src_or_hyp.add_argument("--hyp", help="score this translation file instead")
    p.add_argument("--split", default="test_2016_flickr", help="Multi30k split name (default test_2016_flickr)")
    p.add_argument("--src-lang", default="en")
    p.add_argument("--tgt-lang", default="de")
    p.add_argument("--data", default=str(MULTI30K), help=f"Multi30k folder (default {MULTI30K})")
    p.add_argument("--beam", type=int, default=5, help="beam size (default 5)")
    p.add_argument("--alpha", type=float, default=0.6, help="GNMT length penalty (default 0.6)")
    p.add_argument("--batch-size", type=int, default=64, help="sentences per batch (default 64)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "int8"), default="float32", help="translate.infer's")
    p.add_argument("--out", help="where the translation goes (default: next to the checkpoint, SPLIT.hyp.LANG)")
    p.add_argument("--prepared", metavar="DIR", help="the model was trained on data/prepare_multi30k.py's output in "
                   "DIR: translate DIR's source, score the output as it is (lowercased tokenised BLEU only)")
    p.add_argument("--json", metavar="PATH", help="write the figures as one flat JSON object")
    args = p.parse_args(argv)
    out = console(width=120)
    data = Path(args.data)
    src = Path(args.prepared or data) / f"{args.split}.{args.src_lang}"
    ref_raw = read_lines(data / f"{args.split}.{args.tgt_lang}")
    ref_tok = read_lines(data / "tok" / f"{args.split}.lc.norm.tok.{args.tgt_lang}")

    seconds = 0.0
    if args.ckpt:
        from translate import infer

        hyp_path = Path(args.out or Path(args.ckpt[0]).with_name(f"{args.split}.hyp.{args.tgt_lang}"))
        start = time.perf_counter()
        infer.main(["--ckpt", *args.ckpt, "-i", str(src), "-o", str(hyp_path), "--beam-size", str(args.beam),
                    "--alpha", str(args.alpha), "--batch-size", str(args.batch_size), "--dtype", args.dtype])
        seconds = time.perf_counter() - start
        models = f"an ensemble of {len(args.ckpt)} checkpoints" if len(args.ckpt) > 1 else args.ckpt[0]
        out.print(f"translated {src} with {models}, beam {args.beam}, alpha {args.alpha}, {args.dtype}, "
                  f"into {hyp_path} ({seconds:.0f} s)")
    else:
        hyp_path = Path(args.hyp)
    hyps = read_lines(hyp_path)
    if len(hyps) != len(ref_raw):
        sys.exit(f"error: {hyp_path} has {len(hyps)} lines but the references have {len(ref_raw)}")

    bleu_none = sacrebleu.metrics.BLEU(tokenize="none", force=True)  # tokenised on purpose
    figures = {"lines": len(hyps), "models": len(args.ckpt or []), "beam": args.beam, "alpha": args.alpha,
               "bf16": int(args.dtype == "bfloat16"), "int8": int(args.dtype == "int8"), "seconds": seconds}
    out.print(f"[bold]{args.split} {args.src_lang}->{args.tgt_lang}[/], {len(hyps)} sentences")
    if args.prepared:  # output is already lowercased and tokenised like tok/
        lc_tok = bleu_none.corpus_score(hyps, [ref_tok])
        out.print(f"lowercased tokenised (trained on {args.prepared}) vs tok/: {lc_tok}  "
                  f"(signature {bleu_none.get_signature()}; output scored as it is)")
    else:
        bleu, chrf = sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF()
        cased = bleu.corpus_score(hyps, [ref_raw])
        chrf_score = chrf.corpus_score(hyps, [ref_raw])
        match = sum(a == b for a, b in zip(moses_lc_tok(ref_raw, args.tgt_lang), ref_tok, strict=True))
        lc_tok = bleu_none.corpus_score(moses_lc_tok(hyps, args.tgt_lang), [ref_tok])
        out.print(f"cased detokenised: {cased}  (signature {bleu.get_signature()})")
        out.print(f"                   {chrf_score}  (signature {chrf.get_signature()})")
        out.print(f"lowercased Moses-tokenised vs tok/: {lc_tok}  (signature {bleu_none.get_signature()}; "
                  f"the pipeline reproduces {match} of {len(ref_tok)} official tokenised references exactly)")
        figures.update(bleu=cased.score, chrf=chrf_score.score, tok_pipeline_match=match / len(ref_tok))
    write_json(args.json, {**figures, "bleu_lc_tok": lc_tok.score})


if __name__ == "__main__":
    main()
