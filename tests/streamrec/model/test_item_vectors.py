"""Item vectors (`data.item_vectors`) as the id table's start: the file read by the log's ids and refused in one
line when bad; the started rows keep the vectors' geometry (their principal subspace, worked out with NumPy's
eigendecomposition); `fit` starts them, a resumed fit does not; data/prepare_title_vectors.py and
prepare_feature_vectors.py write the file."""

from __future__ import annotations

import lightning as L
import numpy as np
import pytest
import torch

from core.runtime.errors import InputError
from streamrec.data import vectors as vectors_module
from streamrec.data.datamodule import StreamRecDataModule
from streamrec.data.vectors import read_item_vectors, write_item_vectors
from streamrec.data.vocab import ItemVocab
from streamrec.model.module import StreamRecModule
from streamrec.model.network import SASRec

SIZES = {"d_model": 8, "n_heads": 2, "n_layers": 1, "d_ff": 16, "max_len": 6, "dropout": 0.0}


def _npz(path, ids, vectors) -> str:
    np.savez(path, item_id=np.asarray(ids), vector=np.asarray(vectors, dtype=np.float32))
    return str(path)


def test_the_file_is_read_by_the_logs_ids(tmp_path):
    vocab = ItemVocab(["a", "b", "c"])
    path = _npz(tmp_path / "v.npz", ["c", "a", "not in the log"], [[1, 2], [3, 4], [5, 6]])
    out = read_item_vectors(path, vocab)
    assert out.shape == (4, 2) and out.dtype == torch.float32
    assert out[vocab.index["a"]].tolist() == [3, 4] and out[vocab.index["c"]].tolist() == [1, 2]
    assert out[0].isnan().all() and out[vocab.index["b"]].isnan().all()  # padding, and an item it lacks
    numeric = ItemVocab(["1", "2"])
    assert read_item_vectors(_npz(tmp_path / "n.npz", [2], [[7.0]]), numeric)[2].tolist() == [7.0]  # int ids


@pytest.mark.parametrize(("write", "message"), [
    (lambda p: np.savez(p, ids=np.array(["a"]), vector=np.ones((1, 2))), "no array 'item_id'"),
    (lambda p: np.savez(p, item_id=np.array(["a", "a"]), vector=np.ones((2, 2))), "item 'a' has more than one"),
    (lambda p: np.savez(p, item_id=np.array(["a", "b"]), vector=np.ones((1, 2))), r"must be \(M,\) and \(M, E\)"),
    (lambda p: np.savez(p, item_id=np.array(["zz"]), vector=np.ones((1, 2))), "none of its 1 items is in the log"),
    (lambda p: np.savez(p, item_id=np.array(["a"]), vector=np.array([[np.nan, 1.0]])), "item 'a' holds NaN"),
    (lambda p: np.savez(p, item_id=np.array(["a"]), vector=np.array([["x", "y"]])), "`vector` floats"),
    (lambda p: np.savez(p, item_id=np.array([{"a": 1}], dtype=object), vector=np.ones((1, 2))), "not a NumPy"),
    (lambda p: p.write_bytes(b"not a zip"), "not a NumPy .npz"),
])
def test_a_bad_file_is_refused_in_one_line_naming_it(tmp_path, write, message):
    path = tmp_path / "bad.npz"
    write(path)
    with pytest.raises(InputError, match=message) as err:
        read_item_vectors(path, ItemVocab(["a", "b"]))
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_a_compressed_file_is_limited_by_its_unpacked_size(tmp_path, monkeypatch):
    # 100,000 zeros pack into a few hundred bytes: the limit counts the 400 kB they take once read.
    path = tmp_path / "zeros.npz"
    write_item_vectors(path, np.array(["a"]), np.zeros((1, 100_000)))
    assert path.stat().st_size < 10_000
    monkeypatch.setattr(vectors_module, "MAX_VECTORS_FILE_BYTES", 100_000)
    with pytest.raises(InputError, match="bytes unpacked, over the 100,000-byte limit"):
        read_item_vectors(path, ItemVocab(["a"]))


def _principal_gram(x: np.ndarray, k: int) -> np.ndarray:
    """The Gram matrix of the centred rows projected on their top-k principal directions, by eigendecomposition of
    the covariance (not the SVD the model uses), scaled to unit trace."""
    centred = x - x.mean(axis=0)
    values, vectors = np.linalg.eigh(centred.T @ centred)
    top = vectors[:, np.argsort(values)[::-1][:k]]
    gram = (centred @ top) @ (centred @ top).T
    return gram / np.trace(gram)


@pytest.mark.parametrize("width", [5, 12])  # narrower than d_model 8 (every direction kept), and wider (top 8)
def test_started_rows_keep_the_vectors_principal_geometry_at_the_tables_spread(width):
    torch.manual_seed(0)
    model = SASRec(6, **SIZES)
    before = model.item_embedding.weight.detach().clone()
    x = np.random.default_rng(1).normal(size=(6, width)) * np.linspace(3, 0.5, width)
    vectors = torch.full((7, width), float("nan"))
    given = [1, 2, 4, 5, 6]  # item 3 has no vector
    vectors[given] = torch.tensor(x[[0, 1, 3, 4, 5]], dtype=torch.float32)
    assert model.start_items_from(vectors) == 5
    after = model.item_embedding.weight.detach()
    k = min(8, width, 5)
    rows = after[given, :k].double().numpy()
    gram = rows @ rows.T
    np.testing.assert_allclose(gram / np.trace(gram), _principal_gram(x[[0, 1, 3, 4, 5]], k), atol=1e-5)
    assert rows.std(ddof=1) == pytest.approx(before[1:7].double().std().item(), rel=1e-5)  # torch.std: n - 1
    assert torch.equal(after[3], before[3]) and torch.equal(after[0], before[0])  # no vector; padding
    assert torch.equal(after[given, k:], before[given, k:])  # past the vectors' rank: the random start
    with pytest.raises(ValueError, match="vectors for 3 items do not fit the model's 6"):
        model.start_items_from(torch.zeros(4, width))


@pytest.fixture()
def tiny(tmp_path):
    log = "user_id,item_id,timestamp\n" + "".join(f"u{u},i{(u + t) % 6},{t}\n" for u in range(12) for t in range(5))
    (tmp_path / "log.csv").write_text(log, encoding="utf-8")
    x = np.random.default_rng(0).normal(size=(6, 3))
    return tmp_path, _npz(tmp_path / "v.npz", [f"i{k}" for k in range(6)], x), x


def _fit(data: StreamRecDataModule, module: StreamRecModule, steps: int, ckpt: str | None = None) -> L.Trainer:
    trainer = L.Trainer(max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", devices=1, limit_val_batches=0)
    trainer.fit(module, data, ckpt_path=ckpt)
    return trainer


def test_fit_starts_the_rows_from_the_file_and_a_resumed_fit_keeps_its_trained_rows(tiny):
    folder, path, x = tiny
    L.seed_everything(0, verbose=False)
    data = StreamRecDataModule(str(folder / "log.csv"), max_len=6, batch_size=8, item_vectors=path)
    module = StreamRecModule(data.num_items, **SIZES)
    _fit(data, module, steps=0)  # setup only: the started rows, untrained
    order = [data.vocab.index[f"i{k}"] for k in range(6)]
    rows = module.model.item_embedding.weight.detach()[order, :3].double().numpy()
    np.testing.assert_allclose(rows @ rows.T / np.trace(rows @ rows.T), _principal_gram(x, 3), atol=1e-5)
    trainer = _fit(data, module, steps=2)
    trainer.save_checkpoint(folder / "two.ckpt")
    trained = module.model.item_embedding.weight.detach().clone()
    again = StreamRecModule(data.num_items, **SIZES)
    _fit(data, again, steps=2, ckpt=str(folder / "two.ckpt"))  # restored after setup starts the rows again
    torch.testing.assert_close(again.model.item_embedding.weight.detach(), trained)
    with pytest.raises(FileNotFoundError, match="item vectors file 'nope.npz' does not exist"):
        StreamRecDataModule(str(folder / "log.csv"), item_vectors="nope.npz")


def test_the_title_script_writes_what_the_reader_takes(data_script, tmp_path, capsys):
    script = data_script("prepare_title_vectors")
    items = tmp_path / "items.csv"
    items.write_text('item_id,asin,title\n1,A1,"Red Nail Polish"\n2,A2,\n3,A3,Shampoo\n', encoding="utf-8")
    calls = []

    def encode(titles):  # a stand-in for the encoder: each title's length and word count
        calls.append(titles)
        return np.array([[len(t), len(t.split())] for t in titles])

    script.main(["--items", str(items), "--out", str(tmp_path / "t.npz")], encode=encode)
    out = read_item_vectors(tmp_path / "t.npz", ItemVocab(["1", "2", "3"]))
    assert calls == [["Red Nail Polish", "Shampoo"]]  # the blank title is not encoded
    assert out[1].tolist() == [15, 3] and out[3].tolist() == [7, 1] and out[2].isnan().all()
    with pytest.raises(SystemExit):
        script.main(["--items", str(items), "--out", str(tmp_path / "t.csv")], encode=encode)
    assert "--out" in (err := capsys.readouterr().err) and "name a .npz file" in err


def test_the_feature_script_weighs_each_feature_by_its_rarity(data_script, tmp_path, capsys):
    script = data_script("prepare_feature_vectors")
    items = tmp_path / "attributes.json"
    items.write_text('{"a": [1, 2], "b": [1], "c": [1, 3], "d": [2, 3]}', encoding="utf-8")
    script.main(["--items", str(items), "--columns", "attributes", "--out", str(tmp_path / "f.npz")])
    out = read_item_vectors(tmp_path / "f.npz", ItemVocab(["a", "b", "c", "d"]))
    # By hand: 4 items; attribute 1 on 3 of them weighs log(4/3), 2 and 3 on 2 each log(2); the columns run by
    # count, then name (1, 2, 3); each row is scaled to unit length.
    w1, w2 = np.log(4 / 3), np.log(2)
    for row, want in ((1, [w1, w2, 0]), (3, [w1, 0, w2]), (4, [0, w2, w2])):
        assert out[row].tolist() == pytest.approx((np.array(want) / np.linalg.norm(want)).tolist()), row
    assert out[2].tolist() == pytest.approx([1, 0, 0])  # b: attribute 1 alone, its unit vector
    ids, vectors = script.feature_vectors({"a": ["x", "y"], "b": ["x"], "c": ["x", "z"]}, width=2)
    assert ids.tolist() == ["a"] and vectors.tolist() == [[0, 1]]  # x is on every item: weight 0, b gets no row
    assert "wrote 4 of 4 items' feature vectors (3 features wide)" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no column 'genres'"):
        script.main(["--items", str(items), "--columns", "genres", "--out", str(tmp_path / "g.npz")])
