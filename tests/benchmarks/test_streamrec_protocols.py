"""benchmarks/streamrec_protocols.py against each protocol and a cold-item slice, written out per case in Python."""

import json
import math

import lightning as L
import pytest
import torch

from streamrec.api import Recommender
from streamrec.data.datamodule import StreamRecDataModule
from streamrec.data.splits import leave_one_out_split
from streamrec.model.module import StreamRecModule


def _rank(scores: list[float], target: int, candidates: list[int]) -> int:
    """0-based: candidates (the target aside) scoring at least the target's score."""
    return sum(1 for i in candidates if i != target and scores[i] >= scores[target])


def _rank_bounds(scores: list[float], target: int) -> tuple[int, int]:
    """0-based ranks of the target with ties broken for it and against it."""
    above = sum(1 for i, s in enumerate(scores) if i != target and s > scores[target])
    return above, above + sum(1 for i, s in enumerate(scores) if i != target and s == scores[target])


def _naive(ckpt, log, k: int) -> dict[str, float]:
    model = Recommender.load(ckpt).model
    data = StreamRecDataModule(str(log), max_len=8)
    data.setup("test")
    sequences = {case.user: list(case.items) for case in data.splits.test}
    split = leave_one_out_split(sequences)
    known = {i for history in split.train.values() for i in history} | {c.target for c in split.valid}
    n = model.item_vectors.shape[0]  # N + 1 rows, 0 = padding
    totals = {p: [0.0, 0.0] for p in ("ours", "keep", "zero", "all", "known")}
    counted = {"known": 0, "zero_in_top10": 0}
    for case in data.splits.test:
        history, target = list(case.history), case.target
        inputs = torch.tensor([[0] * (8 - len(history[-8:])) + history[-8:]])
        scores = model.recommend_scores(inputs)[0].tolist()
        seen = set(history)
        everyone = range(1, n)
        counted["zero_in_top10"] += sum(1 for i in everyone if i not in seen and scores[i] > 0) < 10
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
            for p in totals for j, m in enumerate(("hr", "ndcg"))} | {"zero_in_top10": counted["zero_in_top10"] / cases}


@pytest.mark.slow
def test_every_protocol_equals_the_per_case_reference(run_benchmark, benchmark_refuses, tiny_ckpt, tiny_log) -> None:
    figures = run_benchmark("streamrec_protocols.py", "--ckpt", tiny_ckpt, "--ks", "10", "3",
                            in_process=True).figures
    for k in (10, 3):
        for name, want in _naive(tiny_ckpt, tiny_log, k).items():
            assert figures[name] == pytest.approx(want, abs=1e-6), name
    assert figures["repeat_targets"] > 0  # the demo log re-watches: the protocols differ on it
    # S3's own code breaks the ties among the zeros that `zero` counts against the target: never below it.
    assert figures["s3code_ndcg@10"] >= figures["zero_ndcg@10"] and figures["s3code_hr@3"] >= figures["zero_hr@3"]
    assert figures["ours_hr@10"] >= figures["all_hr@10"]
    assert "must be >= 1" in benchmark_refuses("streamrec_protocols.py", "--ckpt", tiny_ckpt, "--ks", "0")
    # Two copies of one model: the mean of one softmax ranks as its scores do (the seen-scored-0 protocol aside).
    twice = run_benchmark("streamrec_protocols.py", "--ckpt", tiny_ckpt, tiny_ckpt, "--ks", "10",
                          in_process=True).figures
    for name in ("ours_ndcg@10", "keep_ndcg@10", "all_hr@10", "known_ndcg@10"):
        assert twice[name] == pytest.approx(figures[name], abs=1e-6), name


def test_s3code_ranks_as_its_numpy_code_within_the_tie_bounds(benchmark_module) -> None:
    protocols = benchmark_module("streamrec_protocols")
    # By hand: item 2, seen and the target, is scored 0; only item 3 (3.0) stays above it; with 10 added to every
    # score, items 1, 3, 4 (9, 13, 9.5) all do.
    scores = torch.tensor([[float("-inf"), -1.0, -2.0, 3.0, -0.5]])
    seen, target = torch.tensor([[False, False, True, False, False]]), torch.tensor([2])
    assert protocols.s3code_ranks(scores, seen, target, 3).tolist() == [1.0]
    assert protocols.s3code_ranks(scores + 10, seen, target, 3).tolist() == [math.inf]  # rank 3: off a list of 3
    padded = seen.clone()
    padded[0, 0] = True  # what seen_mask makes of a left-padded history: padding stays unranked, not scored 0
    assert protocols.s3code_ranks(scores - 10, padded, torch.tensor([3]), 3).tolist() == [1.0]  # below item 2 only
    shifted = protocols.ProtocolMetrics("s3code", [4], shift=10.0)
    shifted.update(scores, target, torch.tensor([[2]]))
    assert shifted.compute()["ndcg@4"] == pytest.approx(1 / math.log2(3 + 2))
    # Random scores with many seen items tied at 0: each rank lies between the ties broken for and against it.
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(64, 40, generator=gen)
    scores[:, 0] = float("-inf")
    seen = torch.rand(64, 40, generator=gen) < 0.3
    seen[:, 0] = False
    targets = torch.randint(1, 40, (64,), generator=gen)
    ranks = protocols.s3code_ranks(scores, seen, targets, 20)
    assert seen[torch.arange(64), targets].sum() > 10  # repeats, tied with the other seen items
    for row, rank in enumerate(ranks.tolist()):
        zeroed = scores[row].masked_fill(seen[row], 0.0).tolist()
        low, high = _rank_bounds(zeroed, int(targets[row]))
        assert low <= rank <= high if rank < 20 else high >= 20  # off the list only if ties could push it off


@pytest.mark.slow
def test_a_cold_slice_ranks_as_the_per_case_reference(run_benchmark, data_script, tmp_path) -> None:
    # A log whose held-out items the model meets only through their features (each item its own feature, so no
    # two items tie), trained for one epoch; each case ranked by hand among the shelf and the catalogue.
    held = {"i3", "i7", "i11"}
    log = {f"u{u}": [f"i{(u * 5 + t) % 14}" for t in range(6)] for u in range(30)}
    warm, cases = data_script("hold_out_items").hold_out(log, held)
    (tmp_path / "warm.txt").write_text("".join(f"{u} {' '.join(s)}\n" for u, s in warm.items()))
    (tmp_path / "items.csv").write_text("item_id,genres\n" + "".join(f"i{k},f{k}|g{k % 3}\n" for k in range(14)))
    (tmp_path / "cold.json").write_text(json.dumps({"held_out": sorted(held), "cases": cases}))
    L.seed_everything(0, verbose=False)
    data = StreamRecDataModule(str(tmp_path / "warm.txt"), max_len=6, batch_size=8,
                               item_features=str(tmp_path / "items.csv"), feature_columns=["genres"])
    module = StreamRecModule(data.num_items, d_model=8, n_heads=2, n_layers=1, d_ff=16, max_len=6,
                             num_features=data.num_features, features_per_item=data.features_per_item)
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", devices=1)
    trainer.fit(module, data)
    trainer.save_checkpoint(tmp_path / "cold.ckpt")
    figures = run_benchmark("streamrec_protocols.py", "--ckpt", tmp_path / "cold.ckpt", "--cold",
                            tmp_path / "cold.json", "--ks", "10", "2", in_process=True).figures

    rec = Recommender.load(tmp_path / "cold.ckpt")
    shelf = [rec.vocab.index[i] for i in held]
    ranks = {"shelf": [], "catalogue": []}
    for case in cases:
        history = [rec.vocab.index[i] for i in case["history"]][-6:]
        scores = rec.model.recommend_scores(torch.tensor([[0] * (6 - len(history)) + history]))[0].tolist()
        target = rec.vocab.index[case["target"]]
        ranks["shelf"].append(_rank(scores, target, shelf))
        unseen = [i for i in range(1, len(scores)) if i not in history]
        ranks["catalogue"].append(_rank(scores, target, unseen))
    assert figures["cases"] == len(cases) > 5 and figures["held_out"] == 3
    for k in (10, 2):
        for name, found in ranks.items():
            assert figures[f"{name}_hr@{k}"] == pytest.approx(sum(r < k for r in found) / len(cases)), (name, k)
            assert figures[f"{name}_ndcg@{k}"] == pytest.approx(
                sum(1 / math.log2(r + 2) for r in found if r < k) / len(cases)), (name, k)
    assert figures["random_hr@10"] == 1.0 and figures["random_hr@2"] == pytest.approx(2 / 3)
    assert figures["random_ndcg@2"] == pytest.approx((1 + 1 / math.log2(3)) / 3)
