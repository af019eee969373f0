"""A StreamRec checkpoint's (or ensemble's) test metrics under each published protocol: ours beside each anchor.

The papers rank the held-out item over the whole catalogue but treat the items a user has already seen
differently (docs/results.md, "Published anchors"):

  ours  seen items removed, except the target (what `streamrec test` reports)
  keep  nothing removed (RB: the RecBole forks of DuoRec and MCLRec)
  zero  seen items scored 0, the target too when it is a repeat (S3: S3Rec's code, used by BSARec, ICLRec,
        ICSRec); a seen item then outranks every target with a negative score (never an ensemble's: probabilities)
  s3code  zero through that trainer's own steps: NumPy's argpartition and argsort build a top-20 list, and their
        order among the tied zeros ranks a repeat target among the other seen items (zero counts ties against it)
  all   every seen item removed, the target too, so a repeat target is a miss (KV: Klenitskiy & Vasilev)
  known ours over the cases whose target occurs in training histories or as a validation target (RT: eSASRec's)

Ties count against the target, except in s3code. `--shifts C ...` adds s3code for the scores plus C: a softmax
model's probabilities do not change with a constant added to its scores, its S3 figure does. The data module is
rebuilt from the checkpoint's hyper-parameters: the split is the one the model was trained and tested on.

    python benchmarks/streamrec_protocols.py --ckpt runs/streamrec_beauty/checkpoints/best.ckpt --json runs/p.json
    python benchmarks/streamrec_protocols.py --ckpt SEED0.ckpt SEED1.ckpt SEED2.ckpt   # an ensemble
    python benchmarks/streamrec_protocols.py --ckpt RUN/checkpoints/best.ckpt --cold data/beauty/cold/cold.json

`--cold` ranks a cold-item slice's cases instead (`data/hold_out_items.py`): each target, an item the model met only
through its features, among the held-out items (the shelf) and over the whole catalogue, beside a shelf ranked at
random (what a model without features can do).

JSON keys: {protocol}_{hr,ndcg}@K, s3code{C:+g}_{hr,ndcg}@K, cases, known_cases, repeat_targets (share of test targets
already seen), zero_in_top10 (share of cases with fewer than 10 unseen items scored above 0); with
--cold, {shelf,catalogue,random}_{hr,ndcg}@K, cases, held_out.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from _common import console, print_table, write_json
from torch import Tensor

from core.runtime.checkpoint import load_checkpoint
from streamrec.api import WRITTEN_BY, Recommender
from streamrec.data.constants import PAD_ID
from streamrec.data.datamodule import StreamRecDataModule
from streamrec.model.metrics import RankingMetrics, seen_mask, target_ranks
from streamrec.ranking.batch import left_pad

PROTOCOLS = ("ours", "keep", "zero", "all", "known", "s3code")
S3_LIST = 20  # the length of the top list S3Rec's trainer ranks
DATA_KEY = "datamodule_hyper_parameters"  # where Lightning stores the data module's arguments


class ProtocolMetrics(RankingMetrics):
    """`RankingMetrics` with the target ranked as `protocol` says (one of PROTOCOLS; `known` is `ours` over the
    cases the caller passes); `shift` is added to the scores of s3code."""

    def __init__(self, protocol: str, ks: Sequence[int], shift: float = 0.0):
        super().__init__(ks, exclude_seen=protocol != "keep")
        self.protocol, self.shift = protocol, shift

    def ranks(self, scores: Tensor, targets: Tensor, seen: Tensor | None) -> Tensor:
        if self.protocol not in ("zero", "all", "s3code"):
            return target_ranks(scores, targets, seen)
        mask = seen_mask(seen, scores.shape[1])
        if self.protocol == "s3code":
            return s3code_ranks(scores + self.shift, mask, targets, max(S3_LIST, *self.ks))
        if self.protocol == "zero":
            return target_ranks(scores.masked_fill(mask, 0.0), targets, None)
        repeat = mask.gather(1, targets[:, None]).squeeze(1)  # a repeat target is a miss: rank +inf
        return target_ranks(scores, targets, seen).float().masked_fill(repeat, math.inf)


def s3code_ranks(scores: Tensor, seen: Tensor, targets: Tensor, length: int) -> Tensor:
    """0-based rank of each target in the top-`length` list of S3Rec's trainer (BSARec's `iteration`), inf where it
    is not in the list: the same NumPy calls on the same columns (our ids are the file's), so ties fall as there."""
    rating, length = scores.numpy().copy(), min(length, scores.shape[1])
    rating[seen.numpy()] = 0
    rating[:, PAD_ID] = -np.inf  # a padded history marks column 0 seen; padding is never ranked
    rows = np.arange(len(rating))[:, None]
    ind = np.argpartition(rating, -length)[:, -length:]
    top = ind[rows, np.argsort(rating[rows, ind])[:, ::-1]]
    hit = top == targets.numpy()[:, None]
    return torch.from_numpy(np.where(hit.any(1), hit.argmax(1), math.inf))


@torch.inference_mode()
def evaluate(ckpts: list[str], ks: list[int], batch_size: int, shifts: Sequence[float] = ()) -> dict[str, float]:
    ckpt = ckpts[0]  # the split: every member of an ensemble was trained on one catalogue
    state = load_checkpoint(ckpt, WRITTEN_BY, mmap=True)
    if DATA_KEY not in state:
        sys.exit(f"error: {ckpt}: no data module arguments in the checkpoint; pass one written by streamrec fit")
    hparams = {k: v for k, v in state[DATA_KEY].items() if not k.startswith("_")}
    data = StreamRecDataModule(**{**hparams, "batch_size": batch_size, "num_workers": 0})
    data.setup("test")
    model = Recommender.load(ckpts).model
    known = data.train_item_counts() > 0  # (N+1,): items in a training history or a validation target
    for case in data.splits.valid:
        known[case.target] = True
    metrics = {p: ProtocolMetrics(p, ks) for p in PROTOCOLS}
    metrics |= {f"s3code{c:+g}": ProtocolMetrics("s3code", ks, c) for c in shifts if c != 0}
    repeats = zero_in_top10 = 0
    for batch in data.test_dataloader():
        scores = model.recommend_scores(batch.inputs).float()
        keep = known[batch.targets]
        mask = seen_mask(batch.seen, scores.shape[1])
        repeats += int(mask.gather(1, batch.targets[:, None]).sum())
        zero_in_top10 += int(((scores > 0) & ~mask).sum(1).lt(10).sum())
        for name, metric in metrics.items():  # the mask built once serves every protocol
            if name == "known":
                metric.update(scores[keep], batch.targets[keep], mask[keep])
            else:
                metric.update(scores, batch.targets, mask)
    figures = {f"{p}_{name}": float(value) for p, metric in metrics.items()
               for name, value in metric.compute().items() if not name.startswith("mrr")}
    cases, known_cases = int(metrics["ours"].count), int(metrics["known"].count)
    return figures | {"cases": cases, "known_cases": known_cases, "repeat_targets": repeats / cases,
                      "zero_in_top10": zero_in_top10 / cases}


@torch.inference_mode()
def cold(ckpts: list[str], path: str, ks: list[int], batch_size: int) -> dict[str, float]:
    slice_ = json.loads(Path(path).read_text(encoding="utf-8"))
    held, cases, rec = slice_["held_out"], slice_["cases"], Recommender.load(ckpts)
    held_ids = torch.from_numpy(rec.vocab.lookup(held))
    if unknown := int((held_ids == 0).sum()):
        sys.exit(f"error: {path}: {unknown} held-out items are unknown to {ckpts[0]}; train it with a features file "
                 "that lists them (--data.item_features)")
    off_shelf = torch.ones(rec.vocab.num_items + 1, dtype=torch.bool).index_fill_(0, held_ids, False)
    metrics = {"shelf": RankingMetrics(ks, exclude_seen=False), "catalogue": RankingMetrics(ks)}
    for start in range(0, len(cases), batch_size):
        batch = cases[start : start + batch_size]
        histories = [rec.encode(c["history"])[0] for c in batch]
        targets = torch.from_numpy(rec.vocab.lookup([c["target"] for c in batch]))
        scores = rec.model.recommend_scores(left_pad(histories, rec.model.max_len)).float()
        metrics["shelf"].update(scores.masked_fill(off_shelf, -math.inf), targets)
        metrics["catalogue"].update(scores, targets, left_pad(histories, max(map(len, histories))))
    figures = {f"{p}_{name}": float(value) for p, metric in metrics.items()
               for name, value in metric.compute().items() if not name.startswith("mrr")}
    for k in ks:  # a random order of the shelf puts the target at each rank with probability 1 / len(held)
        figures[f"random_hr@{k}"] = min(k, len(held)) / len(held)
        figures[f"random_ndcg@{k}"] = sum(1 / math.log2(r + 2) for r in range(min(k, len(held)))) / len(held)
    return figures | {"cases": len(cases), "held_out": len(held)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True, nargs="+",
                   help="a checkpoint written by python -m streamrec fit; several: their ensemble")
    p.add_argument("--ks", type=int, nargs="+", default=[10, 20])
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--shifts", type=float, nargs="+", default=[], metavar="C",
                   help="also rank s3code on the scores plus each C (what a constant the softmax ignores does to S3)")
    p.add_argument("--cold", metavar="FILE", help="a cold-item slice (cold.json of data/hold_out_items.py)")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    if min(args.ks) < 1 or args.batch_size < 1:
        p.error("--ks and --batch-size must be >= 1")
    if args.cold:
        figures = cold(args.ckpt, args.cold, args.ks, args.batch_size)
        labels = {"shelf": "the held-out items", "catalogue": "the whole catalogue", "random": "the shelf at random"}
        title = f"{args.ckpt[0]}: {figures['cases']} cold cases, {figures['held_out']} held-out items"
    else:
        figures = evaluate(args.ckpt, args.ks, args.batch_size, args.shifts)
        labels = {"ours": "ours: seen removed, target kept", "keep": "RB: nothing removed", "zero": "S3: seen scored 0",
                  "all": "KV: every seen removed, target too", "known": f"RT: ours over {figures['known_cases']} cases",
                  "s3code": "S3, its trainer's NumPy ranking"}
        labels |= {f"s3code{c:+g}": f"S3, its trainer's, scores {c:+g}" for c in args.shifts if c != 0}
        title = (f"{' + '.join(args.ckpt)}: {figures['cases']} test cases, {figures['repeat_targets']:.2%} repeats, "
                 f"{figures['zero_in_top10']:.2%} with a zero in the top 10")
    rows = [[label, *(f"{figures[f'{p}_{m}@{k}']:.4f}" for k in args.ks for m in ("hr", "ndcg"))]
            for p, label in labels.items()]
    print_table(console(), title, ["protocol" if args.cold is None else "ranked among",
                                   *(f"{m}@{k}" for k in args.ks for m in ("HR", "NDCG"))], rows)
    write_json(args.json, figures)


if __name__ == "__main__":
    main()
