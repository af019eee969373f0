"""The recurrent encoder and attentional decoder: step-by-step decoding equals the teacher-forced pass, padding
never reaches the encoder's states, shared memory rows equal repeated ones, and the cache reorders like
`DecoderCache`."""

from __future__ import annotations

import pytest
import torch

from core.nn import AttentionCapture, padding_mask
from core.nn.recurrent import RecurrentCache, RecurrentDecoder, RecurrentEncoder

D, H = 8, 6


def _decoder(cell: str, attention: str = "additive") -> RecurrentDecoder:
    torch.manual_seed(0)
    return RecurrentDecoder(D, D if attention == "dot" else H, n_layers=2, cell=cell, attention=attention).eval()


def _inputs(b: int = 3, s: int = 5, t: int = 4):
    g = torch.Generator().manual_seed(1)
    memory = torch.randn(b, s, D, generator=g)
    src = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 0, 0, 0], [5, 0, 0, 0, 0]])[:b, :s]
    return torch.randn(b, t, D, generator=g), memory, padding_mask(src, 0)


@pytest.mark.parametrize(("cell", "attention"), [("gru", "additive"), ("lstm", "general"), ("gru", "dot")])
def test_step_by_step_equals_teacher_forced(cell, attention):
    dec = _decoder(cell, attention)
    x, memory, mask = _inputs()
    full = dec(x, memory, mask)
    cache = dec.new_cache()
    steps = torch.cat([dec(x[:, t : t + 1], memory, mask, cache) for t in range(x.shape[1])], dim=1)
    torch.testing.assert_close(steps, full)


def test_shared_memory_rows_equal_repeated_rows_and_reorder_follows_the_rows():
    dec = _decoder("lstm")
    x, memory, mask = _inputs()
    g = 2
    shared, repeated = dec.new_cache(), dec.new_cache()
    out_shared = dec(x[:, :2].repeat_interleave(g, 0), memory, mask, shared)  # (B*G, 2, D) over B memory rows
    out_rep = dec(x[:, :2].repeat_interleave(g, 0), memory.repeat_interleave(g, 0), mask.repeat_interleave(g, 0),
                  repeated)
    torch.testing.assert_close(out_shared, out_rep)
    index = torch.tensor([1, 1, 0, 5, 4, 4])  # beams swap and duplicate within their sentence
    shared.reorder_self(index)
    repeated.reorder_self(index)
    torch.testing.assert_close(dec(x[:, 2:3].repeat_interleave(g, 0), memory, mask, shared),
                               dec(x[:, 2:3].repeat_interleave(g, 0), memory.repeat_interleave(g, 0),
                                   mask.repeat_interleave(g, 0), repeated))
    kept = torch.tensor([0, 2])  # sentence 1 finished: its memory row and its two target rows leave
    shared.reorder_cross(kept)
    shared.reorder_self(torch.tensor([0, 1, 4, 5]))
    alone = dec(x[:, 3:4].repeat_interleave(g, 0)[[0, 1, 4, 5]], memory[kept], mask[kept], shared)
    assert alone.shape == (4, 1, D)


def test_reorder_selects_rows_of_every_state():
    cache = RecurrentCache()
    cache.reorder_self(torch.tensor([0]))  # empty: nothing to do
    cache.state = (torch.arange(6.0).view(1, 3, 2), torch.zeros(1, 3, 2))
    cache.feed, cache.keys = torch.arange(3.0)[:, None], torch.arange(3.0)[:, None, None]
    cache.reorder(torch.tensor([2, 0]))
    assert cache.state[0][0, :, 0].tolist() == [4.0, 0.0] and cache.feed[:, 0].tolist() == [2.0, 0.0]
    assert cache.keys[:, 0, 0].tolist() == [2.0, 0.0]


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_encoder_ignores_padding(cell):
    torch.manual_seed(0)
    enc = RecurrentEncoder(D, H, n_layers=2, cell=cell).eval()
    src = torch.tensor([[5, 6, 7, 0, 0]])
    x = torch.randn(1, 5, D)
    out = enc(x, padding_mask(src, 0))
    other = x.clone()
    other[:, 3:] = torch.randn(1, 2, D)  # different vectors at the padded positions
    torch.testing.assert_close(enc(other, padding_mask(src, 0)), out)
    torch.testing.assert_close(out[:, :3], enc(x[:, :3], padding_mask(src[:, :3], 0)))
    assert out[:, 3:].abs().max() == 0


def test_capture_records_one_head_of_weights_that_sum_to_one_over_real_tokens():
    dec = _decoder("gru")
    x, memory, mask = _inputs()
    with AttentionCapture(dec) as cap:
        dec(x, memory, mask)
    (weights,) = cap.layers("cross_attn")
    assert weights.shape == (3, 1, 4, 5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 1, 4))
    assert weights[1, :, :, 2:].abs().max() == 0 and weights[2, :, :, 1:].abs().max() == 0


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="`cell`"):
        RecurrentDecoder(D, H, cell="rnn")
    with pytest.raises(ValueError, match="`attention`"):
        RecurrentDecoder(D, H, attention="cosine")
