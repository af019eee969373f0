"""onnxruntime against our PyTorch scoring: the same users, the same batches, in one run.

The model is exported with `streamrec.export.write_onnx` (the graph `python -m streamrec.export --format
onnx` writes) and both sides score every user of an interaction log: all N+1 item scores after each
history, left-padded to max_len, in batches of users of similar history length (as `Recommender.recommend`
batches them). Ours (`StreamRecModel.recommend_scores`) skips the all-padding columns of a batch
(`trim_padding`); the exported graph keeps them (a data-dependent cut cannot be exported). Rounds
alternate ours / onnxruntime (`_common.interleave`); the speedup is the median per-round ratio
ours / onnxruntime (> 1: onnxruntime faster). Parity over all users: the largest score difference and
the share of users whose top-10 lists are identical.

    python benchmarks/streamrec_export.py                        # demo sizes, random weights, demo data
    python benchmarks/streamrec_export.py --ckpt runs/streamrec_demo/checkpoints/best.ckpt --json out.json

Without --ckpt the model has the sizes of configs/streamrec/demo.yaml (d_model 64, 2 layers, 2 heads,
d_ff 128, max_len 50) and random weights: speed does not depend on training.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import interleave, median_ratio, write_json  # noqa: E402

from streamrec.data.readers import read_interactions  # noqa: E402
from streamrec.data.vocab import ItemVocab  # noqa: E402
from streamrec.model.network import PAD_ID, StreamRecModel  # noqa: E402
from streamrec.ranking.batch import encode_history, left_pad, length_batches  # noqa: E402


def load_model(ckpt: str | None, items: list[str]) -> tuple[StreamRecModel, ItemVocab]:
    if ckpt:
        from streamrec import Recommender

        rec = Recommender.load(ckpt)
        return rec.model, rec.vocab
    torch.manual_seed(0)
    vocab = ItemVocab.build(items)
    model = StreamRecModel(vocab.num_items, d_model=64, n_heads=2, n_layers=2, d_ff=128, max_len=50)
    return model.eval(), vocab


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", help="a StreamRec checkpoint (default: demo sizes, random weights)")
    p.add_argument("--input", default="data/streamrec_demo/interactions.csv", help="interaction log")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--threads", type=int, default=2, help="torch and onnxruntime intra-op threads")
    p.add_argument("--budget", type=float, default=20.0, help="seconds of timed rounds (at least 3 rounds)")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args()

    import onnxruntime as ort

    from streamrec.export import write_onnx

    torch.set_num_threads(args.threads)
    log = read_interactions(args.input).items
    model, vocab = load_model(args.ckpt, [i for h in log.values() for i in h])
    histories = [h for h in (encode_history(items, vocab)[0] for items in log.values()) if h]
    batches = [left_pad([histories[i] for i in rows], model.max_len)
               for rows in length_batches([len(h) for h in histories], args.batch_size)]

    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        write_onnx(model, Path(tmp) / "model.onnx")
        export_s = time.perf_counter() - start
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = args.threads, 1
        session = ort.InferenceSession(str(Path(tmp) / "model.onnx"), options, providers=["CPUExecutionProvider"])

    def ours() -> list[torch.Tensor]:
        return [model.recommend_scores(b) for b in batches]

    def onnx() -> list[torch.Tensor]:
        return [torch.from_numpy(session.run(["scores"], {"items": b.numpy()})[0]) for b in batches]

    a, b = ours(), onnx()  # warm-up, and the parity check
    max_diff = max(float((x[:, 1:] - y[:, 1:]).abs().max()) for x, y in zip(a, b, strict=True))
    same_top10 = sum(int((x.topk(10).indices == y.topk(10).indices).all(1).sum()) for x, y in zip(a, b, strict=True))
    start = time.perf_counter()
    ours(), onnx()
    repeats = max(3, int(args.budget / (time.perf_counter() - start)))
    times = interleave({"ours": ours, "onnxruntime": onnx}, repeats)
    ms = {k: 1000 * sorted(v)[len(v) // 2] for k, v in times.items()}
    figures = {
        "users": len(histories), "items": model.num_items, "max_len": model.max_len,
        "batch_size": args.batch_size, "threads": args.threads, "rounds": repeats,
        "ours_ms": round(ms["ours"], 1), "onnxruntime_ms": round(ms["onnxruntime"], 1),
        "speedup_onnxruntime": round(median_ratio(times["ours"], times["onnxruntime"]), 3),
        "max_abs_diff": max_diff, "same_top10_share": round(same_top10 / len(histories), 4),
        "export_s": round(export_s, 1), "pad_share": round(sum(float((x == PAD_ID).float().mean())
                                                             for x in batches) / len(batches), 3),
    }
    for name, value in figures.items():
        print(f"{name:>22}: {value}")
    if args.json:
        write_json(args.json, figures)


if __name__ == "__main__":
    main()
