"""`model.compile` on Translate: a compiled fit (bf16-mixed, resumed from an eager checkpoint; validation searches
eager) writes a checkpoint that loads eager with equal outputs; bad values are refused; CUDA-graph buckets pad
the batch without changing the loss or the outputs at real positions.

The compiling runs through a counting "eager" backend: the plumbing is what is tested here, not inductor.
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch._dynamo import register_backend

from core.nn.options import SpeedOptions
from core.runtime.checkpoint import load_checkpoint
from translate.data.corpus import Batch, TranslationDataModule
from translate.model.module import TranslationModule

BACKEND = "counting_eager_translate"
GRAPHS: list[torch.fx.GraphModule] = []
PAD, BOS, EOS = 0, 2, 3


def _counting(gm: torch.fx.GraphModule, example_inputs) -> object:
    GRAPHS.append(gm)
    return gm.forward


if BACKEND not in torch.compiler.list_backends(exclude_tags=()):
    register_backend(_counting, BACKEND)

TINY = dict(d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=32, max_len=32,
            optimizer={"warmup_steps": 2}, evaluation={"val_beam_size": 1})


def _fit(module: TranslationModule, data: TranslationDataModule, steps: int, ckpt_path=None) -> L.Trainer:
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=steps, precision="bf16-mixed", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=1, val_check_interval=1, num_sanity_val_steps=0,
                        use_distributed_sampler=False)
    trainer.fit(module, data, ckpt_path=ckpt_path)
    return trainer


@pytest.mark.slow
def test_a_compiled_fit_resumes_an_eager_checkpoint_and_its_checkpoint_loads_eager(demo_dir, tmp_path):
    L.seed_everything(0, verbose=False)
    data = TranslationDataModule(str(demo_dir / "train"), str(demo_dir / "val"), str(demo_dir / "test"),
                                 max_len=32, max_tokens=256, cache_dir=str(tmp_path / "spm"))
    data.prepare_data()
    data.setup("fit")
    sizes = dict(src_vocab_size=data.src_vocab_size, tgt_vocab_size=data.tgt_vocab_size, pad_id=data.pad_id)
    eager = TranslationModule(**sizes, **TINY)
    _fit(eager, data, 1).save_checkpoint(tmp_path / "eager.ckpt")

    compiled = TranslationModule(**sizes, **TINY, speed=SpeedOptions(compile="default", compile_backend=BACKEND))
    GRAPHS.clear()
    trainer = _fit(compiled, data, 2, ckpt_path=tmp_path / "eager.ckpt")
    assert trainer.global_step == 2 and GRAPHS  # resumed, and the stacks went through torch.compile
    assert "val_bleu" in trainer.callback_metrics  # the search ran (eager) on the compiled module
    trainer.save_checkpoint(tmp_path / "compiled.ckpt")

    saved = load_checkpoint(tmp_path / "compiled.ckpt", "test")  # weights_only: plain hyper-parameters
    assert saved["hyper_parameters"]["speed"]["compile"] == "default"
    assert list(saved["state_dict"]) == list(eager.state_dict())  # the same keys, compiled or not
    loaded = TranslationModule.load_from_checkpoint(tmp_path / "compiled.ckpt", speed={"compile": None}).eval()
    assert not loaded._compiled
    src, tgt = torch.tensor([[5, 6, 7, 8], [9, 10, PAD, PAD]]), torch.tensor([[BOS, 4, 5], [BOS, 6, PAD]])
    with torch.no_grad():
        torch.testing.assert_close(compiled.eval().model(src, tgt), loaded.model(src, tgt))


@pytest.mark.parametrize(("key", "value"), [("compile", "fast"), ("compile", "reduce_overhead"),
                                            ("compile_backend", "no_such_backend")])
def test_a_bad_compile_value_is_refused_in_one_line(key, value):
    # The group's own message names the flat key (core.nn.compile's); the group is `model.speed`.
    with pytest.raises(ValueError, match=rf"`model\.(speed\.)?{key}` must be") as err:
        TranslationModule(speed={key: value})
    assert "\n" not in str(err.value)


def test_reduce_overhead_pads_lengths_to_16_with_the_same_loss_and_outputs():
    batch = Batch(src=torch.tensor([[5, 6, 7], [8, 9, PAD]]), tgt_in=torch.tensor([[BOS, 4, 5, 6], [BOS, 7, PAD, PAD]]),
                  tgt_out=torch.tensor([[4, 5, 6, EOS], [7, EOS, PAD, PAD]]), index=torch.tensor([0, 1]))
    modules = {}
    for mode in (None, "default", "reduce-overhead"):
        torch.manual_seed(0)
        modules[mode] = TranslationModule(11, 11, **{**TINY, "dropout": 0.0}, speed={"compile": mode}).eval()
    padded = modules["reduce-overhead"]._bucketed(batch)
    assert padded.src.shape == (2, 16) and padded.tgt_in.shape == padded.tgt_out.shape == (2, 16)
    assert modules["default"]._bucketed(batch) is batch and modules[None]._bucketed(batch) is batch
    with torch.no_grad():
        plain = modules[None].model(batch.src, batch.tgt_in)  # (B, T, V)
        wide = modules["reduce-overhead"].model(padded.src, padded.tgt_in)  # (B, 16, V)
        real = batch.tgt_in != PAD
        torch.testing.assert_close(wide[:, :4][real], plain[real])
        torch.testing.assert_close(modules["reduce-overhead"].compute_loss(batch), modules[None].compute_loss(batch))
