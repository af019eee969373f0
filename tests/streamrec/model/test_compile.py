"""`model.compile` on StreamRec: a compiled fit (bf16-mixed, resumed from an eager checkpoint) writes a checkpoint
that loads eager with equal outputs; bad values are refused; CUDA-graph buckets leave the outputs unchanged.

The compiling runs through a counting "eager" backend: the plumbing is what is tested here, not inductor.
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch._dynamo import register_backend

from core.nn.options import SpeedOptions
from core.runtime.checkpoint import load_checkpoint
from streamrec.data.datamodule import StreamRecDataModule
from streamrec.model.module import StreamRecModule
from streamrec.model.network import SASRec, trim_padding

BACKEND = "counting_eager_streamrec"
GRAPHS: list[torch.fx.GraphModule] = []


def _counting(gm: torch.fx.GraphModule, example_inputs) -> object:
    GRAPHS.append(gm)
    return gm.forward


if BACKEND not in torch.compiler.list_backends(exclude_tags=()):
    register_backend(_counting, BACKEND)

TINY = dict(max_len=8, d_model=16, n_heads=2, n_layers=1, d_ff=32, evaluation={"popularity_baseline": False})


def _fit(module: StreamRecModule, data: StreamRecDataModule, steps: int, ckpt_path=None) -> L.Trainer:
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=steps, precision="bf16-mixed", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=1, num_sanity_val_steps=0)
    trainer.fit(module, data, ckpt_path=ckpt_path)
    return trainer


@pytest.mark.slow
def test_a_compiled_fit_resumes_an_eager_checkpoint_and_its_checkpoint_loads_eager(tiny_log, tmp_path):
    L.seed_everything(0, verbose=False)
    data = StreamRecDataModule(str(tiny_log), max_len=8, batch_size=32)
    eager = StreamRecModule(num_items=data.num_items, **TINY)
    _fit(eager, data, 1).save_checkpoint(tmp_path / "eager.ckpt")

    compiled = StreamRecModule(num_items=data.num_items, speed=SpeedOptions(compile="default", compile_backend=BACKEND),
                               **TINY)
    GRAPHS.clear()
    # One compiled step, inside the first epoch: each further batch shape or the validation would trace again
    trainer = _fit(compiled, data, 2, ckpt_path=tmp_path / "eager.ckpt")
    assert trainer.global_step == 2 and GRAPHS  # resumed, and the encoder went through torch.compile
    assert compiled.model.length_multiple == 1  # buckets only for CUDA graphs
    trainer.save_checkpoint(tmp_path / "compiled.ckpt")

    saved = load_checkpoint(tmp_path / "compiled.ckpt", "test")  # weights_only: plain hyper-parameters
    speed = {"cpu_fastpath": False, "compile": "default", "compile_backend": BACKEND}
    assert saved["hyper_parameters"]["speed"] == speed
    assert list(saved["state_dict"]) == list(eager.state_dict())  # the same keys, compiled or not
    loaded = StreamRecModule.load_from_checkpoint(tmp_path / "compiled.ckpt", speed=SpeedOptions()).eval()
    assert loaded.speed.compile_mode is None and not loaded._compiled
    items = torch.tensor([[0, 0, 3, 7, 9, 2, 5, 1], [0, 0, 0, 0, 0, 6, 2, 8]])
    torch.testing.assert_close(compiled.eval().model.recommend_scores(items), loaded.model.recommend_scores(items))


@pytest.mark.parametrize(("key", "value"), [("compile", "fast"), ("compile", "max_autotune"),
                                            ("compile_backend", "no_such_backend")])
def test_a_bad_compile_value_is_refused_in_one_line(key, value):
    with pytest.raises(ValueError, match=f"{key}` must be") as err:  # the key's name: test_options
        StreamRecModule(num_items=5, speed={key: value})
    assert "\n" not in str(err.value)


def test_reduce_overhead_trims_to_16_column_buckets_with_the_same_outputs(tiny_log):
    data = StreamRecDataModule(str(tiny_log), max_len=8, batch_size=32)
    module = StreamRecModule(num_items=data.num_items, speed={"compile": "reduce-overhead", "compile_backend": BACKEND},
                             **{**TINY, "max_len": 40})
    module.trainer = L.Trainer(accelerator="cpu", logger=False)  # setup compiles for the trainer's process
    module.setup("fit")
    assert module.model.length_multiple == 16

    torch.manual_seed(0)
    model = SASRec(40, max_len=40, d_model=16, n_heads=2, n_layers=1, d_ff=32, dropout=0.0).eval()
    items = torch.zeros(3, 40, dtype=torch.long)
    items[0, -5:] = torch.tensor([3, 7, 9, 2, 5])
    items[1, -2:] = torch.tensor([6, 2])
    items[2, -19:] = torch.arange(1, 20)
    for longest, kept in ((5, 16), (19, 32)):
        batch = items[: 2 if longest == 5 else 3]
        assert trim_padding(batch, 16)[0].shape[1] == kept
        plain = model.encode(batch, trim=True)  # (B, longest, D)
        model.length_multiple = 16
        padded = model.encode(batch, trim=True)  # (B, kept, D)
        last = model.last_hidden(batch)
        model.length_multiple = 1
        assert plain.shape[1] == longest and padded.shape[1] == kept
        real = batch[:, -longest:] != 0
        torch.testing.assert_close(padded[:, -longest:][real], plain[real])
        torch.testing.assert_close(last, model.last_hidden(batch))
