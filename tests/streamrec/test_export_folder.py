"""Export folders: safetensors files get the usual modes, and a failed export leaves nothing behind (a copied
ONNX folder scoring as PyTorch is in test_export.py)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from streamrec.export import main

CKPT = Path(__file__).parent / "fixtures" / "sasrec.ckpt"  # a tiny checkpoint: nothing to train


def _umask_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


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
