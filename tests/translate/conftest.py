"""Fixtures for the Translate tests: one torch thread, the demo generator module, and a small corpus and tiny
checkpoints built once per run."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from translate.data.corpus import TranslationDataModule
from translate.model.module import TranslationModule


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """One intra-op thread: tensors are tiny, and on a busy 2-core machine an OpenMP barrier waiting for a
    preempted second thread makes training steps many times slower. Restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def demo(data_script) -> ModuleType:
    """The `data/make_translate_demo.py` module."""
    return data_script("make_translate_demo")


@pytest.fixture(scope="session")
def demo_dir(demo: ModuleType, built_once) -> Path:
    """A small demo corpus (300/30/30 pairs) written once per run."""
    def build(folder: Path) -> None:
        demo.write_corpus(demo.generate(train_size=300, val_size=30, test_size=30, seed=0), folder)

    return built_once("translate demo_dir", build)


def _fit_tiny_checkpoint(demo_dir: Path, out: Path, max_len: int, n_decoder_layers: int) -> None:
    """Fit a tiny translator for 20 steps on the demo corpus and save it as `out/tiny.ckpt` (vocab in out/spm)."""
    import lightning as L

    L.seed_everything(0, verbose=False)
    dm = _data_module(demo_dir, out, max_len)
    module = TranslationModule(dm.src_vocab_size, dm.tgt_vocab_size, pad_id=dm.pad_id, max_len=max_len,
                               d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=n_decoder_layers, d_ff=32,
                               lr=3e-3, optimizer={"warmup_steps": 5})
    trainer = L.Trainer(max_steps=20, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0, use_distributed_sampler=False)
    trainer.fit(module, dm)
    trainer.save_checkpoint(out / "tiny.ckpt")


def _data_module(demo_dir: Path, out: Path, max_len: int) -> TranslationDataModule:
    return TranslationDataModule(str(demo_dir / "train"), str(demo_dir / "val"), str(demo_dir / "test"),
                                 max_len=max_len, max_tokens=512, cache_dir=str(out / "spm"))


@pytest.fixture(scope="session")
def train_tiny_checkpoint(built_once):
    """`(demo_dir, out, max_len=32, n_decoder_layers=1) -> (path, data module)`: a tiny checkpoint from a real fit.

    Each (corpus, max_len, layers) is trained once per run; every caller gets its own copy in `out`
    (`out/tiny.ckpt`, its vocabulary in `out/spm`), so what a test writes beside it stays its own.
    """
    def train(demo_dir: Path, out: Path, max_len: int = 32, n_decoder_layers: int = 1):
        built = built_once(f"translate tiny {demo_dir} {max_len} {n_decoder_layers}",
                           lambda folder: _fit_tiny_checkpoint(demo_dir, folder, max_len, n_decoder_layers))
        shutil.copytree(built, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".built"))
        return out / "tiny.ckpt", _data_module(demo_dir, out, max_len)

    return train
