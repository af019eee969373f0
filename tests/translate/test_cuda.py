"""The translator on an NVIDIA GPU: bf16-mixed training through Lightning, and search and alignments on
CUDA agreeing with the CPU.

Skipped where no CUDA GPU is (CI has none); run on a lent one with `pytest tests/translate/test_cuda.py`.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch

from translate.api import Translator, pad_batch
from translate.data.corpus import TranslationDataModule
from translate.data.vocab import BOS_ID, EOS_ID
from translate.model.module import TranslationModule
from translate.search.options import SearchOptions

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

MAX_LEN = 32


@pytest.fixture(scope="module")
def gpu_ckpt(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small translator trained on the GPU in bf16-mixed for 150 steps."""
    out = tmp_path_factory.mktemp("cuda_ckpt")
    L.seed_everything(0, verbose=False)
    dm = TranslationDataModule(str(demo_dir / "train"), str(demo_dir / "val"), str(demo_dir / "test"),
                               max_len=MAX_LEN, max_tokens=512, cache_dir=str(out / "spm"))
    module = TranslationModule(dm.src_vocab_size, dm.tgt_vocab_size, pad_id=dm.pad_id, max_len=MAX_LEN,
                               d_model=32, n_heads=2, n_encoder_layers=2, n_decoder_layers=2, d_ff=64, lr=3e-3,
                               optimizer={"warmup_steps": 10})
    trainer = L.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed", max_steps=150, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=0)
    trainer.fit(module, dm)
    assert trainer.strategy.root_device.type == "cuda"
    losses = trainer.callback_metrics
    assert torch.isfinite(losses["train_loss"]), losses
    path = out / "gpu.ckpt"
    trainer.save_checkpoint(path)
    return path


def test_bf16_training_on_the_gpu_learns(gpu_ckpt: Path, demo_dir: Path) -> None:
    """After 150 bf16 steps the model's teacher-forced loss on held-out pairs is well below the uniform one."""
    t = Translator.load(gpu_ckpt, device="cuda")
    src_lines = (demo_dir / "test.en").read_text(encoding="utf-8").splitlines()
    tgt_lines = (demo_dir / "test.de").read_text(encoding="utf-8").splitlines()
    src = pad_batch([t.src_vocab.encode(s)[:MAX_LEN] for s in src_lines], "cuda")
    tgt = pad_batch([[BOS_ID, *t.tgt_vocab.encode(s)[: MAX_LEN - 2], EOS_ID] for s in tgt_lines], "cuda")
    with torch.no_grad():
        logits = t.model(src, tgt[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), tgt[:, 1:], ignore_index=t.model.pad_id)
    uniform = torch.log(torch.tensor(float(logits.shape[-1])))
    assert loss < 0.6 * uniform, (loss, uniform)


@pytest.mark.parametrize("beam", [1, 4])
def test_search_and_alignments_on_cuda_equal_the_cpu(gpu_ckpt: Path, demo_dir: Path, beam: int) -> None:
    lines = (demo_dir / "test.en").read_text(encoding="utf-8").splitlines()
    outputs = {}
    for device in ("cpu", "cuda"):
        t = Translator.load(gpu_ckpt, device=device)
        sources = [t.src_vocab.encode(line)[: t.max_src_len] for line in lines]
        hyps, aligned = t.translate_ids(sources, SearchOptions(beam_size=beam, batch_size=8), -1, lines)
        outputs[device] = ([h[0].tokens for h in hyps], aligned)
    cpu_tokens, cpu_align = outputs["cpu"]
    cuda_tokens, cuda_align = outputs["cuda"]
    assert cuda_tokens == cpu_tokens
    for a, b in zip(cpu_align, cuda_align, strict=True):
        assert a.tgt_words == b.tgt_words
        torch.testing.assert_close(torch.as_tensor(b.matrix), torch.as_tensor(a.matrix), atol=1e-4, rtol=1e-3)


def test_bf16_decoding_on_cuda_mostly_agrees_with_fp32(gpu_ckpt: Path, demo_dir: Path) -> None:
    lines = (demo_dir / "test.en").read_text(encoding="utf-8").splitlines()
    tokens = {}
    for dtype in ("float32", "bfloat16"):
        t = Translator.load(gpu_ckpt, device="cuda", dtype=dtype)
        sources = [t.src_vocab.encode(line)[: t.max_src_len] for line in lines]
        hyps, _ = t.translate_ids(sources, SearchOptions(beam_size=4, batch_size=8))
        tokens[dtype] = [h[0].tokens for h in hyps]
    same = sum(a == b for a, b in zip(tokens["float32"], tokens["bfloat16"], strict=True))
    assert same >= 0.8 * len(lines), f"bf16 changed {len(lines) - same} of {len(lines)} translations"
