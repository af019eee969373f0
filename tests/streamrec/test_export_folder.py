"""Export folders are complete: copied anywhere, they load with plain onnxruntime; no hidden file, usual modes,
and a failed export leaves nothing behind."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest
import torch

from streamrec import Recommender
from streamrec.export import main

CKPT = Path(__file__).parent / "fixtures" / "sasrec.ckpt"  # a tiny checkpoint: nothing to train


def _umask_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def test_a_copied_onnx_folder_scores_as_the_api(tmp_path) -> None:
    ort = pytest.importorskip("onnxruntime", reason="pip install -c constraints.txt -e '.[export]'")
    pytest.importorskip("onnxscript", reason="pip install -c constraints.txt -e '.[export]'")
    main(["--ckpt", str(CKPT), "--format", "onnx", "--output", str(tmp_path / "export")])
    names = sorted(os.listdir(tmp_path / "export"))
    assert not [n for n in names if n.startswith(".")], names  # nothing `ls` would not show
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for name in names:  # cp export/* elsewhere/
        shutil.copy(tmp_path / "export" / name, elsewhere / name)
    shutil.rmtree(tmp_path / "export")
    session = ort.InferenceSession(str(elsewhere / "model.onnx"), providers=["CPUExecutionProvider"])
    rec = Recommender.load(CKPT)
    items = torch.tensor([[0, 0, 0, 1, 2, 3, 4, 5], [0, 0, 0, 0, 0, 0, 7, 9]])
    (scores,) = session.run(["scores"], {"items": items.numpy()})
    want = rec.model.recommend_scores(items).numpy()
    np.testing.assert_allclose(scores[:, 1:], want[:, 1:], rtol=1e-4, atol=1e-4)


def test_safetensors_files_get_the_usual_mode(tmp_path) -> None:
    main(["--ckpt", str(CKPT), "--format", "safetensors", "--output", str(tmp_path / "st")])
    for name in ("model.safetensors", "config.json"):
        assert stat.S_IMODE((tmp_path / "st" / name).stat().st_mode) == _umask_mode(), name


def test_a_failed_export_leaves_no_folder(tmp_path, capsys) -> None:
    bad = tmp_path / "not_a.ckpt"
    bad.write_text("not a checkpoint")
    with pytest.raises(SystemExit) as exit_:
        main(["--ckpt", str(bad), "--format", "safetensors", "--output", str(tmp_path / "out")])
    assert exit_.value.code not in (0, None)
    assert not (tmp_path / "out").exists()
