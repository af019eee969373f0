"""KV-cached incremental decoding equals full recomputation; the caches keep and reorder
their contents.

Legend: B batch, T time, S source, D model width, Hkv key/value heads, Dh head width.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from core.nn.explain import AttentionCapture
from core.nn.kv_cache import DecoderCache, KVCache, StaticKV
from core.nn.masks import lengths_mask
from core.nn.stacks import Decoder, Encoder

B, D, H, STEPS = 3, 16, 4, 50
POSITIONS = ["sinusoidal", "rope", "alibi", "learned"]
CHUNKS = [1, 3, 7, 2, 16, 5, 1, 9, 6]  # sums to 50; crosses the 16- and 32-step capacities mid-chunk
TOL = {"atol": 1e-10, "rtol": 1e-8}  # float64: cached and full paths agree to rounding


def _causal_encoder(positions: str, n_kv_heads: int | None = None) -> Encoder:
    enc = Encoder(D, H, n_kv_heads=n_kv_heads, n_layers=2, d_ff=2 * D, max_len=64, positions=positions, causal=True)
    return enc.double().eval()


def _decoder(positions: str, n_kv_heads: int | None = None) -> Decoder:
    return Decoder(D, H, n_kv_heads=n_kv_heads, n_layers=2, d_ff=2 * D, max_len=64, positions=positions).double().eval()


def _decode_in_chunks(step, x: Tensor, chunks: list[int]) -> Tensor:
    """Feed x (B, T, D) chunk by chunk through step(chunk) and concatenate the outputs."""
    assert sum(chunks) == x.shape[1]
    outs, start = [], 0
    for size in chunks:
        outs.append(step(x[:, start : start + size]))
        start += size
    return torch.cat(outs, dim=1)


# --------------------------------------------------------------------------------------------
# Causal encoder (decoder-only stack)


@pytest.mark.parametrize("n_kv_heads", [None, 2])
@pytest.mark.parametrize("chunks", [[1] * STEPS, CHUNKS], ids=["one_step", "chunks"])
@pytest.mark.parametrize("positions", POSITIONS)
def test_causal_encoder_cached_decoding_equals_full(positions: str, chunks: list[int], n_kv_heads: int | None) -> None:
    enc = _causal_encoder(positions, n_kv_heads)
    x = torch.randn(B, STEPS, D, dtype=torch.float64)
    with torch.no_grad():
        full = enc(x)
        cache = enc.new_cache()
        cached = _decode_in_chunks(lambda chunk: enc(chunk, cache=cache), x, chunks)
    assert cache.offset == STEPS
    torch.testing.assert_close(cached, full, **TOL)


def test_bidirectional_encoder_refuses_a_cache() -> None:
    with pytest.raises(ValueError, match="causal"):
        Encoder(D, H, n_layers=1, d_ff=2 * D, max_len=8).new_cache()


@pytest.mark.parametrize("positions", POSITIONS)
def test_causal_encoder_reorder_mid_way_equals_full_on_reordered_inputs(positions: str) -> None:
    enc = _causal_encoder(positions)
    split = 20
    x = torch.randn(B, STEPS, D, dtype=torch.float64)
    index = torch.tensor([2, 0, 0])  # beam-search style: drop row 1, duplicate row 0
    # The reordered batch keeps its history and then continues with fresh inputs.
    x_new = torch.cat([x[index, :split], torch.randn(B, STEPS - split, D, dtype=torch.float64)], dim=1)
    with torch.no_grad():
        cache = enc.new_cache()
        before = _decode_in_chunks(lambda c: enc(c, cache=cache), x[:, :split], [1] * split)
        cache.reorder(index)
        after = _decode_in_chunks(lambda c: enc(c, cache=cache), x_new[:, split:], [1] * (STEPS - split))
        full = enc(x_new)
    torch.testing.assert_close(before[index], full[:, :split], **TOL)
    torch.testing.assert_close(after, full[:, split:], **TOL)


# --------------------------------------------------------------------------------------------
# Encoder-decoder


def _source(s: int = 7) -> tuple[Tensor, Tensor]:
    memory = torch.randn(B, s, D, dtype=torch.float64)
    memory_mask = lengths_mask(torch.tensor([s, 4, 2]), s)  # padded sources
    return memory, memory_mask


@pytest.mark.parametrize("n_kv_heads", [None, 1])
@pytest.mark.parametrize("chunks", [[1] * STEPS, CHUNKS], ids=["one_step", "chunks"])
@pytest.mark.parametrize("positions", ["rope", "sinusoidal", "alibi", "learned"])
def test_decoder_cached_decoding_equals_full(positions: str, chunks: list[int], n_kv_heads: int | None) -> None:
    dec = _decoder(positions, n_kv_heads)
    memory, memory_mask = _source()
    y = torch.randn(B, STEPS, D, dtype=torch.float64)
    with torch.no_grad():
        full = dec(y, memory, memory_mask)
        cache = dec.new_cache()
        cached = _decode_in_chunks(lambda c: dec(c, memory, memory_mask, cache=cache), y, chunks)
    torch.testing.assert_close(cached, full, **TOL)


def test_decoder_cross_cache_is_used_after_the_first_step() -> None:
    # After the first call the encoder K/V come from the cache, so `memory` is not read again.
    dec = _decoder("rope")
    memory, memory_mask = _source()
    y = torch.randn(B, 6, D, dtype=torch.float64)
    with torch.no_grad():
        full = dec(y, memory, memory_mask)
        cache = dec.new_cache()
        first = dec(y[:, :1], memory, memory_mask, cache=cache)
        rest = dec(y[:, 1:], torch.full_like(memory, float("nan")), memory_mask, cache=cache)
    torch.testing.assert_close(torch.cat([first, rest], dim=1), full, **TOL)


@pytest.mark.parametrize("positions", ["rope", "sinusoidal"])
def test_decoder_cache_reorder_mid_way_equals_full_on_reordered_inputs(positions: str) -> None:
    dec = _decoder(positions)
    split = 20
    memory, memory_mask = _source()
    y = torch.randn(B, STEPS, D, dtype=torch.float64)
    index = torch.tensor([1, 1, 2])
    y_new = torch.cat([y[index, :split], torch.randn(B, STEPS - split, D, dtype=torch.float64)], dim=1)
    with torch.no_grad():
        cache = dec.new_cache()
        before = _decode_in_chunks(lambda c: dec(c, memory, memory_mask, cache=cache), y[:, :split], [1] * split)
        cache.reorder(index)
        # The caller reorders its own source mask; the cached cross K/V are reordered by the cache.
        mem_new, mask_new = memory[index], memory_mask[index]
        after = _decode_in_chunks(
            lambda c: dec(c, mem_new, mask_new, cache=cache), y_new[:, split:], [1] * (STEPS - split)
        )
        full = dec(y_new, mem_new, mask_new)
    torch.testing.assert_close(before[index], full[:, :split], **TOL)
    torch.testing.assert_close(after, full[:, split:], **TOL)


def test_captured_weights_of_incremental_decoding_equal_full_capture() -> None:
    # Per-step rows, right-padded with zeros to the final key length, form the causal matrix.
    enc = _causal_encoder("rope")
    x = torch.randn(2, 9, D, dtype=torch.float64)
    with torch.no_grad(), AttentionCapture(enc) as full_cap:
        enc(x)
    cache = enc.new_cache()
    with torch.no_grad(), AttentionCapture(enc) as step_cap:
        _decode_in_chunks(lambda c: enc(c, cache=cache), x, [1, 3, 1, 4])
    for stepwise, full in zip(step_cap.layers(), full_cap.layers(), strict=True):
        assert stepwise.shape == (2, H, 9, 9)
        torch.testing.assert_close(stepwise, full, atol=1e-6, rtol=1e-5)


# --------------------------------------------------------------------------------------------
# The cache classes on their own


def test_kv_cache_grows_past_initial_capacity_and_keeps_contents() -> None:
    cache = KVCache()
    ks, vs = [], []
    for t in range(40):  # initial capacity is 16; grows at least twice
        k, v = torch.randn(2, 3, 1, 4), torch.randn(2, 3, 1, 4)
        ks.append(k)
        vs.append(v)
        all_k, all_v = cache.append(k, v)
        assert cache.length == t + 1
        assert torch.equal(all_k, torch.cat(ks, dim=2))
        assert torch.equal(all_v, torch.cat(vs, dim=2))


def test_kv_cache_appends_chunks_larger_than_capacity() -> None:
    cache = KVCache()
    chunks = [torch.randn(1, 2, n, 4) for n in (5, 30, 1, 40)]
    for i, c in enumerate(chunks):
        all_k, all_v = cache.append(c, -c)
        expected = torch.cat(chunks[: i + 1], dim=2)
        assert torch.equal(all_k, expected)
        assert torch.equal(all_v, -expected)
    assert cache.length == 76


def test_kv_cache_value_width_may_differ_from_key_width() -> None:
    cache = KVCache()
    for _ in range(20):
        k_all, v_all = cache.append(torch.randn(1, 1, 1, 4), torch.randn(1, 1, 1, 6))
    assert k_all.shape == (1, 1, 20, 4) and v_all.shape == (1, 1, 20, 6)


def test_kv_cache_reorder_selects_rows_and_keeps_growing() -> None:
    cache = KVCache()
    first = torch.randn(3, 2, 10, 4)
    cache.append(first, first + 1)
    index = torch.tensor([2, 2, 0, 1])
    cache.reorder(index)
    second = torch.randn(4, 2, 30, 4)  # forces growth after the reorder
    k, v = cache.append(second, second + 1)
    expected = torch.cat([first[index], second], dim=2)
    assert torch.equal(k, expected)
    assert torch.equal(v, expected + 1)


@pytest.mark.parametrize("index", [[0, 1, 1, 3, 4, 5], [0, 2, 1, 3, 4, 5], [5, 4, 3, 2, 1, 0], [0, 1, 2, 3, 4, 5]],
                         ids=["one_row_copied", "two_rows_swapped", "all_moved", "none_moved"])
def test_same_size_reorder_copies_only_the_changed_rows_in_place(index: list[int]) -> None:
    """Beam search's reorder: fewer than half the rows changing are copied in place, the rest keeps its
    memory; the contents equal a plain row selection either way, and appending afterwards still works."""
    cache = DecoderCache(2, cross=False, capacity=8)
    steps = [torch.randn(6, 2, 3, 4) for _ in cache.self_attn]
    for c, x in zip(cache.self_attn, steps, strict=True):
        c.append(x, x + 1)
    before = cache.self_attn[0]._k
    index_t = torch.tensor(index)
    cache.reorder_self(index_t)
    changed = sum(i != r for r, i in enumerate(index))
    assert (cache.self_attn[0]._k is before) == (2 * changed < len(index))
    for c, x in zip(cache.self_attn, steps, strict=True):
        new = torch.randn(6, 2, 1, 4)
        k, v = c.append(new, new + 1)
        assert torch.equal(k, torch.cat([x[index_t], new], dim=2))
        assert torch.equal(v, torch.cat([x[index_t] + 1, new + 1], dim=2))


def test_empty_caches_reorder_and_stay_usable() -> None:
    """Beam search reorders before the first step; an empty cache must stay empty and accept the first append."""
    kv = KVCache()
    kv.reorder(torch.tensor([1, 0]))
    k = torch.randn(2, 1, 3, 4)
    got_k, got_v = kv.append(k, k + 1)
    assert torch.equal(got_k, k) and torch.equal(got_v, k + 1)  # nothing left over from the reorder
    static = StaticKV()
    static.reorder(torch.tensor([0]))
    assert not static.is_set
    cache = DecoderCache(2)
    cache.reorder(torch.tensor([0]))
    assert cache.offset == 0


def test_static_kv_set_and_reorder() -> None:
    cache = StaticKV()
    assert not cache.is_set
    k, v = torch.randn(3, 2, 5, 4), torch.randn(3, 2, 5, 4)
    cache.set(k, v)
    assert cache.is_set
    index = torch.tensor([1, 0])
    cache.reorder(index)
    assert torch.equal(cache.k, k[index]) and torch.equal(cache.v, v[index])


def test_decoder_cache_layout_and_offset() -> None:
    cache = DecoderCache(3)
    assert len(cache.self_attn) == 3 and cache.cross_attn is not None and len(cache.cross_attn) == 3
    assert DecoderCache(2, cross=False).cross_attn is None
    assert cache.offset == 0
    for layer in cache.self_attn:
        layer.append(torch.randn(1, 1, 4, 2), torch.randn(1, 1, 4, 2))
    assert cache.offset == 4


def test_decoder_cache_reorders_self_and_cross_rows_separately() -> None:
    def filled() -> DecoderCache:
        torch.manual_seed(0)
        cache = DecoderCache(2)
        for layer in range(2):
            cache.self_attn[layer].append(torch.randn(3, 1, 4, 2), torch.randn(3, 1, 4, 2))
            cache.cross_attn[layer].set(torch.randn(3, 1, 5, 2), torch.randn(3, 1, 5, 2))
        return cache

    def self_keys(cache: DecoderCache, layer: int) -> Tensor:
        return cache.self_attn[layer].append(torch.zeros(3, 1, 0, 2), torch.zeros(3, 1, 0, 2))[0]  # no new step

    index = torch.tensor([2, 0, 0])
    original, only_self, only_cross, both = filled(), filled(), filled(), filled()
    only_self.reorder_self(index)
    only_cross.reorder_cross(index)
    both.reorder(index)
    for layer in range(2):
        k_self, k_cross = self_keys(original, layer), original.cross_attn[layer].k
        assert torch.equal(self_keys(only_self, layer), k_self[index])
        assert torch.equal(only_self.cross_attn[layer].k, k_cross)
        assert torch.equal(self_keys(only_cross, layer), k_self)
        assert torch.equal(only_cross.cross_attn[layer].k, k_cross[index])
        assert torch.equal(self_keys(both, layer), k_self[index])
        assert torch.equal(both.cross_attn[layer].k, k_cross[index])
