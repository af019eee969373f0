"""`core.nn.masks` against hand-written tensors (True = may attend)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.nn.masks import additive_mask, causal_mask, causal_padding_mask, combine_masks, lengths_mask, padding_mask

T, F = True, False


def test_causal_mask_square_is_lower_triangle() -> None:
    expected = torch.tensor([
        [T, F, F, F],
        [T, T, F, F],
        [T, T, T, F],
        [T, T, T, T],
    ])
    assert torch.equal(causal_mask(4), expected)
    assert torch.equal(causal_mask(4, 4), expected)


def test_causal_mask_is_aligned_to_the_end_of_the_keys() -> None:
    # 2 new queries after 3 cached keys sit at absolute positions 3 and 4.
    expected = torch.tensor([
        [T, T, T, T, F],
        [T, T, T, T, T],
    ])
    assert torch.equal(causal_mask(2, 5), expected)
    assert torch.equal(causal_mask(1, 5), torch.ones(1, 5, dtype=torch.bool))


@settings(max_examples=40, deadline=None)
@given(t_q=st.integers(1, 9), extra=st.integers(0, 9))
def test_causal_mask_matches_absolute_positions(t_q: int, extra: int) -> None:
    t_k = t_q + extra
    mask = causal_mask(t_q, t_k)
    assert mask.shape == (t_q, t_k) and mask.dtype == torch.bool
    for i in range(t_q):
        for j in range(t_k):
            assert bool(mask[i, j]) == (j <= extra + i)


def test_causal_mask_rejects_fewer_keys_than_queries() -> None:
    with pytest.raises(ValueError, match="keys"):
        causal_mask(5, 3)


def test_lengths_mask_right_padded() -> None:
    expected = torch.tensor([
        [T, T, T, F, F],
        [T, F, F, F, F],
        [T, T, T, T, T],
    ])[:, None, None, :]
    out = lengths_mask(torch.tensor([3, 1, 5]), 5)
    assert out.shape == (3, 1, 1, 5) and out.dtype == torch.bool
    assert torch.equal(out, expected)


def test_lengths_mask_left_padded() -> None:
    expected = torch.tensor([
        [F, F, T, T, T],
        [F, F, F, F, T],
        [T, T, T, T, T],
    ])[:, None, None, :]
    assert torch.equal(lengths_mask(torch.tensor([3, 1, 5]), 5, left_padded=True), expected)


def test_lengths_mask_defaults_to_longest_length() -> None:
    expected = torch.tensor([[T, T, F], [T, T, T]])[:, None, None, :]
    assert torch.equal(lengths_mask(torch.tensor([2, 3])), expected)


def test_lengths_mask_rejects_length_over_max_len() -> None:
    with pytest.raises(ValueError, match="`max_len`"):
        lengths_mask(torch.tensor([2, 6]), 4)


def test_padding_mask_hides_pad_ids() -> None:
    ids = torch.tensor([[5, 3, 0, 0], [0, 0, 7, 1]])
    expected = torch.tensor([[T, T, F, F], [F, F, T, T]])[:, None, None, :]
    assert torch.equal(padding_mask(ids, pad_id=0), expected)
    assert torch.equal(padding_mask(ids, pad_id=7), (ids != 7)[:, None, None, :])


def test_combine_masks_ands_and_broadcasts() -> None:
    pad = torch.tensor([[T, T, F], [T, F, F]])[:, None, None, :]  # (B, 1, 1, Tk)
    causal = torch.tensor([[T, F, F], [T, T, F], [T, T, T]])  # (Tq, Tk)
    out = combine_masks(pad, causal)
    assert out is not None and out.shape == (2, 1, 3, 3)
    expected = torch.tensor([
        [[T, F, F], [T, T, F], [T, T, F]],
        [[T, F, F], [T, F, F], [T, F, F]],
    ])[:, None]
    assert torch.equal(out, expected)


def test_combine_masks_ignores_none() -> None:
    m = torch.tensor([[T, F], [F, T]])
    assert combine_masks() is None
    assert combine_masks(None, None) is None
    assert torch.equal(combine_masks(None, m, None), m)
    assert torch.equal(combine_masks(m, None), m)


def test_combine_masks_rejects_float_masks() -> None:
    with pytest.raises(TypeError, match="boolean"):
        combine_masks(torch.ones(2, 2))


@pytest.mark.parametrize("left_padded", [True, False])
def test_causal_padding_mask_has_no_empty_rows(left_padded: bool) -> None:
    lengths = torch.tensor([4, 1, 2])
    key_mask = lengths_mask(lengths, 4, left_padded=left_padded)
    out = causal_padding_mask(key_mask)
    assert out.shape == (3, 1, 4, 4)
    assert bool(out.any(dim=-1).all())
    # Hand reference: causal AND real key, plus every query may see itself.
    for b in range(3):
        for i in range(4):
            for j in range(4):
                expected = (j <= i and bool(key_mask[b, 0, 0, j])) or i == j
                assert bool(out[b, 0, i, j]) == expected


def test_causal_padding_mask_left_padded_by_hand() -> None:
    key_mask = lengths_mask(torch.tensor([2]), 4, left_padded=True)  # [F, F, T, T]
    expected = torch.tensor([
        [T, F, F, F],  # pad query: only itself
        [F, T, F, F],  # pad query: only itself
        [F, F, T, F],
        [F, F, T, T],
    ])
    assert torch.equal(causal_padding_mask(key_mask)[0, 0], expected)


def test_additive_mask_is_zero_where_allowed_and_the_dtype_minimum_elsewhere() -> None:
    mask = torch.tensor([[True, False], [True, True]])
    bias = torch.tensor([[0.5, 1.0], [2.0, -1.0]])
    for dtype in (torch.float32, torch.bfloat16):
        low = torch.finfo(dtype).min
        assert torch.equal(additive_mask(mask, dtype), torch.tensor([[0.0, low], [0.0, 0.0]], dtype=dtype))
        got = additive_mask(mask, dtype, bias)
        assert got.dtype == dtype and torch.equal(got, torch.tensor([[0.5, low], [2.0, -1.0]], dtype=dtype))


def test_additive_mask_broadcasts_bias_and_mask() -> None:
    mask = torch.tensor([True, False])[None, None, None, :]  # (1, 1, 1, 2)
    bias = torch.zeros(1, 3, 2, 2)  # (1, H, T, T)
    assert additive_mask(mask, torch.float32, bias).shape == (1, 3, 2, 2)
