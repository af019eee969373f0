"""Item features in the network: id + mean of feature vectors, cold items by features alone, checkpoints carry them;
`features: attention` (DIF-SR): the features' mean as a side stream of attention logits, ids alone scored."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from core.runtime.errors import InputError
from streamrec.api import Recommender
from streamrec.data.datamodule import StreamRecDataModule
from streamrec.export import write_onnx
from streamrec.model.module import StreamRecModule
from streamrec.model.network import NETWORKS, SASRec, StreamRecModel
from streamrec.model.options import ItemOptions
from streamrec.ranking.batch import RankingOptions, rank
from streamrec.score import item_table

SIZES = {"d_model": 8, "n_heads": 2, "n_layers": 1, "d_ff": 16, "max_len": 6, "dropout": 0.0}
FEATURES = torch.tensor([[0, 0], [1, 2], [2, 0], [0, 0], [3, 1]])  # item 3: none; item 4 cold
COLD = torch.tensor([False, False, False, False, True])


def _model(seed: int = 0, **kwargs) -> StreamRecModel:
    torch.manual_seed(seed)
    return SASRec(4, **SIZES, **kwargs).eval()


def test_without_features_the_model_is_unchanged():
    plain, zero = _model(), _model(num_features=0, features_per_item=0)
    assert plain.state_dict().keys() == zero.state_dict().keys()
    items = torch.tensor([[0, 1, 2, 3], [0, 0, 4, 1]])
    assert torch.equal(plain.recommend_scores(items), zero.recommend_scores(items))
    assert plain.item_vectors is plain.item_embedding.weight  # the table itself, as before


def test_item_vectors_are_id_plus_mean_of_features_and_cold_items_features_alone():
    model = _model(num_features=3, features_per_item=2)
    model.set_item_features(FEATURES, COLD)
    ids, feats = model.item_embedding.weight, model.feature_embedding.weight
    expected = torch.stack([ids[0], ids[1] + (feats[1] + feats[2]) / 2, ids[2] + feats[2], ids[3],
                            (feats[3] + feats[1]) / 2])
    torch.testing.assert_close(model.item_vectors, expected)
    inputs = torch.tensor([[1, 4]])
    torch.testing.assert_close(model._embed(inputs)[0], expected[[1, 4]] * model.item_embedding.scale)


def test_a_cold_item_is_scored_and_recommended():
    model = _model(num_features=3, features_per_item=2)
    model.set_item_features(FEATURES, COLD)
    history = torch.tensor([[0, 0, 1, 2]])
    scores = model.recommend_scores(history)
    torch.testing.assert_close(scores[0, 4], model.last_hidden(history)[0] @ model.item_vectors[4])
    allowed = torch.tensor([False, False, False, False, True])
    top = rank(model, history, None, RankingOptions(top_k=1), allowed=allowed)
    assert top.items.tolist() == [[4]] and torch.isfinite(top.scores).all()


@pytest.mark.parametrize("slots", [0, 1, 3, 5])
def test_cold_slots_hold_the_best_cold_items_among_the_best_warm_ones_by_score(slots):
    # Reference: every item scored at once, seen items removed, the top (K - slots) warm and top `slots` cold
    # picked by sorting, the two merged by score.
    torch.manual_seed(3)
    n, k = 30, 5
    model = SASRec(n, **SIZES, num_features=6, features_per_item=2).eval()
    features = torch.randint(1, 7, (n + 1, 2))
    features[0] = 0
    cold = torch.zeros(n + 1, dtype=torch.bool)
    cold[torch.randperm(n)[:8] + 1] = True
    model.set_item_features(features, cold)
    inputs = torch.tensor([[0, 0, 3, 7, 9, 12], [0, 0, 0, 0, 5, 2]])
    seen = torch.tensor([[3, 7, 9, 12], [5, 2, 0, 0]])
    got = rank(model, inputs, seen, RankingOptions(top_k=k, cold_slots=slots))
    scores = model.recommend_scores(inputs)
    for row in range(2):
        s = scores[row].clone()
        s[seen[row][seen[row] > 0]] = float("-inf")
        order = sorted(range(1, n + 1), key=lambda i: (-float(s[i]), i))  # ties: the lower id first
        warm = [i for i in order if not cold[i]][: k - slots]
        colds = [i for i in order if cold[i]][:slots]
        want = sorted(warm + colds, key=order.index)
        if not slots:  # one ranking of the whole catalogue, cold items in it
            want = order[:k]
        assert got.items[row].tolist() == want
        torch.testing.assert_close(got.scores[row], s[want])
    with pytest.raises(InputError, match="cold_slots"):
        RankingOptions(top_k=2, cold_slots=3)


def test_id_dropout_leaves_some_items_to_their_features_in_training_only():
    model = _model(num_features=3, features_per_item=2, items=ItemOptions(id_dropout=0.5))
    model.set_item_features(FEATURES, COLD)
    ids, feats = model.item_embedding.weight, model.feature_embedding.weight
    bags = torch.stack([feats[0], (feats[1] + feats[2]) / 2, feats[2], feats[0], (feats[3] + feats[1]) / 2])
    full = ids + bags
    full[4] = bags[4]  # the cold item never has its id
    torch.testing.assert_close(model.item_vectors, full)  # eval: nothing dropped
    model.train()
    torch.manual_seed(1)
    picks = torch.randint(1, 4, (400,))  # warm items, many times each
    rows = model.item_rows(picks)
    dropped = torch.isclose(rows, bags[picks]).all(-1)
    kept = torch.isclose(rows, full[picks]).all(-1)
    assert bool((dropped ^ kept).all())  # each occurrence is one or the other
    assert 0.4 < float(dropped.float().mean()) < 0.6  # 400 draws at 0.5: outside this 1 run in 10^4
    torch.testing.assert_close(model.item_rows(torch.tensor([4, 4, 4])), bags[[4, 4, 4]])


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"items": {"id_dropout": 0.3}}, "`model.items.id_dropout` needs item features"),
    ({"items": {"id_dropout": 1.0}, "num_features": 3, "features_per_item": 2},
     r"`model.items.id_dropout` must be in \[0, 1\), got 1.0"),
])
def test_id_dropout_refuses_what_it_cannot_do(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SASRec(4, **SIZES, **kwargs)


@pytest.mark.parametrize(("kwargs", "message"), [({"items": ItemOptions(tied=False)}, "`model.items.tied: true`"),
                                                 ({"features_per_item": 0}, "both be 0")])
def test_features_refuse_what_cannot_hold_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SASRec(4, **SIZES, **{"num_features": 3, "features_per_item": 2, **kwargs})


def test_rowwise_adagrad_is_refused_with_features():
    with pytest.raises(ValueError, match="rowwise_adagrad` does not work with item features"):
        StreamRecModule(4, num_features=3, features_per_item=2, objective={"loss": "sampled"},
                        optimizer={"item_optimizer": "rowwise_adagrad"})


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A one-epoch fit with features on a tiny log, its data module and checkpoint."""
    folder = tmp_path_factory.mktemp("features")
    log = "user_id,item_id,timestamp\n" + "".join(f"u{u},i{(u + t) % 6},{t}\n" for u in range(12) for t in range(5))
    (folder / "log.csv").write_text(log, encoding="utf-8")
    rows = "".join(f"i{k},g{k % 3}|h{k % 2}\n" for k in range(6))
    (folder / "items.csv").write_text(f"item_id,genres\n{rows}cold,g1|h0\n", encoding="utf-8")
    L.seed_everything(0, verbose=False)
    data = StreamRecDataModule(str(folder / "log.csv"), max_len=6, batch_size=8,
                               item_features=str(folder / "items.csv"), feature_columns=["genres"])
    module = StreamRecModule(data.num_items, **SIZES, num_features=data.num_features,
                             features_per_item=data.features_per_item)
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", devices=1)
    trainer.fit(module, data)
    trainer.save_checkpoint(folder / "features.ckpt")
    return module.eval(), data, folder / "features.ckpt"


def test_training_marks_the_cold_items(trained):
    module, data, _ = trained
    cold = data.vocab.index["cold"]
    assert module.model.cold_items.tolist() == [False] * cold + [True]
    assert torch.equal(module.model.item_features, data.item_features)


def test_a_checkpoint_with_features_loads_and_recommends_cold_items(trained):
    module, data, ckpt = trained
    rec = Recommender.load(ckpt)
    history = ["i0", "i1", "i2"]
    inputs = torch.tensor([[0, 0, 0, *data.vocab.encode(history)]])
    torch.testing.assert_close(rec.model.recommend_scores(inputs), module.model.recommend_scores(inputs))
    top = rec.recommend([history], top_k=1, items=["cold"])[0]
    assert [item for item, _ in top] == ["cold"]
    with_slot = rec.recommend([history], top_k=3, cold_slots=1)[0]
    assert len(with_slot) == 3 and "cold" in [item for item, _ in with_slot]
    mapped = Recommender.load(ckpt, mmap=True).model  # what `python -m streamrec.score` loads
    torch.testing.assert_close(item_table(mapped, ckpt, "fp32").vectors, module.model.item_vectors)


def test_server_batches_keep_each_requests_cold_slot(trained):
    # Two requests of different K with a cold slot, scored in one batch: each equals its own API call (a top 2 with
    # a cold slot is not the head of a top 5 with one).
    from streamrec.serve import StreamRecAPI, check_request, request_fields

    _, data, ckpt = trained
    api = StreamRecAPI(str(ckpt))
    api.load("cpu")
    fields = request_fields(data.num_items)
    history = ["i0", "i1", "i2"]
    requests = [check_request({"history": history, "top_k": k, "cold_slots": 1}, fields) for k in (2, 5)]
    for answer, k in zip(api.predict_many(requests), (2, 5), strict=True):
        want = api.rec.recommend([history], top_k=k, cold_slots=1)[0]
        assert [i["item_id"] for i in answer["items"]] == [item for item, _ in want]
        assert "cold" in [i["item_id"] for i in answer["items"]]


def test_batch_scoring_keeps_the_cold_slots_and_records_them(trained, tmp_path):
    import pyarrow.parquet as pq

    from streamrec import score, shards

    _, _, ckpt = trained
    log = ckpt.parent / "log.csv"
    out = tmp_path / "recs.parquet"
    score.main(["--ckpt", str(ckpt), "--input", str(log), "--output", str(out), "--top-k", "3", "--cold-slots", "1",
                "--precision", "fp32"])
    rows = pq.read_table(out).to_pylist()
    rec = Recommender.load(ckpt)
    histories: dict[str, list[str]] = {}
    for line in log.read_text().splitlines()[1:]:
        user, item, _ = line.split(",")
        histories.setdefault(user, []).append(item)
    for user, history in histories.items():
        got = [r["item_id"] for r in rows if r["user_id"] == user]
        assert got == [item for item, _ in rec.recommend([history], top_k=3, cold_slots=1)[0]]
        assert "cold" in got
    assert shards.read_provenance(out)["cold_slots"] == 1
    with pytest.raises(SystemExit):
        score.main(["--ckpt", str(ckpt), "--input", str(log), "--output", str(tmp_path / "x.csv"), "--top-k", "2",
                    "--cold-slots", "3"])


def _attention_model(**items) -> StreamRecModel:
    model = _model(num_features=3, features_per_item=2, items={"features": "attention", **items})
    model.set_item_features(FEATURES, COLD)
    return model


def test_attention_features_are_a_side_stream_of_feature_means():
    model = _attention_model(feature_width=4)
    feats = model.feature_embedding.weight  # (4, W): padding and 3 features
    assert feats.shape == (4, 4)
    want = torch.stack([(feats[1] + feats[2]) / 2, (feats[3] + feats[1]) / 2, feats[0]]) * 2.0  # x sqrt(W)
    torch.testing.assert_close(model._side(torch.tensor([[1, 4, 3]]))[0], want)
    assert model.item_vectors is model.item_embedding.weight  # scored by the ids alone (DIF-SR)


def test_attention_features_with_silent_side_projections_give_the_id_only_logits():
    model = _attention_model()
    plain = _model()
    unexpected = plain.load_state_dict(model.state_dict(), strict=False).unexpected_keys
    assert unexpected and all(k.startswith(("feature_embedding", "item_features", "cold_items")) or "side_qk" in k
                              for k in unexpected)
    histories = torch.tensor([[0, 0, 1, 2, 4, 1], [0, 0, 0, 3, 1, 2]])
    assert not torch.allclose(model.recommend_scores(histories), plain.recommend_scores(histories))  # features act
    for layer in model.encoder.layers:
        layer.self_attn.side_qk.weight.data.zero_()  # its biases start at zero
    torch.testing.assert_close(model.recommend_scores(histories), plain.recommend_scores(histories))
    torch.testing.assert_close(model.encode(histories), plain.encode(histories))  # every position, untrimmed


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"arch": "gru"}, "arch sasrec only"),
    ({"arch": "bert4rec"}, "arch sasrec only"),
    ({"num_features": 0, "features_per_item": 0}, "needs item features"),
    ({"mixing": {"attention": "window"}}, "`model.mixing.attention: full`"),
    ({"id_dropout": 0.2}, "`model.items.id_dropout`"),
    ({"features": "add", "feature_width": 4}, "`model.items.feature_width`"),
    ({"features": "sum"}, "`model.items.features` must be add, attention or stream"),
])
def test_attention_features_refuse_what_they_cannot_do(kwargs, message):
    arch, rest = kwargs.pop("arch", "sasrec"), {k: kwargs.pop(k) for k in ("num_features", "features_per_item",
                                                                           "mixing") if k in kwargs}
    sizes = {"num_features": 3, "features_per_item": 2, **rest}
    with pytest.raises(ValueError, match=message):
        NETWORKS[arch](4, **SIZES, **sizes, items={"features": "attention", **kwargs})


def test_attention_features_fit_score_and_export(tmp_path):
    folder = tmp_path
    log = "user_id,item_id,timestamp\n" + "".join(f"u{u},i{(u + t) % 6},{t}\n" for u in range(12) for t in range(5))
    (folder / "log.csv").write_text(log, encoding="utf-8")
    rows = "".join(f"i{k},g{k % 3}|h{k % 2}\n" for k in range(6))
    (folder / "items.csv").write_text(f"item_id,genres\n{rows}", encoding="utf-8")
    L.seed_everything(0, verbose=False)
    data = StreamRecDataModule(str(folder / "log.csv"), max_len=6, batch_size=8,
                               item_features=str(folder / "items.csv"), feature_columns=["genres"])
    module = StreamRecModule(data.num_items, **SIZES, num_features=data.num_features,
                             features_per_item=data.features_per_item, items={"features": "attention"})
    side = [p.detach().clone() for n, p in module.named_parameters() if "side_qk" in n or "feature_embedding" in n]
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", devices=1)
    trainer.fit(module, data)
    trained = [p for n, p in module.named_parameters() if "side_qk" in n or "feature_embedding" in n]
    assert all(not torch.equal(a, b) for a, b in zip(side, trained, strict=True))  # the side stream learns
    trainer.save_checkpoint(folder / "attention.ckpt")
    module.eval()
    rec = Recommender.load(folder / "attention.ckpt")
    history = ["i0", "i1", "i2"]
    inputs = torch.tensor([[0, 0, 0, *data.vocab.encode(history)]])
    torch.testing.assert_close(rec.model.recommend_scores(inputs), module.model.recommend_scores(inputs))
    assert len(rec.recommend([history], top_k=3)[0]) == 3
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime not installed: pip install -e '.[export]'")
    pytest.importorskip("onnxscript", reason="onnxscript not installed: pip install -e '.[export]'")
    write_onnx(module.model, folder / "model.onnx")
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    got = torch.from_numpy(session.run(["scores"], {"items": inputs.numpy()})[0])
    torch.testing.assert_close(got[:, 1:], module.model.recommend_scores(inputs)[:, 1:], atol=1e-4, rtol=0)


def test_stream_features_run_an_encoder_of_their_own_fused_before_the_scores():
    """FDSA: two plain SASRecs, one on the ids and one whose item rows are the features' means (written out by
    hand), give the two streams; the model's states are its linear fusion of them, and scores read ids alone."""
    model = _model(num_features=3, features_per_item=2, items={"features": "stream"})
    model.set_item_features(FEATURES, COLD)
    ids, feats = _model(), _model()
    ids.load_state_dict({k: v for k, v in model.state_dict().items() if k.startswith(("item_embedding", "encoder"))})
    f = model.feature_embedding.weight.detach()
    means = torch.stack([torch.zeros(8), (f[1] + f[2]) / 2, f[2], torch.zeros(8), (f[3] + f[1]) / 2])  # FEATURES
    stream = {k.removeprefix("feature_"): v for k, v in model.state_dict().items() if k.startswith("feature_encoder")}
    feats.load_state_dict({"item_embedding.embedding.weight": means, **stream})
    histories = torch.tensor([[0, 0, 1, 2, 4, 1], [0, 0, 0, 3, 1, 2]])
    want = model.fuse(torch.cat([ids.encode(histories), feats.encode(histories)], dim=-1))
    torch.testing.assert_close(model.encode(histories), want)
    assert model.item_vectors is model.item_embedding.weight
    with pytest.raises(ValueError, match="arch sasrec only"):
        NETWORKS["gru"](4, **SIZES, num_features=3, features_per_item=2, items={"features": "stream"})


def test_cold_slots_are_refused_when_ids_alone_are_scored():
    model = _attention_model().eval()
    inputs = torch.tensor([[0, 1, 2]])
    with pytest.raises(InputError, match="ask for 0 cold slots"):
        rank(model, inputs, None, RankingOptions(top_k=2, cold_slots=1))
    assert rank(model, inputs, None, RankingOptions(top_k=2)).items.shape == (1, 2)
