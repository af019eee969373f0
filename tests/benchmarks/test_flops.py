"""benchmarks/_common's roofline helpers: the GEMM peak probe, FLOP counts against hand counts, MFU figures."""

from __future__ import annotations

import pytest
import torch

from streamrec.data.datamodule import StreamRecDataModule
from streamrec.model.module import StreamRecModule


@pytest.fixture(scope="module")
def common(benchmark_module):
    return benchmark_module("_common.py")


def test_peak_probe_is_a_positive_rate_and_restores_threads(common) -> None:
    threads = torch.get_num_threads()
    assert common.peak_gemm_flops("fp32", threads=1, size=64, repeats=2) > 0
    assert torch.get_num_threads() == threads


def test_step_flops_counts_a_matmul_forward_and_backward(common) -> None:
    a, b = torch.randn(8, 16, requires_grad=True), torch.randn(16, 4)
    assert common.step_flops(lambda: a @ b) == 2 * 8 * 16 * 4
    assert common.step_flops(lambda: (a @ b).sum().backward()) == 2 * (2 * 8 * 16 * 4)  # + grad of a only


def test_the_cpu_kernels_count_as_their_math(common) -> None:
    """The fast path's oneDNN linear counts as `F.linear`, and SDPA's CPU flash kernel as QK^T and PV (4 B H T^2 Dh
    forward, 2.5 times that backward, torch's convention for its GPU kernels), where FlopCounterMode alone gives 0."""
    from core.nn.cpu_fastpath import linear, onednn_available

    x, w = torch.randn(4, 10, 16), torch.randn(32, 16)
    assert common.step_flops(lambda: torch.nn.functional.linear(x, w)) == 2 * 4 * 10 * 32 * 16
    if onednn_available():
        assert common.step_flops(lambda: linear(x, w)) == 2 * 4 * 10 * 32 * 16
    q = torch.randn(2, 3, 7, 8, requires_grad=True)
    forward = 4 * 2 * 3 * 7 * 7 * 8
    assert common.step_flops(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q)) == forward
    step = lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()  # noqa: E731
    assert common.step_flops(step) == forward + 2.5 * forward


def test_loader_flops_counts_one_batch_per_shape_and_keeps_the_rng(common) -> None:
    a = torch.randn(4, 4)
    batches = [torch.randn(2, 4), torch.randn(2, 4), torch.randn(3, 4)]
    state = torch.get_rng_state()
    flops = common.loader_flops(lambda x: x @ a, batches, lambda x: x.shape)
    assert flops == 2 * (2 * 2 * 4 * 4) + 2 * 3 * 4 * 4
    assert torch.equal(state, torch.get_rng_state())


@pytest.mark.filterwarnings("ignore:.*self.log")  # training_step without a trainer
def test_a_streamrec_epoch_is_counted_as_the_race_counts_it(common, tiny_log) -> None:
    dm = StreamRecDataModule(str(tiny_log), max_len=8, batch_size=4)
    dm.setup("fit")
    module = StreamRecModule(dm.num_items, max_len=8)
    flops = common.loader_flops(lambda b: module.training_step(b, 0).backward(), dm.train_dataloader(),
                                lambda b: b.inputs.shape)
    figures = common.flop_figures(flops, 1.0, common.peak_gemm_flops("fp32", 1, size=64, repeats=1))
    assert flops > 0 and figures["flop_s"] == flops and figures["mfu"] > 0
