"""benchmarks/streamrec_cold_items.py: its tie-aware metrics against sorting every tie order, and a tiny run."""

import itertools
import math

import pytest
import torch


def _by_every_order(scores: list[float], target: int, candidates: list[int], k: int) -> tuple[float, float]:
    """HR@k and NDCG@k averaged over every order of the candidates, each order breaking the ties of a sort."""
    hr = ndcg = 0.0
    orders = list(itertools.permutations([*candidates, target]))
    for order in orders:
        ranked = sorted(order, key=lambda item: (-scores[item], order.index(item)))
        rank = ranked.index(target) + 1
        hr += rank <= k
        ndcg += 1 / math.log2(rank + 1) if rank <= k else 0.0
    return hr / len(orders), ndcg / len(orders)


def test_expected_hits_equal_the_average_over_every_tie_order(benchmark_module) -> None:
    expected_hits = benchmark_module("streamrec_cold_items.py").expected_hits
    generator = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 3, (40, 7), generator=generator).float()  # many ties
    targets = torch.randint(1, 7, (40,), generator=generator)
    among = torch.rand(40, 7, generator=generator) < 0.7
    among[:, 0] = False
    for k in (1, 2, 3):
        hr, ndcg = expected_hits(scores, targets, among, k)
        for row in range(40):
            t = int(targets[row])
            candidates = [i for i in range(7) if among[row, i] and i != t]
            want = _by_every_order(scores[row].tolist(), t, candidates, k)
            assert (float(hr[row]), float(ndcg[row])) == pytest.approx(want, abs=1e-6), (row, k)


@pytest.mark.slow
def test_cold_items_benchmark_trains_and_ranks_held_out_items(run_benchmark, benchmark_refuses, data_script,
                                                             tmp_path) -> None:
    demo = data_script("make_streamrec_demo")
    log = demo.write_csv(demo.generate(users=120, items=60, seed=1, min_len=5, max_len=15), tmp_path / "log.csv")
    items = demo.write_catalogue(demo.make_catalogue(items=60, seed=1), tmp_path / "items.csv")
    args = ("--config", "configs/streamrec/demo.yaml", "--log", log, "--features", items, "--columns", "genre",
            "--holdout", "0.2", "--out", tmp_path / "out",
            "--fit-args", "--trainer.max_epochs 1 --trainer.enable_progress_bar false --data.max_len 8")
    figures = run_benchmark("streamrec_cold_items.py", *args, timeout=300).figures
    assert figures["held_out_items"] == 12 and figures["catalogue"] == 60 and figures["cases"] > 0
    for name, value in figures.items():
        if "@" in name:
            assert 0.0 <= value <= 1.0, name
    # At most ~12 unseen held-out items: a random order puts the target in the top 20 always.
    assert figures["random_cold_hr@20"] == 1.0
    assert figures["model_all_hr@10"] <= figures["model_cold_hr@10"]  # more competitors, never a better rank
    assert figures["warm_cases"] > 0 and {"slots0_warm_ndcg@10", "slots2_warm_ndcg@10", "slots1_cold_hr@20"} <= set(
        figures)
    assert (tmp_path / "out" / "run" / "fit.done").exists()
    assert "--holdout must be in (0, 1)" in benchmark_refuses("streamrec_cold_items.py", *args[:8], "--holdout", "0",
                                                              "--out", tmp_path / "x")
