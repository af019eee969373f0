"""Smoke test of benchmarks/translate_speed.py's own side: no transformers or CTranslate2 needed.

The script imports its peers lazily, so importing it as a module gives the argument parser,
the inputs, our decode and our training step at a tiny size, in a second or two.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import torch

pytestmark = pytest.mark.slow  # end-to-end: real processes, servers or training; `pytest -m "not slow"` skips them

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--sentences", "6", "--batch-size", "4", "--beam", "3", "--tgt-len", "7", "--d-model", "32", "--n-heads", "2",
        "--n-layers", "1", "--d-ff", "64", "--vocab", "300", "--max-src", "12", "--max-tokens", "128",
        "--train-batches", "2"]


@pytest.fixture(scope="module")
def bench(benchmark_module) -> ModuleType:
    return benchmark_module("translate_speed.py")


def test_arguments_and_inputs(bench: ModuleType) -> None:
    args = bench.parse_args(TINY)
    assert (args.threads, args.beam, args.tgt_len, args.vocab) == (1, 3, 7, 300)
    sources = bench.make_sources(args.sentences, args.min_src, args.max_src, args.vocab, seed=0)
    assert sources == bench.make_sources(args.sentences, args.min_src, args.max_src, args.vocab, seed=0)
    assert all(args.min_src <= len(s) <= args.max_src and min(s) >= bench.FIRST_WORD for s in sources)
    batches = bench.source_batches(sources, args.batch_size)
    assert [b.shape[0] for b in batches] == [4, 2]
    assert sorted(sources, key=len)[0] == [i for i in batches[0][0].tolist() if i != 0]
    with pytest.raises(SystemExit):
        bench.parse_args(["--beam", "0"])


def test_our_decode_runs_exactly_tgt_len_steps(bench: ModuleType) -> None:
    args = bench.parse_args(TINY)
    model = bench.build_ours(args).eval()
    batches = bench.source_batches(bench.make_sources(6, args.min_src, args.max_src, args.vocab, 0), 4)
    out = bench.decode_ours(model, batches, args.beam, args.tgt_len)
    assert len(out) == 6
    # tgt_len - 1 subwords, then the forced EOS (tgt_len steps), unless a random EOS ended a sentence sooner.
    assert all(len(o) <= args.tgt_len - 1 for o in out) and any(len(o) == args.tgt_len - 1 for o in out)


def test_our_int8_decode_runs_and_int8_needs_float32(bench: ModuleType) -> None:
    args = bench.parse_args([*TINY, "--int8"])
    model = bench.quantize_int8(bench.build_ours(args).eval())
    batches = bench.source_batches(bench.make_sources(6, args.min_src, args.max_src, args.vocab, 0), 4)
    out = bench.decode_ours(model, batches, args.beam, args.tgt_len)
    assert len(out) == 6 and all(len(o) <= args.tgt_len - 1 for o in out)
    with pytest.raises(SystemExit):
        bench.parse_args([*TINY, "--int8", "--decode-dtype", "bfloat16"])


def test_our_training_step_updates_weights(bench: ModuleType) -> None:
    args = bench.parse_args(TINY)
    model = bench.build_ours(args).train()
    batches = bench.training_batches(args)
    assert len(batches) == 2 and all(b.src.numel() <= args.max_tokens for b in batches)
    before = model.tgt_embed.weight.detach().clone()
    bench.train_step_ours(model, bench.adamw(model), batches[0], bf16=False)
    assert not torch.equal(before, model.tgt_embed.weight)


def test_torch_dropout_baseline_swaps_every_core_dropout(bench: ModuleType) -> None:
    from core.nn.cpu_fastpath import FastDropout as Dropout

    args = bench.parse_args(TINY)
    model = bench.build_ours(args)
    assert bench.enable_cpu_fastpath(model) > 0  # as main() runs ours
    baseline = bench.with_torch_dropout(model)
    ours_p = [m.p for m in model.modules() if isinstance(m, Dropout)]
    assert ours_p and [m.p for m in baseline.modules() if type(m) is torch.nn.Dropout] == ours_p
    assert not any(isinstance(m, Dropout) for m in baseline.modules())
    assert all(isinstance(m, Dropout) for m in model.modules() if isinstance(m, torch.nn.Dropout))  # untouched
    torch.testing.assert_close(baseline.eval()(*_pair()), model.eval()(*_pair()))  # the same weights
    layer = next(m for m in baseline.train().modules() if type(m) is torch.nn.Dropout)
    dropped = (layer(torch.ones(200, 200)) == 0).float().mean().item()
    assert abs(dropped - layer.p) < 0.02 and layer.p > 0  # the baseline really drops, in train mode


def test_mkl_baseline_swaps_every_fast_linear(bench: ModuleType) -> None:
    from core.nn.cpu_fastpath import FastLinear

    model = bench.build_ours(bench.parse_args(TINY)).eval()
    bench.enable_cpu_fastpath(model)
    baseline = bench.with_mkl(model)
    assert not any(isinstance(m, FastLinear) for m in baseline.modules())
    assert sum(type(m) is torch.nn.Linear for m in baseline.modules()) == sum(
        type(m) is FastLinear for m in model.modules()) > 0  # the original keeps its fast layers
    torch.testing.assert_close(baseline(*_pair()), model(*_pair()), rtol=1e-5, atol=1e-5)


def _pair() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randint(4, 300, (2, 5), generator=g), torch.randint(4, 300, (2, 4), generator=g)


def test_training_profile_names_the_loss_and_the_dropout(bench: ModuleType) -> None:
    import io

    from rich.console import Console

    args = bench.parse_args([*TINY, "--profile-train"])
    assert args.profile_train
    out = io.StringIO()
    model = bench.build_ours(args)
    bench.enable_cpu_fastpath(model)  # as main() runs ours: the dropout row counts FastDropout's ops
    bench.profile_train(Console(file=out, width=200), model, bench.training_batches(args))
    text = out.getvalue()
    assert "where a training step goes" in text and "whole steps" in text
    rows = {line.split("│")[1].strip(): float(line.split("│")[-2]) for line in text.splitlines()
            if line.count("│") == 4 and "%" not in line.split("│")[-2]}
    loss = next(v for k, v in rows.items() if k.startswith("output layer + loss"))
    drop = next(v for k, v in rows.items() if k.startswith("dropout masks"))
    assert 0 < loss < 100 and 0 < drop < 100  # both ran inside the profiled steps


def test_decode_profile_accounts_for_the_whole_search(bench: ModuleType) -> None:
    import io

    from rich.console import Console

    args = bench.parse_args(TINY)
    batches = bench.source_batches(bench.make_sources(6, args.min_src, args.max_src, args.vocab, 0), 4)
    out = io.StringIO()
    bench.profile_ours(Console(file=out, width=200), bench.build_ours(args).eval(), batches, args.beam, args.tgt_len)
    text = out.getvalue()
    assert "top aten ops by self CPU time" in text and "whole search" in text and "cache reorder" in text
