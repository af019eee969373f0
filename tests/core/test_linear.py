"""core.linear against F.linear: the same values and gradients, and the oneDNN route taken only where it should be."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from core import linear as linear_mod
from core.linear import Linear, as_plain_linear, linear, onednn_linear
from core.precision import quantize_int8

ONEDNN_OP = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
needs_onednn = pytest.mark.skipif(not ONEDNN_OP, reason="this torch build has no oneDNN linear op")


@pytest.fixture(autouse=True)
def onednn_route_everywhere(monkeypatch):
    """Route through oneDNN wherever the op exists, not only on AVX-512 CPUs, so that every comparison with
    F.linear below compares two implementations (on an AVX2 CPU it would otherwise compare F.linear with itself)."""
    if ONEDNN_OP:
        monkeypatch.setattr(linear_mod, "onednn_available", lambda: True)


def test_the_onednn_route_is_what_the_comparisons_exercise(calls):
    if not ONEDNN_OP:
        pytest.skip("this torch build has no oneDNN linear op")
    linear(torch.randn(3, 4), torch.randn(2, 4))
    assert calls == [(3, 4)]


@pytest.fixture
def calls(monkeypatch):
    """Counts the calls that reach oneDNN's GEMM."""
    seen = []
    real = linear_mod._onednn
    monkeypatch.setattr(linear_mod, "_onednn", lambda *a: seen.append(a[0].shape) or real(*a))
    return seen


@pytest.mark.parametrize("shape", [(7, 33), (3, 5, 33), (0, 33)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("wide", [False, True], ids=["onednn_weight_grad", "mkl_weight_grad"])
def test_values_and_gradients_equal_f_linear(shape, bias, wide, monkeypatch):
    if wide:  # a layer wider than ONEDNN_MAX_GRAD_ROWS takes its weight gradient from MKL
        monkeypatch.setattr(linear_mod, "ONEDNN_MAX_GRAD_ROWS", 8)
    torch.manual_seed(0)
    w = torch.randn(19, 33, requires_grad=True)
    b = torch.randn(19, requires_grad=True) if bias else None
    x = torch.randn(*shape, requires_grad=True)
    out = linear(x, w, b)
    ref = F.linear(x, w, b)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(ref)
    grads = torch.autograd.grad(out, [x, w] + ([b] if bias else []), g)
    refs = torch.autograd.grad(ref, [x, w] + ([b] if bias else []), g)
    for got, want in zip(grads, refs, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_a_non_contiguous_input_and_a_frozen_weight():
    torch.manual_seed(0)
    w, b = torch.randn(16, 8), torch.randn(16)
    x = torch.randn(6, 4, 8).transpose(0, 1).requires_grad_()  # (4, 6, 8), not contiguous
    out = linear(x, w, b)
    torch.testing.assert_close(out, F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    (grad,) = torch.autograd.grad(out.sum(), x)
    torch.testing.assert_close(grad, w.sum(0).expand(4, 6, 8), rtol=1e-5, atol=1e-5)


@needs_onednn
def test_fp32_cpu_goes_to_onednn_forward_and_both_gradients(calls):
    x = torch.randn(5, 8, requires_grad=True)
    w = torch.randn(3, 8, requires_grad=True)
    linear(x, w).sum().backward()
    assert calls == [(5, 8), (5, 3), (8, 5)]  # the forward, grad @ weight, then (x.T @ grad).T


@needs_onednn
def test_other_cases_keep_f_linear(calls):
    x, w = torch.randn(5, 8), torch.randn(3, 8)
    linear(x.double(), w.double())
    linear(x.bfloat16(), w.bfloat16())
    with torch.autocast("cpu", torch.bfloat16):
        assert linear(x, w).dtype == torch.bfloat16  # autocast still applies
    with onednn_linear(False):
        linear(x, w)
    assert calls == []
    linear(x, w)
    assert len(calls) == 1


def test_linear_is_a_drop_in_nn_linear():
    plain = nn.Linear(8, 4)
    ours = Linear(8, 4)
    ours.load_state_dict(plain.state_dict())
    assert ours.state_dict().keys() == plain.state_dict().keys()
    x = torch.randn(2, 3, 8)
    torch.testing.assert_close(ours(x), plain(x), rtol=1e-5, atol=1e-5)


def test_int8_quantisation_replaces_core_linears():
    model = nn.Sequential(Linear(16, 32), nn.ReLU(), Linear(32, 8)).eval()
    quantized = quantize_int8(model)
    assert not any(isinstance(m, nn.Linear) for m in quantized.modules())
    assert type(model[0]) is Linear  # the original is untouched
    x = torch.randn(4, 16)
    torch.testing.assert_close(quantized(x), model(x), rtol=0.05, atol=0.05)
    assert type(as_plain_linear(Linear(2, 2))) is nn.Linear


@needs_onednn
def test_inference_reuses_a_packed_weight_until_the_weight_changes(calls):
    """Repeated no-grad calls hit the cache; an optimizer step or a new `.data` repacks (else: stale results)."""
    layer = Linear(8, 6)
    x = torch.randn(5, 8)
    with torch.no_grad():
        first = layer(x)
        torch.testing.assert_close(layer(x), first)
    assert linear_mod._packed[layer.weight][2] is linear_mod._packed_weight(layer.weight, 5)
    layer(x).sum().backward()
    torch.optim.SGD(layer.parameters(), lr=0.5).step()  # in place: bumps the version counter
    with torch.no_grad():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
        layer.weight.data = torch.randn(6, 8)  # a new tensor under the same parameter
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
