"""An ensemble's ranking against the mean of its members' softmax over the whole score matrix, sorted; and the API
loading several checkpoints of one catalogue as one recommender, and `python -m streamrec.score` writing its
ranking."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import torch

from core.runtime.errors import InputError
from streamrec import Recommender, score, shards
from streamrec import serve as streamrec_serve
from streamrec.model.network import BERT4Rec, SASRec
from streamrec.ranking.batch import RankingOptions, left_pad, recommend
from streamrec.ranking.ensemble import Ensemble

N, T = 37, 6


def _members(seed: int) -> list:
    torch.manual_seed(seed)
    return [SASRec(N, d_model=8, n_heads=2, n_layers=1, d_ff=16, max_len=T).eval(),
            BERT4Rec(N, d_model=12, n_heads=2, n_layers=1, d_ff=16, max_len=T).eval(),
            SASRec(N, d_model=8, n_heads=1, n_layers=2, d_ff=16, max_len=T).eval()]


def _naive(members, inputs, seen, allowed, k):
    """Mean of each member's softmax over items 1..N, masked, then a stable descending sort (lower id on ties)."""
    with torch.no_grad():
        probs = torch.stack([m.score(m.last_hidden(inputs)).softmax(-1) for m in members]).mean(0)
    probs[:, 0] = float("-inf")
    for row, items in enumerate(seen):
        probs[row, items] = float("-inf")
    if allowed is not None:
        probs[:, ~allowed] = float("-inf")
    scores, items = probs.sort(dim=1, descending=True, stable=True)
    return items[:, :k], scores[:, :k]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("chunk", [5, 64])
def test_top_k_is_the_mean_probabilitys_sorted_top(seed, chunk):
    members = _members(seed)
    generator = torch.Generator().manual_seed(seed)
    histories = [torch.randint(1, N + 1, (int(n),), generator=generator).tolist()
                 for n in torch.randint(1, 9, (5,), generator=generator)]
    allowed = (torch.rand(N + 1, generator=generator) < 0.7) if seed else None
    options = RankingOptions(top_k=8, item_chunk=chunk)
    _, items, scores = recommend(Ensemble(members), histories, options,
                                 None if allowed is None else allowed.clone())
    want_items, want_scores = _naive(members, left_pad(histories, T), histories, allowed, 8)
    filled = want_scores > float("-inf")
    assert torch.equal(items[filled], want_items[filled]) and bool((items[~filled] == 0).all())
    torch.testing.assert_close(scores[filled], want_scores[filled], rtol=1e-5, atol=1e-7)
    assert torch.allclose(Ensemble(members).recommend_scores(left_pad(histories, T))[:, 1:].sum(1), torch.ones(5))


def test_members_must_share_the_catalogue_and_max_len():
    a = SASRec(N, d_model=8, n_heads=1, n_layers=1, d_ff=16, max_len=T)
    with pytest.raises(ValueError, match="num_items"):
        Ensemble([a, SASRec(N + 1, d_model=8, n_heads=1, n_layers=1, d_ff=16, max_len=T)])
    with pytest.raises(ValueError, match="max_len"):
        Ensemble([a, SASRec(N, d_model=8, n_heads=1, n_layers=1, d_ff=16, max_len=T + 1)])
    with pytest.raises(InputError, match="fp32 only"):
        recommend(Ensemble([a, a]), [[1, 2]], RankingOptions(top_k=3, precision="bf16"))
    with pytest.raises(InputError, match="ask for 0 cold slots"):
        recommend(Ensemble([a, a]), [[1, 2]], RankingOptions(top_k=3, cold_slots=1))


def _perturbed(ckpt, out, scale: float, seed: int):
    """A copy of `ckpt` whose weights moved by noise: another model of the same catalogue."""
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    generator = torch.Generator().manual_seed(seed)
    for value in state["state_dict"].values():
        if value.is_floating_point():
            value.add_(scale * torch.randn(value.shape, generator=generator))
    torch.save(state, out)
    return out


def test_the_api_loads_several_checkpoints_as_one_ensemble(tiny_ckpt, tmp_path):
    paths = [tiny_ckpt, *(_perturbed(tiny_ckpt, tmp_path / f"{seed}.ckpt", 0.3, seed) for seed in (1, 2))]
    singles = [Recommender.load(p) for p in paths]
    ensemble = Recommender.load(paths)
    assert isinstance(ensemble.model, Ensemble) and len(ensemble.model.members) == 3
    histories = [singles[0].vocab.items[:4], singles[0].vocab.items[5:7]]
    got = ensemble.recommend(histories, top_k=5)
    ids = [singles[0].encode(h)[0] for h in histories]
    want_items, want_scores = _naive([s.model for s in singles], left_pad(ids, singles[0].model.max_len), ids, None, 5)
    assert [[i for i, _ in row] for row in got] == [singles[0].vocab.decode(row) for row in want_items]
    assert [s for row in got for _, s in row] == pytest.approx(want_scores.flatten().tolist(), rel=1e-5)
    assert Recommender.load([tiny_ckpt]).model.__class__ is singles[0].model.__class__
    explained = ensemble.explain(histories[0], top_k=3)  # the first member's attention, the ensemble's top 3
    assert [i for i, _ in explained.recommendations] == [i for i, _ in got[0][:3]]


def test_an_ensemble_of_other_catalogues_is_a_one_line_error(tiny_ckpt, tmp_path):
    state = torch.load(tiny_ckpt, map_location="cpu", weights_only=True)
    vocab_key = next(k for k in state if "vocab" in k.lower())
    state[vocab_key] = {**state[vocab_key], "items": list(reversed(state[vocab_key]["items"]))}
    torch.save(state, tmp_path / "other.ckpt")
    with pytest.raises(InputError, match=r"other\.ckpt: its item vocabulary differs from .*tiny\.ckpt's"):
        Recommender.load([tiny_ckpt, tmp_path / "other.ckpt"])


def test_score_with_several_checkpoints_writes_the_ensembles_ranking(tiny_ckpt, tiny_log, tmp_path, exit_line):
    paths = [tiny_ckpt, _perturbed(tiny_ckpt, tmp_path / "b.ckpt", 0.3, 1)]
    out = tmp_path / "recs.parquet"
    score.main(["--ckpt", *map(str, paths), "--input", str(tiny_log), "--output", str(out), "--top-k", "4",
                "--explain"])
    rows = pq.read_table(out).to_pylist()
    rec = Recommender.load(paths)
    histories = rec.read_log(tiny_log).items
    users = list(histories)
    want = rec.recommend([histories[u] for u in users], top_k=4)
    got: dict[str, list] = {}
    for r in rows:
        got.setdefault(r["user_id"], []).append((r["rank"], r["item_id"], r["score"]))
    assert list(got) == users
    for user, ranked in zip(users, want, strict=True):
        assert [(k, i) for k, i, _ in got[user]] == [(k + 1, i) for k, (i, _) in enumerate(ranked)]
        assert [s for *_, s in got[user]] == pytest.approx([s for _, s in ranked], rel=1e-5)
    provenance = shards.read_provenance(out)
    assert provenance["precision"] == "fp32"
    assert provenance["checkpoint_sha256"] == shards.checkpoints_sha256(paths) != shards.checkpoint_sha256(paths[0])
    line = exit_line(score.main, ["--ckpt", *map(str, paths), "--input", str(tiny_log), "--output",
                                  str(tmp_path / "b.parquet"), "--precision", "bf16"])
    assert line.startswith("error: --precision bf16: an ensemble (several --ckpt)")


def test_the_server_answers_with_the_ensembles_ranking(tiny_ckpt, tmp_path):
    paths = [str(tiny_ckpt), str(_perturbed(tiny_ckpt, tmp_path / "b.ckpt", 0.3, 1))]
    assert streamrec_serve.build_parser().parse_args(["--ckpt", *paths]).ckpt == paths
    api = streamrec_serve.StreamRecAPI(paths)
    api.load("cpu")
    history = api.rec.vocab.items[:3]
    request = {"history": history, "top_k": 3, "exclude_seen": True, "items": None, "explain": False, "cold_slots": 0}
    answer = api.predict_many([request])[0]
    want = Recommender.load(paths).recommend([history], top_k=3)[0]
    assert [(a["item_id"], a["score"]) for a in answer["items"]] == want
    assert want != Recommender.load(paths[0]).recommend([history], top_k=3)[0]  # scores are probabilities
