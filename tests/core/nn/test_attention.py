"""`core.nn.attention` against independent references: a per-head softmax loop written here,
`torch.nn.MultiheadAttention` with copied weights, and invariants of whole stacks
(padding gets zero weight, causality, permutation equivariance).

Legend: B batch, H query heads, Hkv key/value heads, T time, Tq queries, Tk keys, S source, D width.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from core.nn.attention import FP32_MAX_KEYS, CrossAttention, MultiHeadAttention, attend
from core.nn.explain import AttentionCapture
from core.nn.masks import lengths_mask, padding_mask
from core.nn.positions import ALiBi
from core.nn.stacks import Decoder, Encoder

B, H, DH = 2, 4, 8
D = H * DH


def naive_attention(
    q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None = None, bias: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """softmax(q k^T / sqrt(Dh) + bias) v, one (batch, head) at a time.

    Key/value head j serves query heads j*g .. j*g+g-1 (g = H / Hkv). `allowed` is True where
    a query may see a key. Returns the output (B, H, Tq, Dh) and the weights (B, H, Tq, Tk).
    """
    b, h, t_q, dh = q.shape
    t_k = k.shape[-2]
    group = h // k.shape[1]
    allowed = torch.ones(b, h, t_q, t_k, dtype=torch.bool) if allowed is None else allowed.expand(b, h, t_q, t_k)
    bias = torch.zeros(b, h, t_q, t_k, dtype=q.dtype) if bias is None else bias.expand(b, h, t_q, t_k)
    out = torch.zeros_like(q)
    weights = torch.zeros(b, h, t_q, t_k, dtype=q.dtype)
    for i in range(b):
        for j in range(h):
            kv_head = j // group
            scores = q[i, j] @ k[i, kv_head].T / math.sqrt(dh) + bias[i, j]
            scores = scores.masked_fill(~allowed[i, j], float("-inf"))
            w = torch.exp(scores - scores.max(dim=-1, keepdim=True).values)
            w = w / w.sum(dim=-1, keepdim=True)
            weights[i, j] = w
            out[i, j] = w @ v[i, kv_head]
    return out, weights


def end_aligned_causal(t_q: int, t_k: int) -> Tensor:
    """Hand-built (Tq, Tk): query i sits at absolute position t_k - t_q + i."""
    allowed = torch.zeros(t_q, t_k, dtype=torch.bool)
    for i in range(t_q):
        for j in range(t_k):
            allowed[i, j] = j <= t_k - t_q + i
    return allowed


def qkv(t_q: int, t_k: int, n_kv_heads: int, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor, Tensor]:
    q = torch.randn(B, H, t_q, DH, dtype=dtype)
    k = torch.randn(B, n_kv_heads, t_k, DH, dtype=dtype)
    v = torch.randn(B, n_kv_heads, t_k, DH, dtype=dtype)
    return q, k, v


# --------------------------------------------------------------------------------------------
# attend() against the naive reference


CASES = ["none", "lengths", "padding_ids", "causal", "causal_cached", "causal_padding", "bias", "bias_padding",
         "bias_causal"]


def _case(case: str, t_q: int, t_k: int) -> tuple[dict, Tensor | None, Tensor | None]:
    """Arguments for attend() and the same restriction spelled out for the reference."""
    lengths = torch.tensor([t_k, t_k - 2])
    keep = torch.zeros(B, t_k, dtype=torch.bool)  # hand-built right padding
    keep[0, :t_k] = True
    keep[1, : t_k - 2] = True
    keep_ref = keep[:, None, None, :]
    bias = torch.randn(1, H, t_q, t_k)
    causal = end_aligned_causal(t_q, t_k)
    if case == "none":
        return {}, None, None
    if case == "lengths":
        return {"mask": lengths_mask(lengths, t_k)}, keep_ref, None
    if case == "padding_ids":
        ids = torch.randint(1, 9, (B, t_k)).masked_fill(~keep, 0)
        return {"mask": padding_mask(ids, pad_id=0)}, keep_ref, None
    if case in ("causal", "causal_cached"):
        return {"is_causal": True}, causal, None
    if case == "causal_padding":
        return {"mask": lengths_mask(lengths, t_k), "is_causal": True}, causal & keep_ref, None
    if case == "bias":
        return {"bias": bias}, None, bias
    if case == "bias_padding":
        return {"bias": bias, "mask": lengths_mask(lengths, t_k)}, keep_ref, bias
    if case == "bias_causal":
        return {"bias": bias, "is_causal": True}, causal, bias
    raise AssertionError(case)


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("case", CASES)
def test_attend_equals_naive_softmax(case: str, n_kv_heads: int) -> None:
    t_q, t_k = (3, 7) if case == "causal_cached" else (6, 6)
    q, k, v = qkv(t_q, t_k, n_kv_heads)
    kwargs, allowed, bias = _case(case, t_q, t_k)
    expected, _ = naive_attention(q, k, v, allowed, bias)
    torch.testing.assert_close(attend(q, k, v, **kwargs), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("case", CASES)
def test_attend_capture_weights_and_output_equal_naive(case: str, n_kv_heads: int) -> None:
    t_q, t_k = (3, 7) if case == "causal_cached" else (5, 5)
    q, k, v = qkv(t_q, t_k, n_kv_heads)
    kwargs, allowed, bias = _case(case, t_q, t_k)
    expected_out, expected_w = naive_attention(q, k, v, allowed, bias)
    captured: list[Tensor] = []
    out = attend(q, k, v, capture=captured, **kwargs)
    assert len(captured) == 1
    torch.testing.assert_close(captured[0], expected_w, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(out, expected_out, atol=1e-5, rtol=1e-5)


def test_attend_capture_keeps_float64_precision() -> None:
    """In float64 the capture path must be as exact as the fast path (it computes the same thing).

    `_attend_explicit` runs the softmax as `scores.float()`, an upcast meant for fp16/bf16
    that silently downcasts float64 scores to float32.
    """
    q, k, v = qkv(5, 5, 2, torch.float64)
    expected_out, expected_w = naive_attention(q, k, v)
    captured: list[Tensor] = []
    out = attend(q, k, v, capture=captured)
    torch.testing.assert_close(attend(q, k, v), expected_out, atol=1e-12, rtol=1e-10)  # fast path: exact
    torch.testing.assert_close(captured[0], expected_w, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(out, expected_out, atol=1e-12, rtol=1e-10)


def test_attend_causal_single_query_sees_every_key() -> None:
    # The newest query of a KV cache is the last position: causality hides nothing from it.
    q, k, v = qkv(1, 5, 2)
    expected, _ = naive_attention(q, k, v)
    torch.testing.assert_close(attend(q, k, v, is_causal=True), expected, atol=1e-5, rtol=1e-5)


def _sdpa_dtypes(monkeypatch: pytest.MonkeyPatch) -> list[torch.dtype]:
    """The query dtype of every `F.scaled_dot_product_attention` call `attend` makes from here on."""
    seen: list[torch.dtype] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording(q: Tensor, *args, **kwargs) -> Tensor:
        seen.append(q.dtype)
        return sdpa(q, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    return seen


@pytest.mark.parametrize("t", [8, FP32_MAX_KEYS, FP32_MAX_KEYS + 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("grad", [False, True])
def test_backend_rule_fp32_kernel_only_for_bf16_training_up_to_the_limit(
    t: int, dtype: torch.dtype, grad: bool, monkeypatch: pytest.MonkeyPatch,
) -> None:
    q, k, v = (x.requires_grad_(grad) for x in qkv(t, t, H, dtype))
    mask = lengths_mask(torch.tensor([t, t - 2]), t)
    seen = _sdpa_dtypes(monkeypatch)
    with torch.set_grad_enabled(grad):
        out = attend(q, k, v, mask)
    upcast = grad and dtype == torch.bfloat16 and t <= FP32_MAX_KEYS
    assert seen == [torch.float32 if upcast else dtype]
    assert out.dtype == dtype


def test_backend_rule_keeps_bf16_with_attention_dropout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dropout on the weights sends SDPA to its math kernel in either dtype: not measured, so left alone."""
    q, k, v = (x.requires_grad_() for x in qkv(8, 8, H, torch.bfloat16))
    seen = _sdpa_dtypes(monkeypatch)
    attend(q, k, v, dropout_p=0.1)
    assert seen == [torch.bfloat16]


def test_fp32_kernel_runs_under_cpu_autocast(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under bf16 autocast the layer's bf16 q/k/v reach SDPA in fp32 (autocast would otherwise cast them back);
    the output, and the next layer's input, stay bf16."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(D, H)
    x = torch.randn(B, 6, D)
    seen = _sdpa_dtypes(monkeypatch)
    with torch.autocast("cpu", torch.bfloat16):
        out = mha(x, is_causal=True)
    out.float().sum().backward()
    assert seen == [torch.float32]
    assert out.dtype == torch.bfloat16
    with torch.no_grad():
        ref = mha(x, is_causal=True)
    torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("case", ["lengths", "causal", "bias_padding"])
def test_bf16_training_path_matches_fp32_reference_output_and_gradients(case: str) -> None:
    """The bf16 training path (the fp32 kernel) against the naive reference in fp32 on the same inputs."""
    t = 6
    q32, k32, v32 = qkv(t, t, 2)
    kwargs, allowed, bias = _case(case, t, t)
    q16, k16, v16 = (x.to(torch.bfloat16).requires_grad_() for x in (q32, k32, v32))
    # The reference sees the bf16-rounded inputs, so only the computation's precision differs.
    qr, kr, vr = (x.detach().float().requires_grad_() for x in (q16, k16, v16))
    grad_out = torch.randn(B, H, t, DH)
    out16 = attend(q16, k16, v16, **kwargs)
    out16.backward(grad_out.to(torch.bfloat16))
    ref, _ = naive_attention(qr, kr, vr, allowed, bias)
    ref.backward(grad_out)
    torch.testing.assert_close(out16.float(), ref, atol=3e-2, rtol=2e-2)
    for got, want in ((q16, qr), (k16, kr), (v16, vr)):
        torch.testing.assert_close(got.grad.float(), want.grad, atol=5e-2, rtol=3e-2)


@pytest.mark.parametrize("use_bias", [False, True], ids=["no_bias", "alibi_bias"])
def test_attend_query_with_no_visible_key_outputs_zero(use_bias: bool) -> None:
    """A fully masked query row outputs 0, in the fast path and in capture mode alike.

    `_attend_explicit` documents "A query with no visible key gets zero weights (SDPA outputs
    0 for it too)" and AttentionCapture promises the fast-path output; both hold only
    when no additive bias is passed.
    """
    q, k, v = qkv(3, 3, H)
    allowed = torch.tensor([[True, True, True], [False, False, False], [True, False, True]])
    bias = ALiBi(H, max_len=3)(3, 3) if use_bias else None
    fast = attend(q, k, v, mask=allowed, bias=bias)
    captured: list[Tensor] = []
    explicit = attend(q, k, v, mask=allowed, bias=bias, capture=captured)
    torch.testing.assert_close(fast[:, :, 1], torch.zeros(B, H, DH))
    torch.testing.assert_close(explicit, fast, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------------------------
# Modules against torch.nn.MultiheadAttention with copied weights


def torch_mha_from_self_attention(ours: MultiHeadAttention, bias: bool) -> nn.MultiheadAttention:
    ref = nn.MultiheadAttention(ours.d_model, ours.n_heads, bias=bias, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(ours.qkv.weight)  # rows [q; k; v] in both
        ref.out_proj.weight.copy_(ours.out.weight)
        if bias:
            ref.in_proj_bias.copy_(ours.qkv.bias)
            ref.out_proj.bias.copy_(ours.out.bias)
    return ref.eval()


def torch_mha_from_cross_attention(ours: CrossAttention) -> nn.MultiheadAttention:
    ref = nn.MultiheadAttention(ours.d_model, ours.n_heads, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([ours.q.weight, ours.kv.weight]))  # kv rows are [k; v]
        ref.in_proj_bias.copy_(torch.cat([ours.q.bias, ours.kv.bias]))
        ref.out_proj.weight.copy_(ours.out.weight)
        ref.out_proj.bias.copy_(ours.out.bias)
    return ref.eval()


def _randomise_biases(module: nn.Module) -> None:
    # nn.Linear biases are small at init; larger ones make a bias/row mix-up visible.
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.Linear) and m.bias is not None:
                m.bias.normal_()


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_self_attention_equals_torch_multihead_attention(padded: bool, causal: bool, bias: bool) -> None:
    t = 6
    ours = MultiHeadAttention(D, H, bias=bias).eval()
    _randomise_biases(ours)
    ref = torch_mha_from_self_attention(ours, bias)
    x = torch.randn(B, t, D)
    lengths = torch.tensor([t, 4])  # right padding: the first key is always visible
    mask = lengths_mask(lengths, t) if padded else None
    # nn.MultiheadAttention masks say True = NOT allowed; ours say True = may attend.
    key_padding_mask = (torch.arange(t)[None, :] >= lengths[:, None]) if padded else None
    attn_mask = torch.ones(t, t, dtype=torch.bool).triu(diagonal=1) if causal else None

    with AttentionCapture(nn.ModuleDict({"self_attn": ours})) as cap:
        captured_out = ours(x, mask=mask, is_causal=causal)
    out = ours(x, mask=mask, is_causal=causal)
    expected, expected_w = ref(
        x, x, x, key_padding_mask=key_padding_mask, attn_mask=attn_mask, need_weights=True,
        average_attn_weights=False,
    )
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(captured_out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cap.layers("self_attn")[0], expected_w, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("padded", [False, True])
def test_cross_attention_equals_torch_multihead_attention(padded: bool) -> None:
    t, s = 4, 7
    ours = CrossAttention(D, H).eval()
    _randomise_biases(ours)
    ref = torch_mha_from_cross_attention(ours)
    x, memory = torch.randn(B, t, D), torch.randn(B, s, D)
    lengths = torch.tensor([s, 3])
    mask = lengths_mask(lengths, s) if padded else None
    key_padding_mask = (torch.arange(s)[None, :] >= lengths[:, None]) if padded else None
    expected, _ = ref(x, memory, memory, key_padding_mask=key_padding_mask, need_weights=False)
    torch.testing.assert_close(ours(x, memory, mask), expected, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------------------------
# Grouped-query attention equals full attention with repeated K/V projections


def _repeat_heads(weight: Tensor, n_kv_heads: int, group: int) -> Tensor:
    """(Hkv*Dh, ...) rows -> (H*Dh, ...): kv head j becomes query heads j*g .. j*g+g-1."""
    per_head = weight.reshape(n_kv_heads, DH, *weight.shape[1:])
    return per_head.repeat_interleave(group, dim=0).reshape(n_kv_heads * group * DH, *weight.shape[1:])


@pytest.mark.parametrize("n_kv_heads", [1, 2])
@pytest.mark.parametrize("causal", [False, True])
def test_gqa_self_attention_equals_mha_with_repeated_kv_weights(n_kv_heads: int, causal: bool) -> None:
    group = H // n_kv_heads
    gqa = MultiHeadAttention(D, H, n_kv_heads=n_kv_heads).eval()
    _randomise_biases(gqa)
    full = MultiHeadAttention(D, H, n_kv_heads=H).eval()
    kv_dim = n_kv_heads * DH
    with torch.no_grad():
        for name in ("weight", "bias"):
            q_p, k_p, v_p = getattr(gqa.qkv, name).split([D, kv_dim, kv_dim])
            rows = [q_p, _repeat_heads(k_p, n_kv_heads, group), _repeat_heads(v_p, n_kv_heads, group)]
            getattr(full.qkv, name).copy_(torch.cat(rows))
        full.out.load_state_dict(gqa.out.state_dict())
    x = torch.randn(B, 6, D)
    mask = lengths_mask(torch.tensor([6, 4]), 6)
    torch.testing.assert_close(
        gqa(x, mask=mask, is_causal=causal), full(x, mask=mask, is_causal=causal), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize("n_kv_heads", [1, 2])
def test_gqa_cross_attention_equals_mha_with_repeated_kv_weights(n_kv_heads: int) -> None:
    group = H // n_kv_heads
    gqa = CrossAttention(D, H, n_kv_heads=n_kv_heads).eval()
    _randomise_biases(gqa)
    full = CrossAttention(D, H).eval()
    kv_dim = n_kv_heads * DH
    with torch.no_grad():
        for name in ("weight", "bias"):
            k_p, v_p = getattr(gqa.kv, name).split([kv_dim, kv_dim])
            getattr(full.kv, name).copy_(torch.cat([_repeat_heads(k_p, n_kv_heads, group),
                                                    _repeat_heads(v_p, n_kv_heads, group)]))
        full.q.load_state_dict(gqa.q.state_dict())
        full.out.load_state_dict(gqa.out.state_dict())
    x, memory = torch.randn(B, 3, D), torch.randn(B, 5, D)
    mask = lengths_mask(torch.tensor([5, 2]), 5)
    torch.testing.assert_close(gqa(x, memory, mask), full(x, memory, mask), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n_kv_heads", [None, 2])
@pytest.mark.parametrize("t", [1, 3])
def test_cross_attention_with_shared_memory_rows_equals_repeated_memory(n_kv_heads: int | None, t: int) -> None:
    """Each memory row shared by G consecutive query rows (e.g. a search's hypotheses of one input): the
    same outputs (and captured weights) as repeating each memory row G times."""
    g, s = 3, 6
    ours = CrossAttention(D, H, n_kv_heads=n_kv_heads).eval()
    _randomise_biases(ours)
    x, memory = torch.randn(B * g, t, D), torch.randn(B, s, D)
    mask = lengths_mask(torch.tensor([s, 2]), s)  # (B, 1, 1, S)
    with AttentionCapture(ours) as grouped_cap:
        grouped = ours(x, memory, mask)
    with AttentionCapture(ours) as repeated_cap:
        repeated = ours(x, memory.repeat_interleave(g, 0), mask.repeat_interleave(g, 0))
    torch.testing.assert_close(grouped, repeated, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grouped_cap.weights[""][0], repeated_cap.weights[""][0])
    # Without capture SDPA runs (for t = 1 with the G queries as heads); the explicit path is the reference.
    torch.testing.assert_close(ours(x, memory, mask), repeated, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=r"memory rows \(2\) must divide query rows \(3\)"):
        ours(torch.randn(3, t, D), memory, mask)


# --------------------------------------------------------------------------------------------
# Invariants of whole stacks


def _encoder(positions: str = "sinusoidal", causal: bool = False, n_kv_heads: int | None = None) -> Encoder:
    return Encoder(D, H, n_kv_heads=n_kv_heads, n_layers=2, d_ff=2 * D, max_len=32, positions=positions,
                   causal=causal).eval()


@pytest.mark.parametrize("left_padded", [False, True])
@pytest.mark.parametrize("positions", ["sinusoidal", "alibi"])
def test_padded_keys_get_exactly_zero_weight(left_padded: bool, positions: str) -> None:
    t = 7
    lengths = torch.tensor([7, 3])
    enc = _encoder(positions)
    mask = lengths_mask(lengths, t, left_padded=left_padded)
    x = torch.randn(B, t, D)
    with AttentionCapture(enc) as cap:
        enc(x, mask)
    pos = torch.arange(t)
    is_pad = (pos[None, :] < t - lengths[:, None]) if left_padded else (pos[None, :] >= lengths[:, None])
    for w in cap.layers("self_attn"):
        pad_weights = w.permute(0, 3, 1, 2)[is_pad]  # (number of pad keys, H, Tq)
        assert pad_weights.numel() > 0
        assert bool((pad_weights == 0).all())

    # The fast path agrees: changing what sits in the padding changes no real position.
    x2 = x.clone()
    x2[is_pad] = torch.randn(int(is_pad.sum()), D)
    torch.testing.assert_close(enc(x2, mask)[~is_pad], enc(x, mask)[~is_pad], atol=1e-6, rtol=0)


def test_cross_attention_padded_source_gets_exactly_zero_weight() -> None:
    dec = Decoder(D, H, n_layers=2, d_ff=2 * D, positions="rope", max_len=32).eval()
    memory_mask = lengths_mask(torch.tensor([5, 2]), 5)
    with AttentionCapture(dec) as cap:
        dec(torch.randn(B, 4, D), torch.randn(B, 5, D), memory_mask)
    for w in cap.layers("cross_attn"):
        assert bool((w[1, :, :, 2:] == 0).all())
        assert bool((w[1, :, :, :2] > 0).all())


@pytest.mark.parametrize("n_kv_heads", [None, 1])
@pytest.mark.parametrize("positions", ["sinusoidal", "learned", "rope", "alibi", "none"])
def test_changing_a_future_token_leaves_earlier_outputs_unchanged(positions: str, n_kv_heads: int | None) -> None:
    t, changed = 8, 5
    enc = _encoder(positions, causal=True, n_kv_heads=n_kv_heads)
    x = torch.randn(B, t, D)
    x2 = x.clone()
    x2[:, changed] = torch.randn(B, D)
    out, out2 = enc(x), enc(x2)
    torch.testing.assert_close(out2[:, :changed], out[:, :changed], atol=1e-6, rtol=0)
    assert not torch.allclose(out2[:, changed:], out[:, changed:])  # the change does reach later steps


@pytest.mark.parametrize("positions", ["sinusoidal", "rope", "alibi"])
def test_decoder_future_target_token_leaves_earlier_outputs_unchanged(positions: str) -> None:
    t, changed = 6, 3
    dec = Decoder(D, H, n_layers=2, d_ff=2 * D, positions=positions, max_len=32).eval()
    y, memory = torch.randn(B, t, D), torch.randn(B, 5, D)
    y2 = y.clone()
    y2[:, changed] = torch.randn(B, D)
    out, out2 = dec(y, memory), dec(y2, memory)
    torch.testing.assert_close(out2[:, :changed], out[:, :changed], atol=1e-6, rtol=0)
    assert not torch.allclose(out2[:, changed:], out[:, changed:])


def test_bidirectional_encoder_without_positions_is_permutation_equivariant() -> None:
    t = 7
    enc = _encoder("none")
    x = torch.randn(B, t, D)
    perm = torch.randperm(t)
    torch.testing.assert_close(enc(x[:, perm]), enc(x)[:, perm], atol=1e-5, rtol=1e-5)


def test_encoder_with_positions_is_not_permutation_equivariant() -> None:
    # Guards the test above: with positions the same check must fail.
    enc = _encoder("sinusoidal")
    x = torch.randn(B, 7, D)
    perm = torch.tensor([6, 5, 4, 3, 2, 1, 0])
    assert not torch.allclose(enc(x[:, perm]), enc(x)[:, perm], atol=1e-3)


# --------------------------------------------------------------------------------------------
# Argument checks


@pytest.mark.parametrize("cls", [MultiHeadAttention, CrossAttention])
@pytest.mark.parametrize("d_model, n_heads", [(12, 5), (12, 0), (10, 4)])
def test_n_heads_must_divide_d_model(cls: type, d_model: int, n_heads: int) -> None:
    with pytest.raises(ValueError, match=rf"`n_heads` \({n_heads}\) must divide `d_model` \({d_model}\)"):
        cls(d_model, n_heads)


@pytest.mark.parametrize("cls", [MultiHeadAttention, CrossAttention])
@pytest.mark.parametrize("n_kv_heads", [3, 0, 8])
def test_n_kv_heads_must_divide_n_heads(cls: type, n_kv_heads: int) -> None:
    with pytest.raises(ValueError, match=rf"`n_kv_heads` \({n_kv_heads}\) must divide `n_heads` \(4\)"):
        cls(16, 4, n_kv_heads=n_kv_heads)


@pytest.mark.parametrize("dropout", [-0.1, 1.0])
def test_attention_dropout_out_of_range(dropout: float) -> None:
    with pytest.raises(ValueError, match="`dropout`"):
        MultiHeadAttention(16, 4, dropout=dropout)


@pytest.mark.parametrize("kv_heads, causal", [(H, False), (2, True)])
def test_cheap_attention_dropout_drops_weights_with_the_cpu_fastpath_mask(kv_heads: int, causal: bool) -> None:
    # Reference: the naive per-head loop, its weights times the mask `core.nn.cpu_fastpath.dropout_mask` draws from the
    # same seed, scaled by 1 / (1 - p): inverted dropout on the weights, as F.dropout would apply it.
    from core.nn.cpu_fastpath import dropout_mask, effective_p

    p, t = 0.3, 6
    g = torch.Generator().manual_seed(5)
    q = torch.randn(B, H, t, DH, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(B, kv_heads, t, DH, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    allowed = lengths_mask(torch.tensor([t, 4]), t, left_padded=causal)  # (B, 1, 1, Tk) padding mask
    if causal:  # left padding, as StreamRec's: the first two queries of row 1 see no key and must give 0
        allowed = allowed & torch.ones(t, t, dtype=torch.bool).tril()
    torch.manual_seed(11)
    out = attend(q, k, v, allowed, dropout_p=p, cheap_dropout=True)
    torch.manual_seed(11)
    keep = dropout_mask((B, H, t, t), p)
    assert 0 < (~keep).sum() < keep.numel()
    _, weights = naive_attention(q, k, v, allowed)
    weights = weights.nan_to_num(0.0)  # the naive softmax of a row with no key is NaN
    group = H // kv_heads
    want = (weights * keep / (1 - effective_p(p))) @ v.repeat_interleave(group, dim=1)
    torch.testing.assert_close(out, want)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    want_grads = torch.autograd.grad(want.square().sum(), (q, k, v))
    for got, ref in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, ref)
