"""benchmarks/streamrec_protocols.py against each protocol written out per case in plain Python."""

import math

import pytest
import torch

from streamrec.api import Recommender
from streamrec.data.datamodule import StreamRecDataModule
from streamrec.data.splits import leave_one_out_split


def _rank(scores: list[float], target: int, candidates: list[int]) -> int:
    """0-based: candidates (the target aside) scoring at least the target's score."""
    return sum(1 for i in candidates if i != target and scores[i] >= scores[target])


def _naive(ckpt, log, k: int) -> dict[str, float]:
    model = Recommender.load(ckpt).model
    data = StreamRecDataModule(str(log), max_len=8)
    data.setup("test")
    sequences = {case.user: list(case.items) for case in data.splits.test}
    split = leave_one_out_split(sequences)
    known = {i for history in split.train.values() for i in history} | {c.target for c in split.valid}
    n = model.item_vectors.shape[0]  # N + 1 rows, 0 = padding
    totals = {p: [0.0, 0.0] for p in ("ours", "keep", "zero", "all", "known")}
    counted = {"known": 0}
    for case in data.splits.test:
        history, target = list(case.history), case.target
        inputs = torch.tensor([[0] * (8 - len(history[-8:])) + history[-8:]])
        scores = model.recommend_scores(inputs)[0].tolist()
        seen = set(history)
        everyone = range(1, n)
        ranks = {
            "ours": _rank(scores, target, [i for i in everyone if i not in seen]),
            "keep": _rank(scores, target, list(everyone)),
            "zero": _rank([0.0 if i in seen else s for i, s in enumerate(scores)], target, list(everyone)),
            "all": math.inf if target in seen else _rank(scores, target, [i for i in everyone if i not in seen]),
        }
        if target in known:
            ranks["known"] = ranks["ours"]
            counted["known"] += 1
        for name, rank in ranks.items():
            if rank < k:
                totals[name][0] += 1
                totals[name][1] += 1 / math.log2(rank + 2)
    cases = len(data.splits.test)
    return {f"{p}_{m}@{k}": totals[p][j] / (counted["known"] if p == "known" else cases)
            for p in totals for j, m in enumerate(("hr", "ndcg"))}


@pytest.mark.slow
def test_every_protocol_equals_the_per_case_reference(run_benchmark, benchmark_refuses, tiny_ckpt, tiny_log) -> None:
    figures = run_benchmark("streamrec_protocols.py", "--ckpt", tiny_ckpt, "--ks", "10", "3",
                            in_process=True).figures
    for k in (10, 3):
        for name, want in _naive(tiny_ckpt, tiny_log, k).items():
            assert figures[name] == pytest.approx(want, abs=1e-6), name
    assert figures["repeat_targets"] > 0  # the demo log re-watches: the protocols differ on it
    assert figures["ours_hr@10"] >= figures["all_hr@10"]
    assert "must be >= 1" in benchmark_refuses("streamrec_protocols.py", "--ckpt", tiny_ckpt, "--ks", "0")
    # Two copies of one model: the mean of one softmax ranks as its scores do (the seen-scored-0 protocol aside).
    twice = run_benchmark("streamrec_protocols.py", "--ckpt", tiny_ckpt, tiny_ckpt, "--ks", "10",
                          in_process=True).figures
    for name in ("ours_ndcg@10", "keep_ndcg@10", "all_hr@10", "known_ndcg@10"):
        assert twice[name] == pytest.approx(figures[name], abs=1e-6), name
