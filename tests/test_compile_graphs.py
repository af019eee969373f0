"""torch.compile as the apps call it (`core.nn.compile.compile_in_place` on the stacks): every network's training
step traces as whole graphs with no graph break, a run over batches of several lengths compiles a bounded number of
graphs, and under the real inductor backend on the CPU the compiled step's loss and gradients equal eager's.

Graph breaks and recompiles are decided by dynamo before any backend runs, so the cheap checks trace every network
through a recording backend, over the lengths that compile a static and then a symbolic graph; inductor, which
generates and builds C++ kernels, runs at one length each on SASRec's encoder and the translator's decoder (its
encoder is the same core encoder layer SASRec's test lowers).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo import register_backend
from torch._dynamo.utils import counters
from torch._inductor import config as inductor_config
from torch._inductor import cpu_vec_isa

from core.nn.compile import compile_in_place
from streamrec.data.datasets import TrainBatch
from streamrec.model.losses import Objective
from streamrec.model.network import NETWORKS, network_class
from streamrec.model.options import ContrastiveOptions, ObjectiveOptions
from translate.data.corpus import Batch
from translate.model.module import translation_loss
from translate.model.networks import network_from_hparams

BACKEND = "recording_eager_graphs"
GRAPHS: list[torch.fx.GraphModule] = []
LENGTHS = (12, 9, 7)  # the first length compiles static, the second symbolic, the third reuses that graph


def _recording(gm: torch.fx.GraphModule, example_inputs) -> object:
    GRAPHS.append(gm)
    return gm.forward


if BACKEND not in torch.compiler.list_backends(exclude_tags=()):
    register_backend(_recording, BACKEND)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    GRAPHS.clear()
    yield
    torch._dynamo.reset()


def _session_batch(length: int, num_items: int = 40) -> TrainBatch:
    g = torch.Generator().manual_seed(length)
    inputs = torch.randint(1, num_items + 1, (4, length), generator=g)
    inputs[0, : length // 2] = 0  # one left-padded row
    targets = torch.randint(1, num_items + 1, (4, length), generator=g).masked_fill(inputs == 0, 0)
    return TrainBatch(inputs, targets)


def _translation_batch(length: int, vocab: int = 30) -> Batch:
    g = torch.Generator().manual_seed(length)
    src = torch.randint(4, vocab, (3, length), generator=g)
    src[1, length - 3:] = 0  # right padding
    tgt = torch.randint(4, vocab, (3, length + 1), generator=g)
    tgt[2, length - 2:] = 0
    return Batch(src=src, tgt_in=tgt[:, :-1], tgt_out=tgt[:, 1:], index=torch.arange(3))


def _session_network(arch: str):
    torch.manual_seed(0)
    return network_class(arch)(40, d_model=16, n_heads=2, n_layers=1, d_ff=32, dropout=0.0, max_len=16)


def _translator():
    torch.manual_seed(0)
    return network_from_hparams(arch="transformer", src_vocab_size=30, tgt_vocab_size=30, d_model=16, n_heads=2,
                                n_encoder_layers=1, n_decoder_layers=1, d_ff=32, dropout=0.0, max_len=32)


def _session_step(network, objective: Objective, length: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    network.zero_grad(set_to_none=True)
    loss, _ = objective(network, _session_batch(length))
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in network.parameters() if p.grad is not None]


def _translation_step(network, length: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    network.zero_grad(set_to_none=True)
    loss = translation_loss(network, _translation_batch(length), pad_id=0, smoothing=0.1)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in network.parameters() if p.grad is not None]


def _graphs_and_breaks() -> tuple[int, int]:
    return len(GRAPHS), sum(counters["graph_break"].values())


@pytest.mark.parametrize("arch", sorted(NETWORKS))
def test_each_session_network_trains_as_whole_graphs_with_bounded_recompiles(arch):
    network = _session_network(arch)
    objective = Objective(ObjectiveOptions(mask_prob=0.3), ContrastiveOptions())
    compile_in_place([network.encoder], "default", backend=BACKEND)
    for length in LENGTHS:
        _session_step(network, objective, length)
    graphs, breaks = _graphs_and_breaks()
    assert breaks == 0, dict(counters["graph_break"])
    assert 1 <= graphs <= 2  # one static graph, then at most one with symbolic lengths, for all three batches


def test_the_translator_trains_as_whole_graphs_with_bounded_recompiles():
    network = _translator()
    compile_in_place([network.encoder, network.decoder], "default", backend=BACKEND)
    for length in LENGTHS:
        _translation_step(network, length)
    graphs, breaks = _graphs_and_breaks()
    assert breaks == 0, dict(counters["graph_break"])
    assert 2 <= graphs <= 4  # the encoder's and the decoder's: static, then symbolic


def _assert_same_step(compiled: tuple, eager: tuple) -> None:
    (loss, grads), (want_loss, want_grads) = compiled, eager
    torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-6)
    assert len(grads) == len(want_grads)
    for got, want in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


@pytest.fixture
def _quick_cpp_build():
    """Inductor's C++ built the cheap way: scalar loops (the same lowering of our graphs, the part that can differ
    from eager, as vectorised kernels, which take the compiler several times longer) and no pool of compile
    workers, which on two cores only wait for a turn. One length per network: each inductor graph builds kernels
    of its own, and the symbolic graphs are the recording backend's check above."""
    with inductor_config.patch({"compile_threads": 1, "cpp.vec_isa_ok": False}):
        yield
    cpu_vec_isa.valid_vec_isa_list.cache_clear()  # filtered by the flag once: a later compile picks its own


@pytest.mark.slow
def test_inductor_compiles_the_sasrec_step_with_eager_loss_and_gradients(_quick_cpp_build):
    compiled = _session_network("sasrec")
    eager = copy.deepcopy(compiled)
    objective = Objective(ObjectiveOptions(), ContrastiveOptions())
    compile_in_place([compiled.encoder], "default", backend="inductor")
    _assert_same_step(_session_step(compiled, objective, LENGTHS[0]), _session_step(eager, objective, LENGTHS[0]))
    assert sum(counters["graph_break"].values()) == 0
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.slow
def test_inductor_compiles_the_translation_step_with_eager_loss_and_gradients(_quick_cpp_build):
    compiled = _translator()
    eager = copy.deepcopy(compiled)
    compile_in_place([compiled.decoder], "default", backend="inductor")
    _assert_same_step(_translation_step(compiled, LENGTHS[0]), _translation_step(eager, LENGTHS[0]))
    assert sum(counters["graph_break"].values()) == 0
    assert counters["stats"]["unique_graphs"] == 1
