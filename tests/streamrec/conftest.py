"""StreamRec test fixtures: tiny files written under tmp_path and the demo data generator."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def demo() -> ModuleType:
    """`data/make_streamrec_demo.py` as a module (data/ is a folder of scripts, not a package)."""
    name = "make_streamrec_demo"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "data" / "make_streamrec_demo.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the file executes
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture
def write(tmp_path: Path) -> Callable[[str, str | bytes], Path]:
    """Write text or bytes to tmp_path/name and return the path."""

    def _write(name: str, content: str | bytes) -> Path:
        path = tmp_path / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
        return path

    return _write


@pytest.fixture(scope="session")
def tiny_log(demo, tmp_path_factory) -> Path:
    """A small demo interaction log (81 users: an odd count, so DDP ranks cannot split it evenly)."""
    path = tmp_path_factory.mktemp("streamrec") / "interactions.csv"
    demo.write_csv(demo.generate(users=81, items=40, seed=1, min_len=5, max_len=15), path)
    return path


@pytest.fixture(scope="session")
def tiny_ckpt(tiny_log, tmp_path_factory) -> Path:
    """A checkpoint written by a real (one-epoch) fit on `tiny_log`, as `python -m streamrec fit` would."""
    import lightning as L

    from streamrec.data.datamodule import StreamRecDataModule
    from streamrec.model.module import StreamRecModule

    L.seed_everything(0, verbose=False)
    data = StreamRecDataModule(str(tiny_log), max_len=8, batch_size=32)
    module = StreamRecModule(num_items=data.num_items, max_len=8, d_model=16, n_heads=2, n_layers=1, d_ff=32)
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(module, data)
    path = tmp_path_factory.mktemp("ckpt") / "tiny.ckpt"
    trainer.save_checkpoint(path)
    return path
