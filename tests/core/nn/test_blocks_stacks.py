"""`core.nn.blocks` and `core.nn.stacks` against hand computations, plus their argument checks.

Legend: B batch, T time, S source, D model width, F feed-forward width, V vocabulary.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from core.nn.blocks import DecoderLayer, EncoderLayer, FeedForward, GatedResidual
from core.nn.stacks import Decoder, Encoder, TokenEmbedding, init_linear, tie_weights

B, T, D, H, FF = 2, 5, 16, 4, 24
POSITIONS = ["sinusoidal", "learned", "rope", "alibi", "none"]


def linear(x: Tensor, m: nn.Linear) -> Tensor:
    return x @ m.weight.T + m.bias


def layer_norm(x: Tensor, m: nn.LayerNorm) -> Tensor:
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)  # biased variance, as in the LayerNorm paper
    return (x - mean) / torch.sqrt(var + m.eps) * m.weight + m.bias


def _randomise(module: nn.Module) -> nn.Module:
    """Non-trivial norms and biases, so a swapped or skipped part shows in the output."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.3)
            elif isinstance(m, nn.Linear) and m.bias is not None:
                m.bias.normal_(0, 0.3)
    return module


# --------------------------------------------------------------------------------------------
# Feed-forward


def test_swiglu_feed_forward_equals_hand_computation() -> None:
    ff = _randomise(FeedForward(D, FF, activation="swiglu")).eval()
    assert ff.up.out_features == 2 * FF
    x = torch.randn(B, T, D, dtype=torch.float64)
    ff.double()
    w1, w2 = ff.up.weight[:FF], ff.up.weight[FF:]  # gate rows first, then value rows
    b1, b2 = ff.up.bias[:FF], ff.up.bias[FF:]
    gate = x @ w1.T + b1
    silu = gate / (1 + torch.exp(-gate))
    expected = linear(silu * (x @ w2.T + b2), ff.down)
    torch.testing.assert_close(ff(x), expected)


@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_feed_forward_equals_hand_computation(activation: str) -> None:
    ff = _randomise(FeedForward(D, FF, activation=activation)).double().eval()
    x = torch.randn(B, T, D, dtype=torch.float64)
    h = linear(x, ff.up)
    if activation == "gelu":
        h = 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))  # exact (erf) GELU
    else:
        h = torch.where(h > 0, h, torch.zeros_like(h))
    torch.testing.assert_close(ff(x), linear(h, ff.down))


def test_feed_forward_dropout_only_in_training() -> None:
    ff = FeedForward(D, FF, dropout=0.5)
    x = torch.randn(B, T, D)
    ff.eval()
    torch.testing.assert_close(ff(x), ff(x))
    ff.train()
    assert not torch.allclose(ff(x), ff.eval()(x))


def _ff_hidden_pairs(stack: nn.Module, *inputs: Tensor) -> list[tuple[Tensor, Tensor]]:
    """(activation of `ff.up`'s output, input of `ff.down`) for every layer's feed-forward, one train pass."""
    seen: dict[int, list[Tensor]] = {}
    hooks = []
    for i, layer in enumerate(stack.layers):
        hooks.append(layer.ff.up.register_forward_hook(lambda m, a, out, i=i: seen.setdefault(i, []).append(out)))
        hooks.append(layer.ff.down.register_forward_pre_hook(lambda m, a, i=i: seen.setdefault(i, []).append(a[0])))
    stack.train()(*inputs)
    for h in hooks:
        h.remove()
    return [(torch.relu(up), down) for up, down in (seen[i] for i in range(len(stack.layers)))]


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_ff_dropout_sets_the_feed_forward_dropout_apart_from_the_residual_one(kind: str) -> None:
    """fairseq-style recipes drop sublayer outputs (p 0.3) but not the feed-forward hidden (activation_dropout 0)."""
    torch.manual_seed(0)
    x, memory = torch.randn(B, T, D), torch.randn(B, T + 1, D)

    def build(**kw) -> nn.Module:
        if kind == "encoder":
            return Encoder(D, H, n_layers=2, d_ff=FF, max_len=T, dropout=0.3, activation="relu", **kw)
        return Decoder(D, H, n_layers=2, d_ff=FF, max_len=T, dropout=0.3, activation="relu", **kw)

    args = (x,) if kind == "encoder" else (x, memory)
    for relu, hidden in _ff_hidden_pairs(build(ff_dropout=0.0), *args):
        torch.testing.assert_close(hidden, relu)  # the hidden reaches `down` untouched
    for relu, hidden in _ff_hidden_pairs(build(), *args):  # None: the hidden is dropped with p = dropout
        kept = hidden != 0
        dropped = (relu > 0) & ~kept
        assert 0.15 < dropped.sum() / (relu > 0).sum() < 0.45
        torch.testing.assert_close(hidden[kept], relu[kept] / (1 - 0.3))  # nn.Dropout's scale
    stack = build(ff_dropout=0.0).train()
    assert not torch.allclose(stack(*args), stack(*args))  # the residual dropout still acts


# --------------------------------------------------------------------------------------------
# Layers


def test_post_ln_encoder_layer_equals_hand_computation() -> None:
    layer = _randomise(EncoderLayer(D, H, d_ff=FF, dropout=0.0, norm_first=False)).double().eval()
    x = torch.randn(B, T, D, dtype=torch.float64)
    mask = torch.tensor([[True] * T, [True] * 3 + [False] * 2])[:, None, None, :]
    h = layer_norm(x + layer.self_attn(x, mask), layer.attn_block.norm)
    expected = layer_norm(h + layer.ff(h), layer.ff_block.norm)
    torch.testing.assert_close(layer(x, mask), expected)


@pytest.mark.parametrize("is_causal", [False, True])
def test_pre_ln_encoder_layer_equals_hand_computation(is_causal: bool) -> None:
    layer = _randomise(EncoderLayer(D, H, d_ff=FF, dropout=0.0)).double().eval()
    x = torch.randn(B, T, D, dtype=torch.float64)
    h = x + layer.self_attn(layer_norm(x, layer.attn_block.norm), is_causal=is_causal)
    expected = h + layer.ff(layer_norm(h, layer.ff_block.norm))
    torch.testing.assert_close(layer(x, is_causal=is_causal), expected)


def test_gated_residual_encoder_layer_equals_hand_computation() -> None:
    """LiGR's residual: x + sigmoid(x G + c) * f(norm(x)), the gate read from the sublayer's input before its norm."""
    layer = _randomise(EncoderLayer(D, H, d_ff=FF, dropout=0.0, residual=GatedResidual)).double().eval()
    x = torch.randn(B, T, D, dtype=torch.float64)

    def gate(h: Tensor, linear: nn.Linear) -> Tensor:
        return 1.0 / (1.0 + torch.exp(-(h @ linear.weight.T + linear.bias)))

    h = x + gate(x, layer.attn_block.gate) * layer.self_attn(layer_norm(x, layer.attn_block.norm), is_causal=True)
    expected = h + gate(h, layer.ff_block.gate) * layer.ff(layer_norm(h, layer.ff_block.norm))
    torch.testing.assert_close(layer(x, is_causal=True), expected)
    # `last`: the final layer computes only the last positions, gated from those positions' own inputs
    torch.testing.assert_close(layer(x, is_causal=True, last=2), expected[:, -2:])
    with pytest.raises(ValueError, match="pre-LN"):
        EncoderLayer(D, H, d_ff=FF, norm_first=False, residual=GatedResidual)


@pytest.mark.parametrize("norm_first", [True, False])
def test_decoder_layer_equals_hand_computation(norm_first: bool) -> None:
    layer = _randomise(DecoderLayer(D, H, d_ff=FF, dropout=0.0, norm_first=norm_first)).double().eval()
    x, memory = torch.randn(B, T, D, dtype=torch.float64), torch.randn(B, 7, D, dtype=torch.float64)
    memory_mask = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])[:, None, None, :]

    def sub(h: Tensor, fn, norm: nn.LayerNorm) -> Tensor:
        return h + fn(layer_norm(h, norm)) if norm_first else layer_norm(h + fn(h), norm)

    h = sub(x, lambda a: layer.self_attn(a, is_causal=True), layer.self_block.norm)
    h = sub(h, lambda a: layer.cross_attn(a, memory, memory_mask), layer.cross_block.norm)
    expected = sub(h, layer.ff, layer.ff_block.norm)
    torch.testing.assert_close(layer(x, memory, memory_mask), expected)


# --------------------------------------------------------------------------------------------
# Stacks


def test_encoder_equals_its_layers_over_sinusoid_inputs() -> None:
    enc = _randomise(Encoder(D, H, n_layers=2, d_ff=FF, max_len=T, positions="sinusoidal")).double().eval()
    x = torch.randn(B, T, D, dtype=torch.float64)
    pos = torch.arange(T, dtype=torch.float64)[:, None]
    i = torch.arange(0, D, 2, dtype=torch.float64)
    pe = torch.zeros(T, D, dtype=torch.float64)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(pos / 10000 ** (i / D)), torch.cos(pos / 10000 ** (i / D))
    h = x + pe
    for layer in enc.layers:
        h = layer(h)
    torch.testing.assert_close(enc(x), layer_norm(h, enc.norm), atol=1e-6, rtol=1e-6)


def _left_padded_mask() -> Tensor:
    """(B, 1, 1, T) key mask: row 0 full, row 1 with two left pads."""
    lengths = torch.tensor([T, T - 2])
    return (torch.arange(T)[None, :] >= (T - lengths)[:, None])[:, None, None, :]


@pytest.mark.parametrize("positions", POSITIONS)
def test_causal_encoder_with_padding_equals_its_layers_given_boolean_masks(positions: str) -> None:
    """The stack folds causality and padding into one float mask; its layers, given the boolean
    mask and `is_causal`, are the reference."""
    torch.manual_seed(0)
    enc = _randomise(Encoder(D, H, n_layers=2, d_ff=FF, max_len=T, positions=positions, causal=True)).double().eval()
    x, mask = torch.randn(B, T, D, dtype=torch.float64), _left_padded_mask()
    h = x if enc.additive is None else enc.additive(x, 0)
    bias = None if enc.alibi is None else enc.alibi(T, T, device=x.device).double()
    for layer in enc.layers:
        h = layer(h, mask, is_causal=True, rope=enc.rope, bias=bias)
    real = mask[:, 0, 0, :, None]  # rows of real queries; pad queries see no key in the reference
    torch.testing.assert_close(enc(x, mask) * real, layer_norm(h, enc.norm) * real, atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("causal, norm_first", [(True, True), (False, True), (True, False)])
@pytest.mark.parametrize("last", [1, 3])
def test_encoder_last_positions_equal_the_tail_of_the_full_output(
    positions: str, causal: bool, norm_first: bool, last: int
) -> None:
    torch.manual_seed(0)
    enc = Encoder(D, H, n_layers=2, d_ff=FF, max_len=T, positions=positions, causal=causal, norm_first=norm_first)
    enc = _randomise(enc).double().eval()
    x, mask = torch.randn(B, T, D, dtype=torch.float64), _left_padded_mask()
    full = enc(x, mask)
    out = enc(x, mask, last=last)
    assert out.shape == (B, last, D)
    torch.testing.assert_close(out, full[:, -last:], atol=1e-9, rtol=1e-9)


def test_causal_encoder_under_bf16_autocast_tracks_fp32() -> None:
    torch.manual_seed(0)
    enc = Encoder(D, H, n_layers=2, d_ff=FF, max_len=T, positions="learned", causal=True).eval()
    x, mask = torch.randn(B, T, D), _left_padded_mask()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = enc(x, mask).float()
    real = mask[:, 0, 0, :, None]
    assert ((low - enc(x, mask)).abs() * real).max() < 0.1


def test_post_ln_stack_has_no_final_norm() -> None:
    enc = Encoder(D, H, n_layers=2, d_ff=FF, max_len=T, norm_first=False, positions="none").eval()
    x = torch.randn(B, T, D)
    h = x
    for layer in enc.layers:
        h = layer(h)
    torch.testing.assert_close(enc(x), h)


def test_stacks_initialise_linears_xavier_uniform_with_zero_bias() -> None:
    for stack in (Encoder(D, H, n_layers=2, d_ff=FF, max_len=T), Decoder(D, H, n_layers=2, d_ff=FF, max_len=T)):
        linears = [m for m in stack.modules() if isinstance(m, nn.Linear)]
        assert linears
        for m in linears:
            bound = math.sqrt(6.0 / (m.in_features + m.out_features))
            assert float(m.weight.detach().abs().max()) <= bound
            assert float(m.weight.detach().abs().max()) > 0.5 * bound  # spread over the range, not tiny
            assert bool((m.bias == 0).all())


def test_init_linear_resets_every_linear() -> None:
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Sequential(nn.Linear(4, 30)))
    init_linear(model)
    for m in (model[0], model[2][0]):
        assert float(m.weight.detach().abs().max()) <= math.sqrt(6.0 / (m.in_features + m.out_features))
        assert bool((m.bias == 0).all())


# --------------------------------------------------------------------------------------------
# Embeddings


def test_token_embedding_scales_by_sqrt_d_and_zeros_pad() -> None:
    emb = TokenEmbedding(11, D, pad_id=3)
    ids = torch.tensor([[1, 3, 10], [3, 0, 5]])
    expected = emb.embedding.weight.detach()[ids] * math.sqrt(D)
    torch.testing.assert_close(emb(ids), expected)
    assert bool((emb.weight[3] == 0).all())
    assert bool((emb(ids)[ids == 3] == 0).all())
    emb(ids).sum().backward()
    assert bool((emb.weight.grad[3] == 0).all())  # the pad row stays zero under training
    assert bool((emb.weight.grad[1] != 0).all())


def test_token_embedding_init_has_unit_variance_after_scaling() -> None:
    emb = TokenEmbedding(4000, 64, pad_id=None)
    with torch.no_grad():
        assert abs(float(emb.weight.std()) - 64**-0.5) < 0.05 * 64**-0.5
        assert abs(float(emb(torch.arange(4000)).std()) - 1.0) < 0.05
        assert bool((emb.weight[0] != 0).any())  # no pad row when pad_id is None


def test_tie_weights_shares_the_parameter() -> None:
    emb = TokenEmbedding(11, D, pad_id=0)
    out = nn.Linear(D, 11, bias=False)
    tie_weights(out, emb)
    assert out.weight is emb.embedding.weight
    assert out.weight is emb.weight
    h = torch.randn(B, D)
    torch.testing.assert_close(out(h), h @ emb.weight.T)
    with torch.no_grad():
        emb.embedding.weight[5].fill_(2.0)
    assert bool((out.weight[5] == 2.0).all())
    assert sum(1 for _ in nn.ModuleList([emb, out]).parameters()) == 1


@pytest.mark.parametrize("shape", [(D, 12), (D + 1, 11)])
def test_tie_weights_rejects_shape_mismatch(shape: tuple[int, int]) -> None:
    with pytest.raises(ValueError, match="cannot tie"):
        tie_weights(nn.Linear(*shape, bias=False), TokenEmbedding(11, D, pad_id=0))


# --------------------------------------------------------------------------------------------
# Argument checks


def _stack(kind: str, **kwargs) -> nn.Module:
    args = {"d_model": D, "n_heads": H, "n_layers": 1, "d_ff": FF, "max_len": T} | kwargs
    return Encoder(**args) if kind == "encoder" else Decoder(**args)


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("d_model, n_heads", [(12, 5), (12, 8), (12, 0)])
def test_stack_n_heads_must_divide_d_model(kind: str, positions: str, d_model: int, n_heads: int) -> None:
    """The n_heads check must win over position set-up that derives a head width from it.

    With RoPE, `d_model // n_heads` is taken before the layers check `n_heads`: (12, 8) reports
    "even head dimension, got 1" and (12, 0) raises ZeroDivisionError; ALiBi with 0 heads
    fails inside `math.log2` ("math domain error").
    """
    with pytest.raises(ValueError, match=rf"`n_heads` \({n_heads}\) must divide `d_model` \({d_model}\)"):
        _stack(kind, d_model=d_model, n_heads=n_heads, positions=positions)


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_stack_n_kv_heads_must_divide_n_heads(kind: str) -> None:
    with pytest.raises(ValueError, match=r"`n_kv_heads` \(3\) must divide `n_heads` \(4\)"):
        _stack(kind, n_kv_heads=3)


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_rope_rejects_odd_head_dim(kind: str) -> None:
    with pytest.raises(ValueError, match=r"even head dimension, got 3.*`n_heads`"):
        _stack(kind, d_model=12, n_heads=4, positions="rope")
    _stack(kind, d_model=12, n_heads=4, positions="alibi")  # odd head width is fine without RoPE


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_sinusoidal_rejects_odd_d_model(kind: str) -> None:
    with pytest.raises(ValueError, match="`d_model`"):
        _stack(kind, d_model=9, n_heads=3, positions="sinusoidal")


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
@pytest.mark.parametrize("positions", POSITIONS)
def test_sequence_longer_than_max_len_raises(kind: str, positions: str) -> None:
    model = _stack(kind, positions=positions, max_len=8, dropout=0.0).eval()
    memory = torch.randn(1, 3, D)

    def run(x: Tensor, cache=None) -> Tensor:
        return model(x, cache=cache) if kind == "encoder" else model(x, memory, cache=cache)

    run(torch.randn(1, 8, D))  # exactly max_len is fine
    with pytest.raises(ValueError, match=r"position 9 but `max_len` is 8"):
        run(torch.randn(1, 9, D))
    if kind == "encoder":
        model = _stack(kind, positions=positions, max_len=8, causal=True).eval()
    cache = model.new_cache()
    run(torch.randn(1, 6, D), cache)
    with pytest.raises(ValueError, match=r"position 9 but `max_len` is 8"):
        run(torch.randn(1, 3, D), cache)  # the cache offset counts towards max_len


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
@pytest.mark.parametrize("positions", ["absolute", "ROPE", ""])
def test_unknown_positions_raise(kind: str, positions: str) -> None:
    with pytest.raises(ValueError, match="`positions`"):
        _stack(kind, positions=positions)


@pytest.mark.parametrize("activation", ["silu", "GELU", "swish"])
def test_unknown_activation_raises(activation: str) -> None:
    with pytest.raises(ValueError, match="`activation`"):
        FeedForward(D, FF, activation=activation)
    with pytest.raises(ValueError, match="`activation`"):
        EncoderLayer(D, H, d_ff=FF, activation=activation)
    with pytest.raises(ValueError, match="`activation`"):
        Encoder(D, H, n_layers=1, d_ff=FF, max_len=T, activation=activation)
    with pytest.raises(ValueError, match="`activation`"):
        Decoder(D, H, n_layers=1, d_ff=FF, max_len=T, activation=activation)


def test_token_embedding_init_std_sets_the_spread_and_keeps_padding_zero():
    emb = TokenEmbedding(20_000, 32, pad_id=0, init_std=0.01)
    rows = emb.weight[1:]
    assert abs(rows.std().item() - 0.01) < 5e-4  # 640k draws: the sample std is within 1% of 0.01
    assert torch.equal(emb.weight[0], torch.zeros(32))
    default = TokenEmbedding(20_000, 32, pad_id=0)
    assert abs(default.weight[1:].std().item() - 32**-0.5) < 5e-3
    with pytest.raises(ValueError, match="init_std"):
        TokenEmbedding(10, 4, pad_id=0, init_std=0.0)
