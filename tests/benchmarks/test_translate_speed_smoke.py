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
TINY = ["--quick", "--sentences", "6"]


@pytest.fixture(scope="module")
def bench(benchmark_module) -> ModuleType:
    return benchmark_module("translate_speed.py")


def test_arguments_and_inputs(bench: ModuleType) -> None:
    args = bench.parse_args(TINY)
    assert (args.threads, args.beam, args.tgt_len, args.vocab, args.batch_size) == (1, 3, 7, 300, 4)
    sources = bench.make_sources(args.sentences, args.min_src, args.max_src, args.vocab, seed=0)
    assert sources == bench.make_sources(args.sentences, args.min_src, args.max_src, args.vocab, seed=0)
    assert all(args.min_src <= len(s) <= args.max_src and min(s) >= bench.FIRST_WORD for s in sources)
    batches = bench.source_batches(sources, args.batch_size)
    assert [b.shape[0] for b in batches] == [4, 2]
    assert sorted(sources, key=len)[0] == [i for i in batches[0][0].tolist() if i != 0]
    with pytest.raises(SystemExit):
        bench.parse_args(["--repeats", "0"])


def test_our_decode_runs_exactly_tgt_len_steps(bench: ModuleType) -> None:
    args = bench.parse_args(TINY)
    model = bench.build_ours(args).eval()
    batches = bench.source_batches(bench.make_sources(6, args.min_src, args.max_src, args.vocab, 0), 4)
    out = bench.decode_ours(model, batches, args.beam, args.tgt_len)
    assert len(out) == 6
    # tgt_len - 1 subwords, then the forced EOS (tgt_len steps), unless a random EOS ended a sentence sooner.
    assert all(len(o) <= args.tgt_len - 1 for o in out) and any(len(o) == args.tgt_len - 1 for o in out)


def test_our_training_step_updates_weights(bench: ModuleType) -> None:
    args = bench.parse_args(TINY)
    model = bench.build_ours(args).train()
    assert bench.enable_cpu_fastpath(model) > 0  # as main() runs ours
    batches = bench.training_batches(args)
    assert len(batches) == 2 and all(b.src.numel() <= args.max_tokens for b in batches)
    before = model.tgt_embed.weight.detach().clone()
    bench.train_step(model, bench.adamw(model), batches[0], bf16=False)
    assert not torch.equal(before, model.tgt_embed.weight)


def test_our_steps_have_a_flop_count_and_an_mfu(bench: ModuleType, benchmark_module) -> None:
    common = benchmark_module("_common.py")
    args = bench.parse_args(TINY)
    model = bench.build_ours(args)
    batches = bench.training_batches(args)
    opt = bench.adamw(model.train())
    train = common.step_flops(lambda: [bench.train_step(model, opt, b, bf16=False) for b in batches])
    sources = bench.source_batches(bench.make_sources(6, args.min_src, args.max_src, args.vocab, 0), 4)
    decode = common.step_flops(lambda: bench.decode_ours(model.eval(), sources, args.beam, args.tgt_len))
    assert train > decode > 0
    figures = common.flop_figures(train, 0.5, common.peak_gemm_flops("fp32", 1, size=64, repeats=1))
    assert figures["flop_s"] == 2 * train and figures["mfu"] > 0
