"""How often does attention point at the history item that actually drives a recommendation?

For users of an interaction log, take each top-K recommendation of a trained StreamRec
checkpoint, find the history item with the most rolled-out attention from the recommending
position, and the item whose removal lowers that recommendation's score most (occlusion).
Reports the agreement rate, and a chance baseline: the agreement a uniformly random
history position would have (1 / history length, averaged).

    python benchmarks/streamrec_explain.py --ckpt runs/streamrec_demo/checkpoints/best.ckpt \\
        --input data/streamrec_demo/interactions.csv --users 500 --json runs/explain_demo.json
    python benchmarks/streamrec_explain.py --ckpt runs/streamrec_ml1m/checkpoints/best.ckpt \\
        --input ../shared/data/ml-1m/ml-1m.sasrec-prefix.txt --format sasrec --users 500
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from streamrec.api import Recommender
from streamrec.data.readers import read_interactions
from streamrec.model.network import PAD_ID
from streamrec.ranking.batch import RankingOptions, encode_history, recommend
from streamrec.ranking.explain import agreement, attention_weights, occlusion_drops


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True)
    p.add_argument("--input", required=True)
    p.add_argument("--format", default="auto")
    p.add_argument("--users", type=int, default=500, help="first N users of the file")
    p.add_argument("--top-k", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args()

    rec = Recommender.load(args.ckpt)
    model, vocab = rec.model, rec.vocab
    histories = read_interactions(args.input, args.format).items
    users = list(histories)[: args.users]
    start = time.perf_counter()
    matches = pairs = 0
    chance = 0.0
    for i in range(0, len(users), args.batch_size):
        ids = [encode_history(histories[u], vocab)[0] for u in users[i : i + args.batch_size]]
        ids = [h for h in ids if h]
        inputs, items, _ = recommend(model, ids, RankingOptions(top_k=args.top_k))
        att = attention_weights(model, inputs)
        drops = occlusion_drops(model, inputs, items.clamp_min(1))
        n = items.numel()
        matches += agreement(att, drops, inputs) * n
        pairs += n
        lengths = (inputs != PAD_ID).sum(-1).float()
        chance += float((1.0 / lengths).sum()) * args.top_k
    seconds = time.perf_counter() - start
    figures = {
        "users": len(users), "pairs": pairs, "agreement": round(matches / pairs, 4),
        "chance": round(chance / pairs, 4), "seconds": round(seconds, 1), "top_k": args.top_k,
    }
    print(f"checkpoint {args.ckpt}; input {args.input}; {len(users)} users x top-{args.top_k}; "
          f"history window {model.max_len}")
    print(f"{'measure':<44}{'value':>10}")
    print(f"{'top-attended item = top-occlusion item':<44}{figures['agreement']:>10.3f}")
    print(f"{'chance (random history position)':<44}{figures['chance']:>10.3f}")
    print(f"{'seconds':<44}{seconds:>10.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    with torch.inference_mode():
        main()
