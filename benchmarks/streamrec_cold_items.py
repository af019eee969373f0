"""Cold items: how well does a model trained with item features recommend items no training history holds?

A seeded fraction of the items that have features is held out: every interaction with them is removed from the
log, and `python -m streamrec fit` trains on the rest with the features file, which still lists them, so they
become cold items (`streamrec.data.features`). Each user whose history held a held-out item is then a test case:
the most recent such item is the target and everything before it in the original log is the history (earlier
held-out items included, as cold items). The target is ranked, seen items removed:

- among the held-out items only, against two references that need no training: a random order, and a content
  baseline that ranks by the cosine between the item's features and the feature counts of the user's history;
- among the whole catalogue, where a model without features can never recommend it (HR@10 0 by construction);
- with `--cold-slots C` (`RankingOptions.cold_slots`): the top K of the whole catalogue with C slots kept for
  the best cold items. Their cost is measured on warm targets: each user's last item of the warm log (the
  fit's own test split), ranked with C slots and without.

Ties are broken at random and the metrics are their expectation, so a coarse score (the content baseline's) is
not punished for ties. The fit's own output (validation and test on the warm items) is in OUT/run/.

    python data/prepare_ml1m_features.py
    python benchmarks/streamrec_cold_items.py --config configs/streamrec/ml1m.yaml \\
        --log ../shared/data/ml-1m/ml-1m.sasrec-prefix.txt --features data/ml1m/genres.csv --columns genres \\
        --out runs/cold_ml1m --json runs/cold_ml1m.json --fit-args '--early_stopping 5 --trainer.max_epochs 40'

`--fit-args` go to `streamrec fit` as they are (split as a shell would). A rerun with the same --out resumes
the fit from its last.ckpt, or skips it once it has finished.

JSON keys: cases, held_out_items, catalogue; {model,content,random}_cold_{hr,ndcg}@K (among held-out items);
model_all_{hr,ndcg}@K (the whole catalogue); slotsC_cold_{hr,ndcg}@K (cold targets, C slots) and
slotsC_warm_{hr,ndcg}@K (warm targets; slots0_warm: no slots), warm_cases.
"""

from __future__ import annotations

import argparse
import math
import random
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from _common import ROOT, print_table, write_json
from rich.console import Console

from core.runtime.atomic import atomic_path
from streamrec.api import Recommender
from streamrec.data.features import read_item_features
from streamrec.data.readers import read_interactions
from streamrec.model.metrics import seen_mask
from streamrec.ranking.batch import RankingOptions, left_pad, rank, right_pad

DONE = "fit.done"  # written after the fit ends, so a rerun goes straight to the evaluation


def expected_hits(scores: torch.Tensor, targets: torch.Tensor, candidates: torch.Tensor, k: int,
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per case, HR@k and NDCG@k of the target among `candidates`, in expectation over random tie-breaking.

    Args:
        scores: (B, N+1) scores.
        targets: (B,) the target column of each row.
        candidates: (B, N+1) bool: the items the target is ranked among (the target's own flag is ignored).

    A target with g candidates scored above it and e tied with it has a rank uniform on g+1 .. g+e+1.
    """
    target = scores.gather(1, targets[:, None])
    others = candidates.clone()
    others.scatter_(1, targets[:, None], False)
    above = ((scores > target) & others).sum(1)
    tied = ((scores == target) & others).sum(1)
    hr, ndcg = torch.zeros(len(targets)), torch.zeros(len(targets))
    for row, (g, e) in enumerate(zip(above.tolist(), tied.tolist(), strict=True)):
        ranks = range(g + 1, min(g + e + 1, k) + 1)  # the ranks within the top k, each with chance 1 / (e + 1)
        hr[row] = len(ranks) / (e + 1)
        ndcg[row] = sum(1 / math.log2(r + 1) for r in ranks) / (e + 1)
    return hr, ndcg


def hold_out(features: dict[str, list[str]], fraction: float, seed: int) -> set[str]:
    """A seeded `fraction` of the items with features."""
    items = sorted(features)
    if not items:
        sys.exit("error: no item of the log has a feature value; check --features and --columns")
    return set(random.Random(seed).sample(items, max(1, round(fraction * len(items)))))


def write_warm_log(histories: dict[str, list[str]], held: set[str], path: Path) -> None:
    """The log without the held-out items, as `user item` lines (the sasrec format)."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as out:
        for user, items in histories.items():
            for item in items:
                if item not in held:
                    out.write(f"{user} {item}\n")


def fit(args: argparse.Namespace, warm_log: Path, run: Path) -> Path:
    """Train (or resume) `streamrec fit` on the warm log with the features file; returns best.ckpt."""
    best = run / "checkpoints" / "best.ckpt"
    if (run / DONE).exists():
        return best
    command = [sys.executable, "-m", "streamrec", "fit", "--config", args.config, "--data.path", str(warm_log),
               "--data.format", "sasrec", "--data.item_features", args.features,
               "--data.feature_columns", "[" + ",".join(args.columns) + "]",
               "--trainer.default_root_dir", str(run), *args.fit_args]
    last = run / "checkpoints" / "last.ckpt"
    if last.exists():
        command += ["--ckpt_path", str(last)]
    print("$", " ".join(command), flush=True)
    if subprocess.run(command, cwd=ROOT).returncode:
        sys.exit(f"error: streamrec fit failed (its output is above); rerun with the same --out {args.out} to resume")
    (run / DONE).write_text("")
    return best


def cases(histories: dict[str, list[str]], held: set[str]) -> list[tuple[list[str], str]]:
    """(history, target) per user: the user's most recent held-out item and everything before it."""
    out = []
    for items in histories.values():
        last = max((t for t, item in enumerate(items) if item in held and t > 0), default=None)
        if last is not None:
            out.append((items[:last], items[last]))
    return out


@torch.inference_mode()
def evaluate(rec: Recommender, ckpt: Path, test: list[tuple[list[str], str]], held: set[str], ks: Sequence[int],
             batch_size: int) -> dict[str, float]:
    """The held-out targets among the held-out items (model, content baseline, random) and the whole catalogue;
    `ckpt` is `rec`'s file, named in errors."""
    model, index = rec.model, rec.vocab.index
    n = model.item_features.shape[0]  # N + 1 columns of scores
    cold = torch.zeros(n, dtype=torch.bool)
    cold[[index[i] for i in held if i in index]] = True
    test = [(history, target) for history, target in test if any(i in index for i in history)]  # warm users only
    if not bool(model.cold_items[cold].all()):
        sys.exit(f"error: {ckpt}: the held-out items are not cold in this checkpoint; use a fresh --out")
    # Multi-hot features of every item, for the content baseline (column 0 is padding).
    bags = torch.zeros(n, int(model.item_features.max()) + 1)
    bags.scatter_(1, model.item_features, 1.0)
    bags[:, 0] = 0.0
    sums = {name: 0.0 for name in (f"{s}_{m}@{k}" for s in ("model_cold", "content_cold", "random_cold",
                                                                  "model_all") for m in ("hr", "ndcg") for k in ks)}
    for start in range(0, len(test), batch_size):
        chunk = test[start:start + batch_size]
        ids = [[index[i] for i in history if i in index] for history, _ in chunk]
        targets = torch.tensor([index[target] for _, target in chunk])
        unseen = ~seen_mask(right_pad(ids), n)
        unseen[:, 0] = False
        model_scores = model.recommend_scores(left_pad(ids, model.max_len)).float()
        profile = bags[right_pad(ids)].sum(1)  # (B, F+1) feature counts of the history
        content = torch.nn.functional.normalize(profile, dim=1) @ torch.nn.functional.normalize(bags, dim=1).T
        flat = torch.zeros(len(chunk), n)  # all tied: the expectation of a random order
        for k in ks:
            for name, scores, among in (("model_cold", model_scores, cold & unseen), ("content_cold", content,
                                        cold & unseen), ("random_cold", flat, cold & unseen),
                                        ("model_all", model_scores, unseen)):
                hr, ndcg = expected_hits(scores, targets, among, k)
                sums[f"{name}_hr@{k}"] += float(hr.sum())
                sums[f"{name}_ndcg@{k}"] += float(ndcg.sum())
    return {name: value / len(test) for name, value in sums.items()} | {"catalogue": n - 1, "cases": len(test)}


def ranked_hits(items: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, HR and NDCG of `targets` (B,) in the ranked lists `items` (B, K)."""
    hit = items == targets[:, None]
    position = hit.float().argmax(1)  # 0-based rank where hit
    found = hit.any(1)
    return found.float(), torch.where(found, 1.0 / torch.log2(position.float() + 2.0), 0.0)


@torch.inference_mode()
def evaluate_slots(rec: Recommender, cold_cases: list[tuple[list[str], str]], warm_cases: list[tuple[list[str], str]],
                   slots: Sequence[int], ks: Sequence[int], batch_size: int) -> dict[str, float]:
    """HR / NDCG of cold and of warm targets in the top K with C cold slots (C = 0 too, for the warm cost)."""
    model, index = rec.model, rec.vocab.index
    out: dict[str, float] = {}
    for kind, cases_ in (("cold", cold_cases), ("warm", warm_cases)):
        cases_ = [(h, t) for h, t in cases_ if any(i in index for i in h) and t in index]
        for c, k in ((c, k) for c in ([0, *slots] if kind == "warm" else slots) for k in ks):
            if c > k:
                continue
            hr = ndcg = 0.0
            for start in range(0, len(cases_), batch_size):
                chunk = cases_[start:start + batch_size]
                ids = [[index[i] for i in history if i in index] for history, _ in chunk]
                top = rank(model, left_pad(ids, model.max_len), right_pad(ids), RankingOptions(top_k=k, cold_slots=c))
                h, g = ranked_hits(top.items, torch.tensor([index[t] for _, t in chunk]))
                hr, ndcg = hr + float(h.sum()), ndcg + float(g.sum())
            out[f"slots{c}_{kind}_hr@{k}"], out[f"slots{c}_{kind}_ndcg@{k}"] = hr / len(cases_), ndcg / len(cases_)
        out[f"{kind}_cases"] = len(cases_)
    return out


def warm_test_cases(warm_log: Path) -> list[tuple[list[str], str]]:
    """Each warm-log user's last item after the rest (the fit's test split: leave-one-out)."""
    histories = read_interactions(str(warm_log), "sasrec").items
    return [(list(items[:-1]), items[-1]) for items in histories.values() if len(items) >= 3]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="the streamrec fit config (its data.path is replaced)")
    p.add_argument("--log", required=True, help="the full interaction log")
    p.add_argument("--format", default="auto", help="the log's format (read_interactions)")
    p.add_argument("--features", required=True, help="the items file with the feature columns")
    p.add_argument("--columns", nargs="+", required=True, help="its categorical columns, e.g. genres")
    p.add_argument("--holdout", type=float, default=0.1, help="fraction of the items with features held out")
    p.add_argument("--seed", type=int, default=0, help="which items are held out")
    p.add_argument("--ks", type=int, nargs="+", default=[10, 20])
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--out", required=True, help="folder for the warm log and the run")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--fit-args", default="", type=shlex.split, help="more arguments for streamrec fit, one string")
    p.add_argument("--cold-slots", type=int, nargs="*", default=[1, 2],
                   help="also rank the whole catalogue with this many of the top K kept for cold items")
    args = p.parse_args(argv)
    if not 0 < args.holdout < 1:
        p.error(f"--holdout must be in (0, 1), got {args.holdout}")
    if min(args.ks) < 1:
        p.error(f"--ks must be >= 1, got {args.ks}")
    if args.cold_slots and min(args.cold_slots) < 1:
        p.error(f"--cold-slots must be >= 1, got {args.cold_slots}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    console = Console()
    histories = {u: list(items) for u, items in read_interactions(args.log, args.format).items.items()}
    features = read_item_features(args.features, args.columns)
    logged = {item for items in histories.values() for item in items}
    held = hold_out({i: f for i, f in features.items() if i in logged}, args.holdout, args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    warm_log = out / "warm_log.txt"
    if not warm_log.exists():
        write_warm_log(histories, held, warm_log)
    best = fit(args, warm_log, out / "run")
    test = cases(histories, held)
    if not test:
        sys.exit(f"error: {args.log}: no user has a held-out item after a first item; raise --holdout")
    rec = Recommender.load(best)  # once, for both evaluations
    figures = evaluate(rec, best, test, held, args.ks, args.batch_size) | {"held_out_items": len(held)}
    if args.cold_slots:
        figures |= evaluate_slots(rec, test, warm_test_cases(warm_log), args.cold_slots, args.ks, args.batch_size)
    labels = [("model, among held-out items", "model_cold"), ("content baseline, among held-out items",
              "content_cold"), ("random order, among held-out items", "random_cold"),
              ("model, whole catalogue", "model_all")]
    labels += [(f"model, whole catalogue, {c} cold slot(s)", f"slots{c}_cold") for c in args.cold_slots]
    labels += [(f"warm targets, {c} cold slot(s)", f"slots{c}_warm") for c in ([0, *args.cold_slots]
                                                                                if args.cold_slots else [])]
    rows = []
    for label, prefix in labels:
        rows.append([label, *(f"{figures.get(f'{prefix}_{m}@{k}', float('nan')):.4f}" for k in args.ks
                              for m in ("hr", "ndcg"))])
    print_table(console, f"{figures['cases']} users, {len(held)} held-out items of {figures['catalogue']} ({args.log})",
                ["ranking", *(f"{m}@{k}" for k in args.ks for m in ("HR", "NDCG"))], rows)
    if args.json:
        write_json(args.json, figures)


if __name__ == "__main__":
    main()
