"""Fixtures for the Translate tests: one torch thread, the demo generator module and small corpora on disk."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

DEMO_SCRIPT = Path(__file__).resolve().parents[2] / "data" / "make_translate_demo.py"


def _load_demo() -> ModuleType:
    # data/ is not a package: load the script by path (registered so dataclasses can resolve the module).
    spec = importlib.util.spec_from_file_location("make_translate_demo", DEMO_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """One intra-op thread: tensors are tiny, and on a busy 2-core machine an OpenMP barrier waiting for a
    preempted second thread made training steps ~10x slower (measured). Restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def demo() -> ModuleType:
    """The `data/make_translate_demo.py` module."""
    return _load_demo()


@pytest.fixture(scope="session")
def demo_dir(demo: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small demo corpus (300/30/30 pairs) written once per session."""
    out = tmp_path_factory.mktemp("translate_demo")
    demo.write_corpus(demo.generate(train_size=300, val_size=30, test_size=30, seed=0), out)
    return out



def _train_tiny_checkpoint(demo_dir: Path, out: Path, max_len: int = 32, n_decoder_layers: int = 1):
    """Fit a tiny translator for 20 steps on the demo corpus and save it as `out/tiny.ckpt`.

    Returns:
        the checkpoint path and the data module it was trained with.
    """
    import lightning as L

    from translate.data.corpus import TranslationDataModule
    from translate.model.module import TranslationModule

    L.seed_everything(0, verbose=False)
    dm = TranslationDataModule(str(demo_dir / "train"), str(demo_dir / "val"), str(demo_dir / "test"),
                               max_len=max_len, max_tokens=512, cache_dir=str(out / "spm"))
    module = TranslationModule(dm.src_vocab_size, dm.tgt_vocab_size, pad_id=dm.pad_id, max_len=max_len,
                               d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=n_decoder_layers, d_ff=32,
                               lr=3e-3, warmup_steps=5)
    trainer = L.Trainer(max_steps=20, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0, use_distributed_sampler=False)
    trainer.fit(module, dm)
    path = out / "tiny.ckpt"
    trainer.save_checkpoint(path)
    return path, dm


@pytest.fixture(scope="session")
def train_tiny_checkpoint():
    """`(demo_dir, out, max_len=32, n_decoder_layers=1) -> (path, data module)`: a tiny checkpoint from a real fit."""
    return _train_tiny_checkpoint
