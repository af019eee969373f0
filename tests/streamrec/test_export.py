"""StreamRec export: safetensors round trip (no pickle) and the ONNX scoring graph against PyTorch."""

from __future__ import annotations

import json
import os
import shutil
import struct

import pytest
import torch

from streamrec import Recommender
from streamrec.export import export_safetensors, main, write_onnx
from streamrec.model.network import NETWORKS, PAD_ID, SASRec, trim_padding


def test_safetensors_round_trip_gives_identical_recommendations(tiny_ckpt, tmp_path):
    out = export_safetensors(tiny_ckpt, tmp_path / "st")
    raw = (out / "model.safetensors").read_bytes()
    header = json.loads(raw[8 : 8 + struct.unpack("<Q", raw[:8])[0]])  # safetensors: raw tensors after a JSON header
    assert "item_embedding.embedding.weight" in header
    config = json.loads((out / "config.json").read_text())
    assert config["format"] == "streamrec-safetensors" and config["hyper_parameters"]["d_model"] == 16
    assert config["hyper_parameters"]["objective"]["loss"] == "full"  # the option groups, as plain dicts

    ours, exported = Recommender.load(tiny_ckpt), Recommender.load(out)
    assert exported.vocab.items == ours.vocab.items
    for name, p in ours.model.state_dict().items():
        assert torch.equal(p, exported.model.state_dict()[name]), name
    items = ours.vocab.items
    histories = [items[:5], items[3:4], items[10:30], ["unknown", items[7]]]
    assert exported.recommend(histories, top_k=10).items == ours.recommend(histories, top_k=10).items


def test_a_folder_of_the_other_app_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"format": "translate-safetensors", "version": 1}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="not 'streamrec-safetensors'"):
        Recommender.load(tmp_path)


def test_trim_padding_keeps_every_column_while_exporting(monkeypatch):
    items = torch.tensor([[0, 0, 3, 4], [0, 0, 0, 5]])
    assert trim_padding(items)[1] == 2
    monkeypatch.setattr("streamrec.model.network.exporting", lambda: True)
    kept, offset = trim_padding(items)
    assert offset == 0 and torch.equal(kept, items)


def _batches(num_items: int, max_len: int) -> list[torch.Tensor]:
    """Left-padded batches of several sizes and lengths (T < max_len too), rows of different lengths."""
    g = torch.Generator().manual_seed(0)
    batches = []
    for b, t in [(1, max_len), (3, max_len), (5, max_len // 2), (2, 1), (7, 3)]:
        items = torch.randint(1, num_items + 1, (b, t), generator=g)
        for row in range(b):
            items[row, : int(torch.randint(0, t, (1,), generator=g))] = PAD_ID  # every row keeps >= 1 item
        batches.append(items)
    return batches


def test_a_copied_onnx_folder_scores_as_pytorch(tiny_ckpt, tmp_path):
    """What `main` writes is the whole folder: nothing hidden, and copied elsewhere (the original deleted) it loads
    with plain onnxruntime and scores every batch size and length as PyTorch does."""
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime not installed: pip install -e '.[export]'")
    pytest.importorskip("onnxscript", reason="onnxscript not installed (torch's ONNX exporter): pip install -e "
                        "'.[export]'")
    main(["--ckpt", str(tiny_ckpt), "--format", "onnx", "--output", str(tmp_path / "export")])
    names = sorted(os.listdir(tmp_path / "export"))
    assert not [n for n in names if n.startswith(".")], names  # nothing `ls` would not show
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for name in names:  # cp export/* elsewhere/
        shutil.copy(tmp_path / "export" / name, elsewhere / name)
    shutil.rmtree(tmp_path / "export")
    rec = Recommender.load(tiny_ckpt)
    assert json.loads((elsewhere / "items.json").read_text()) == {"max_len": 8, "items": rec.vocab.items}
    session = ort.InferenceSession(str(elsewhere / "model.onnx"), providers=["CPUExecutionProvider"])
    for items in _batches(rec.model.num_items, rec.model.max_len):
        ours = rec.model.recommend_scores(items)
        got = torch.from_numpy(session.run(["scores"], {"items": items.numpy()})[0])
        assert got.shape == ours.shape
        assert torch.isneginf(got[:, PAD_ID]).all()
        torch.testing.assert_close(got[:, 1:], ours[:, 1:], atol=1e-4, rtol=0)
        assert torch.equal(got.topk(10).indices, ours.topk(10).indices)


@pytest.mark.parametrize("arch", ["bert4rec", "gru", "tvrec"])
def test_onnx_scores_of_the_other_networks_equal_pytorch(arch, tmp_path):
    """bert4rec's appended mask token, the gru's rotations and tvrec's filter matrix are traced into the graph as
    well (one layer: a second repeats the same operations, and each costs the exporter seconds)."""
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime not installed: pip install -e '.[export]'")
    pytest.importorskip("onnxscript", reason="onnxscript not installed: pip install -e '.[export]'")
    torch.manual_seed(0)
    model = NETWORKS[arch](12, d_model=8, n_heads=2, n_layers=1, d_ff=16, max_len=6).eval()
    write_onnx(model, tmp_path / "model.onnx")
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    for items in _batches(12, 6):
        ours = model.recommend_scores(items)
        got = torch.from_numpy(session.run(["scores"], {"items": items.numpy()})[0])
        torch.testing.assert_close(got[:, 1:], ours[:, 1:], atol=1e-4, rtol=0)


def test_export_refuses_missing_checkpoint(tmp_path):
    with pytest.raises(SystemExit, match="checkpoint not found"):
        main(["--ckpt", str(tmp_path / "nope.ckpt"), "--format", "safetensors", "--output", str(tmp_path / "o")])


def test_model_is_unchanged_by_export_flag():
    # The eager path still trims: same values as the untrimmed graph at the non-padding positions.
    torch.manual_seed(0)
    model = SASRec(12, d_model=8, n_heads=2, n_layers=1, d_ff=16, max_len=6, dropout=0.0).eval()
    items = torch.tensor([[0, 0, 0, 1, 2, 3], [0, 0, 0, 0, 4, 5]])
    trimmed = model.encode(items, trim=True)
    full = model.encode(items)
    torch.testing.assert_close(trimmed[:, -1], full[:, -1], atol=1e-6, rtol=0)
