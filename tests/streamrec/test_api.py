"""The Python API against brute force: recommendations, allow-lists, similar items, explanations, bad input."""

import runpy
from pathlib import Path

import pytest
import torch

import streamrec.data.vocab as vocab_module
from core.runtime.errors import InputError
from streamrec import Recommender
from streamrec.data.vocab import ItemVocab
from streamrec.model.network import PAD_ID
from streamrec.ranking.batch import encode_histories, encode_history
from streamrec.ranking.explain import attention_weights, occlusion_drops

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"


@pytest.fixture(scope="module")
def rec(tiny_ckpt):
    return Recommender.load(tiny_ckpt)


@torch.no_grad()
def _scores(rec, ids):
    """Every item's score after the history `ids` (model ids), recomputed in full: (N+1,)."""
    max_len = rec.model.max_len
    x = torch.tensor([[PAD_ID] * (max_len - len(ids[-max_len:])) + ids[-max_len:]])
    return rec.model.score(rec.model.encode(x)[:, -1])[0]


def _brute_force(rec, history, k, exclude_seen=True, allowed=None):
    ids = [rec.vocab.index[i] for i in history if i in rec.vocab.index]
    full = _scores(rec, ids)
    ranked = [i for i in full.argsort(descending=True).tolist() if i != PAD_ID]
    if exclude_seen:
        ranked = [i for i in ranked if i not in ids]
    if allowed is not None:
        ranked = [i for i in ranked if rec.vocab.items[i - 1] in allowed]
    return [(rec.vocab.items[i - 1], float(full[i])) for i in ranked[:k]]


def _assert_same(got, want):
    assert [item for item, _ in got] == [item for item, _ in want]
    assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-5)


@pytest.mark.parametrize("exclude_seen", [True, False])
def test_recommend_equals_brute_force_for_many_users(rec, exclude_seen):
    items = rec.vocab.items
    histories = [items[:12], [items[5], "never-seen", items[7]], [items[3], items[3], items[9]], ["nobody-knows"]]
    got = rec.recommend(histories, top_k=5, exclude_seen=exclude_seen, batch_size=2)
    assert len(got) == 4 and got.cold == [3] and got[3] == []
    assert got.unknown_items == ["never-seen", "nobody-knows"]
    for history, recs in zip(histories[:3], got, strict=False):
        _assert_same(recs, _brute_force(rec, history, 5, exclude_seen))
        if exclude_seen:
            assert not set(history) & {item for item, _ in recs}


def test_allow_list_equals_brute_force_restricted_to_it(rec):
    items = rec.vocab.items
    history = items[:6]
    allowed = [items[1], items[10], items[20], items[30], "not-an-item"]
    got = rec.recommend([history], top_k=3, items=allowed)
    _assert_same(got[0], _brute_force(rec, history, 3, allowed=set(allowed)))
    assert got.unknown_items == ["not-an-item"]
    # items[1] is seen, so only three allowed items are left: a k larger than that returns those three
    assert len(rec.recommend([history], top_k=10, items=allowed)[0]) == 3


def test_similar_items_equal_brute_force_cosine(rec):
    items = rec.vocab.items
    vectors = rec.model.item_vectors.detach()
    got = rec.similar_items([items[4], "unknown", items[0]], top_k=4)
    assert got.cold == [1] and got.unknown_items == ["unknown"] and got[1] == []
    for query, result in ((items[4], got[0]), (items[0], got[2])):
        q = rec.vocab.index[query]
        cos = torch.nn.functional.cosine_similarity(vectors[q][None], vectors[1:], dim=-1)  # (N,)
        want = [(items[j], float(cos[j])) for j in cos.argsort(descending=True).tolist() if j + 1 != q][:4]
        _assert_same(result, want)


def test_explain_reuses_the_explanation_views(rec):
    items = rec.vocab.items
    history = [items[2], "unknown", items[8], items[5], items[11]]
    why = rec.explain(history, top_k=3)
    ids = [rec.vocab.index[i] for i in history if i in rec.vocab.index]
    x = torch.tensor([[PAD_ID] * (8 - len(ids)) + ids])
    assert why.history == [items[2], items[8], items[5], items[11]] and why.unknown_items == ["unknown"]
    _assert_same(why.recommendations, rec.recommend([history], top_k=3)[0])
    assert why.attention == pytest.approx(attention_weights(rec.model, x)[0, -4:].tolist(), abs=1e-6)
    recommended = torch.tensor([[rec.vocab.index[i] for i, _ in why.recommendations]])
    assert torch.allclose(why.drops, occlusion_drops(rec.model, x, recommended)[0, :, -4:], atol=1e-6)
    assert [b[1] for b in why.because] == [why.history[int(d.argmax())] for d in why.drops]
    with pytest.raises(InputError, match="nothing to explain"):
        rec.explain(["unknown"])


def test_the_old_keyword_k_is_refused(rec):
    history = rec.vocab.items[:6]
    for method, query in ((rec.recommend, [history]), (rec.similar_items, history[:2]), (rec.explain, history)):
        with pytest.raises(TypeError, match="unexpected keyword argument 'k'"):
            method(query, k=3)


def _hash_by_length(s: object) -> int:
    """A hash under which ids of one length collide: the vocabulary tells them apart by comparing them."""
    return 0 if s is None else len(s) % 3


@pytest.mark.parametrize("hash_fn", [hash, _hash_by_length])
def test_encode_histories_equals_a_lookup_per_item(monkeypatch, hash_fn):
    monkeypatch.setattr(vocab_module, "_hash", hash_fn)
    vocab = ItemVocab(["a", "bb", "cc", "ddd", "e"])
    histories = [["cc", "x", "a", "x", "bb"], [], ["yy"], ["ddd", None, 7, b"a", "\ud800"], ("e", "ee"), ["a"]]
    known, unknown = encode_histories(histories, vocab)
    assert known == [[vocab.index[i] for i in h if i in vocab.index] for h in histories]  # the per-item form
    assert unknown == [[i for i in h if i not in vocab.index] for h in histories]
    assert known == [[3, 1, 2], [], [], [4], [5], [1]] and unknown[0] == ["x", "x"] and unknown[3][1:3] == [7, b"a"]
    assert [encode_history(h, vocab) for h in histories] == list(zip(known, unknown, strict=True))
    assert encode_histories([], vocab) == ([], [])
    with pytest.raises(TypeError, match="unhashable"):  # as `[] in vocab.index` raises
        encode_history(["a", []], vocab)


@pytest.mark.parametrize("call", [
    lambda r: r.recommend(["a", "b"]),  # one history, not a list of histories
    lambda r: r.recommend([["a"]], top_k=0),
    lambda r: r.similar_items("a"),
    lambda r: r.recommend([["a"]], items="a"),
])
def test_misuse_is_a_one_line_input_error(rec, call):
    with pytest.raises(InputError) as err:
        call(rec)
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_the_documented_example_runs(tiny_ckpt, tmp_path, capsys):
    """docs/api.md's StreamRec example, on the tiny checkpoint, run as a script (in this process: a second
    interpreter would only import torch again)."""
    section = DOC.read_text(encoding="utf-8").split("## StreamRec from Python\n", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    script = tmp_path / "example.py"
    script.write_text(code.replace("runs/streamrec_demo/checkpoints/best.ckpt", str(tiny_ckpt)), encoding="utf-8")
    runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr().out
    assert "['not-in-the-catalogue', 'nobody-knows']" in out and "[2]" in out
