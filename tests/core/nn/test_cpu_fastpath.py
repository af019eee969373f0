"""`core.nn.cpu_fastpath`: the switch, and `FastLinear` against `F.linear` (values, gradients, which route runs).

Nothing here depends on the instruction set: `FastLinear` takes oneDNN wherever the op exists (any x86
build of torch), and every comparison also runs with the op reported missing, i.e. on the fallback.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn

from core.nn import Decoder, Encoder, causal_mask, lengths_mask
from core.nn import cpu_fastpath as fastpath
from core.nn.cpu_fastpath import (
    FastDropout,
    FastLinear,
    cpu_fastpath_disabled,
    disable_cpu_fastpath,
    enable_cpu_fastpath,
    linear,
)
from core.runtime.precision import quantize_int8

ONEDNN_OP = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
needs_onednn = pytest.mark.skipif(not ONEDNN_OP, reason="this torch build has no oneDNN linear op")


@pytest.fixture(params=["onednn", "fallback"])
def route(request, monkeypatch):
    """Run a test on both routes: oneDNN (skipped without the op) and F.linear (the op reported missing)."""
    if request.param == "onednn" and not ONEDNN_OP:
        pytest.skip("this torch build has no oneDNN linear op")
    if request.param == "fallback":
        monkeypatch.setattr(fastpath, "onednn_available", lambda: False)
    return request.param


@pytest.fixture
def calls(monkeypatch):
    """The input shapes of the calls that reach oneDNN's GEMM."""
    seen = []
    real = fastpath._onednn
    monkeypatch.setattr(fastpath, "_onednn", lambda *a: seen.append(a[0].shape) or real(*a))
    return seen


# ----------------------------------------------------------------------------- the switch


def _toy() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.MultiheadAttention(16, 2), nn.Linear(16, 4))


def test_enable_swaps_exact_types_in_place_and_disable_undoes_it():
    model = _toy()
    params = list(model.parameters())
    state = copy.deepcopy(model.state_dict())
    assert enable_cpu_fastpath(model) == 3  # two linears and the dropout; not the attention's own projection
    assert [type(m) for m in model] == [FastLinear, nn.ReLU, FastDropout, nn.MultiheadAttention, FastLinear]
    assert type(model[3].out_proj) is nn.modules.linear.NonDynamicallyQuantizableLinear
    assert list(model.parameters()) == params  # the same tensors: an optimizer built before still holds them
    assert model.state_dict().keys() == state.keys()
    assert enable_cpu_fastpath(model) == 0  # idempotent
    assert disable_cpu_fastpath(model) == 3
    assert [type(m) for m in model] == [nn.Linear, nn.ReLU, nn.Dropout, nn.MultiheadAttention, nn.Linear]
    assert repr(model) == repr(_toy())


def test_disabled_block_restores_only_the_fast_layers():
    model = _toy()
    enable_cpu_fastpath(model[:2])  # the first linear only
    with cpu_fastpath_disabled(model) as plain:
        assert plain is model and not any(type(m) in (FastLinear, FastDropout) for m in model.modules())
    assert [type(m) for m in model] == [FastLinear, nn.ReLU, nn.Dropout, nn.MultiheadAttention, nn.Linear]


def test_the_switch_sets_cheap_attention_dropout_on_core_attention_and_the_block_restores_it():
    enc, dec = _stacks()
    attention = [m for m in [*enc.modules(), *dec.modules()] if hasattr(m, "cheap_dropout")]
    assert len(attention) == 6 and not any(m.cheap_dropout for m in attention)  # 2 self + 2 self + 2 cross
    enable_cpu_fastpath(enc), enable_cpu_fastpath(dec)
    assert all(m.cheap_dropout for m in attention)
    with cpu_fastpath_disabled(enc):
        assert not any(m.cheap_dropout for m in enc.modules() if hasattr(m, "cheap_dropout"))
    assert all(m.cheap_dropout for m in attention)
    disable_cpu_fastpath(dec)
    assert not any(m.cheap_dropout for m in dec.modules() if hasattr(m, "cheap_dropout"))


def test_cheap_attention_dropout_trains_the_same_way_in_distribution():
    # The same encoder in training mode with the switch off and on: dropout on the attention weights only. Each
    # output draws other masks, but the mean over many draws must agree (same Bernoulli(1 - p) per weight).
    torch.manual_seed(0)
    enc = Encoder(n_layers=1, d_model=16, n_heads=2, d_ff=24, attn_dropout=0.5, max_len=6).train()
    x = torch.randn(2, 6, 16)
    with torch.no_grad():
        plain = torch.stack([enc(x) for _ in range(400)]).mean(0)
        enable_cpu_fastpath(enc)
        fast = torch.stack([enc(x) for _ in range(400)]).mean(0)
        enc.eval()
        exact = enc(x)
    assert not torch.allclose(plain, exact, atol=1e-3)  # dropout did act
    torch.testing.assert_close(fast, plain, atol=0.08, rtol=0)


def test_an_enabled_model_copies_and_pickles():
    model = _toy()
    enable_cpu_fastpath(model)
    x = torch.randn(3, 8)
    first = model[0](x)
    clone = pickle.loads(pickle.dumps(copy.deepcopy(model)))
    assert type(clone[0]) is FastLinear
    torch.testing.assert_close(clone[0](x), first)


def test_int8_quantisation_replaces_fast_linears_and_leaves_the_original():
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).eval()
    enable_cpu_fastpath(model)
    quantized = quantize_int8(model)
    assert not any(isinstance(m, nn.Linear) for m in quantized.modules())
    assert type(model[0]) is FastLinear
    x = torch.randn(4, 16)
    torch.testing.assert_close(quantized(x), model(x), rtol=0.05, atol=0.05)


def _stacks() -> tuple[Encoder, Decoder]:
    torch.manual_seed(0)
    kw = dict(d_model=16, n_heads=4, d_ff=24, dropout=0.1, max_len=12, activation="swiglu")
    return Encoder(n_layers=2, **kw), Decoder(n_layers=2, **kw)


def test_core_stacks_give_the_same_outputs_and_gradients(route):
    """Encoder-decoder forward and every parameter gradient, fast path against plain (eval: no dropout)."""
    src, tgt = torch.randn(3, 7, 16), torch.randn(3, 5, 16)
    src_mask = lengths_mask(torch.tensor([7, 4, 2]), 7)
    results = []
    for on in (False, True):
        enc, dec = _stacks()
        if on:
            assert enable_cpu_fastpath(enc) + enable_cpu_fastpath(dec) > 0
        enc.eval(), dec.eval()
        memory = enc(src, src_mask)
        out = dec(tgt, memory, src_mask, self_mask=causal_mask(5))
        out.square().sum().backward()
        grads = [p.grad for p in [*enc.parameters(), *dec.parameters()]]
        results.append((out.detach(), grads))
    (plain, plain_grads), (fast, fast_grads) = results
    torch.testing.assert_close(fast, plain, rtol=1e-5, atol=1e-5)
    for got, want in zip(fast_grads, plain_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- FastLinear


def test_the_onednn_route_is_what_the_comparisons_exercise(calls):
    if not ONEDNN_OP:
        pytest.skip("this torch build has no oneDNN linear op")
    linear(torch.randn(3, 4), torch.randn(2, 4))
    assert calls == [(3, 4)]


@pytest.mark.parametrize("shape", [(7, 33), (3, 5, 33), (0, 33)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("wide", [False, True], ids=["onednn_weight_grad", "mkl_weight_grad"])
def test_values_and_gradients_equal_f_linear(shape, bias, wide, route, monkeypatch):
    if wide:  # a layer wider than ONEDNN_MAX_GRAD_ROWS takes its weight gradient from MKL
        monkeypatch.setattr(fastpath, "ONEDNN_MAX_GRAD_ROWS", 8)
    torch.manual_seed(0)
    w = torch.randn(19, 33, requires_grad=True)
    b = torch.randn(19, requires_grad=True) if bias else None
    x = torch.randn(*shape, requires_grad=True)
    out = linear(x, w, b)
    ref = x @ w.T + (b if bias else 0)  # the definition, not F.linear (the fallback is F.linear itself)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(ref)
    grads = torch.autograd.grad(out, [x, w] + ([b] if bias else []), g)
    refs = torch.autograd.grad(ref, [x, w] + ([b] if bias else []), g)
    for got, want in zip(grads, refs, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_a_non_contiguous_input_and_a_frozen_weight(route):
    torch.manual_seed(0)
    w, b = torch.randn(16, 8), torch.randn(16)
    x = torch.randn(6, 4, 8).transpose(0, 1).requires_grad_()  # (4, 6, 8), not contiguous
    out = linear(x, w, b)
    torch.testing.assert_close(out, x @ w.T + b, rtol=1e-5, atol=1e-5)
    (grad,) = torch.autograd.grad(out.sum(), x)
    torch.testing.assert_close(grad, w.sum(0).expand(4, 6, 8), rtol=1e-5, atol=1e-5)


@needs_onednn
@pytest.mark.parametrize("avx2_mkl", [True, False], ids=["amd_or_other", "intel_avx512"])
def test_fp32_cpu_goes_to_onednn_forward_and_both_gradients_unless_mkl_is_native(calls, avx2_mkl, monkeypatch):
    monkeypatch.setattr(fastpath, "mkl_takes_avx2_path", lambda: avx2_mkl)
    x = torch.randn(5, 8, requires_grad=True)
    w = torch.randn(3, 8, requires_grad=True)
    linear(x, w).sum().backward()
    torch.testing.assert_close(w.grad, torch.ones(3, 5) @ x.detach())  # d sum(x w^T) / dw, by hand
    # the forward, grad @ weight, then (x.T @ grad).T where MKL would run AVX2 code; MKL's own on Intel AVX-512
    assert calls == ([(5, 8), (5, 3), (8, 5)] if avx2_mkl else [(5, 8), (5, 3)])


@pytest.mark.parametrize(("text", "avx2"), [
    ("vendor_id\t: GenuineIntel\nflags\t\t: fpu avx2 avx512f avx512bw\n", False),
    ("vendor_id\t: GenuineIntel\nflags\t\t: fpu avx2\n", True),  # no AVX-512: MKL's AVX2 is its best
    ("vendor_id\t: AuthenticAMD\nflags\t\t: fpu avx2 avx512f avx512bw\n", True),
    (None, True),  # no /proc/cpuinfo
])
def test_mkl_path_is_read_from_the_cpu_vendor_and_flags(text, avx2, monkeypatch, tmp_path):
    import builtins

    real_open = builtins.open
    info = tmp_path / "cpuinfo"
    if text is not None:
        info.write_text(text)

    def fake_open(path, *args, **kwargs):
        if path == "/proc/cpuinfo":
            if text is None:
                raise FileNotFoundError(path)
            return real_open(info, *args, **kwargs)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", fake_open)
    fastpath.mkl_takes_avx2_path.cache_clear()
    try:
        assert fastpath.mkl_takes_avx2_path() is avx2
    finally:
        monkeypatch.undo()
        fastpath.mkl_takes_avx2_path.cache_clear()


def test_other_dtypes_autocast_and_a_missing_op_keep_f_linear(calls, monkeypatch):
    x, w = torch.randn(5, 8), torch.randn(3, 8)
    torch.testing.assert_close(linear(x.double(), w.double()), x.double() @ w.double().T)
    assert linear(x.bfloat16(), w.bfloat16()).dtype == torch.bfloat16
    with torch.autocast("cpu", torch.bfloat16):
        assert linear(x, w).dtype == torch.bfloat16  # autocast still applies
    monkeypatch.setattr(fastpath, "onednn_available", lambda: False)
    torch.testing.assert_close(linear(x, w), x @ w.T)
    assert calls == []


def test_fast_linear_is_a_drop_in_nn_linear(route):
    plain = nn.Linear(8, 4)
    ours = FastLinear(8, 4)
    ours.load_state_dict(plain.state_dict())
    assert ours.state_dict().keys() == plain.state_dict().keys() and ours.extra_repr() == plain.extra_repr()
    x = torch.randn(2, 3, 8)
    torch.testing.assert_close(ours(x), plain(x), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), x @ plain.weight.T + plain.bias, rtol=1e-5, atol=1e-5)
