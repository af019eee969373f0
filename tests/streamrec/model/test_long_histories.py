"""StreamRec with window and linear attention: equal to full attention where the window covers the history,
and no (T, T) mask anywhere on the way, so long histories cost memory linear in their length."""

from __future__ import annotations

import pytest
import torch

import streamrec.model.network as sasrec
from streamrec.model.network import SASRec
from streamrec.model.options import MixingOptions


def histories(t: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    items = torch.randint(1, 40, (3, t), generator=g)
    items[1, : t // 2] = 0  # left padding
    return items


def test_a_window_covering_the_history_recommends_as_full_attention():
    torch.manual_seed(0)
    full = SASRec(40, max_len=16).eval()
    windowed = SASRec(40, max_len=16, mixing=MixingOptions(attention="window", window=16)).eval()
    windowed.load_state_dict(full.state_dict())
    items = histories(16)
    torch.testing.assert_close(windowed.recommend_scores(items), full.recommend_scores(items))
    real = items != 0
    torch.testing.assert_close(windowed.encode(items)[real], full.encode(items)[real])


@pytest.mark.parametrize("kind", ["window", "linear"])
def test_long_histories_build_no_square_mask_and_train(kind, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a (T, T) mask was built")

    monkeypatch.setattr(sasrec, "causal_padding_mask", refuse)
    torch.manual_seed(0)
    model = SASRec(40, d_model=16, n_heads=2, d_ff=32, max_len=2000, mixing=MixingOptions(attention=kind, window=64))
    items = histories(2000)
    hidden = model.encode(items, trim=True)
    loss = model.score(hidden[items[:, -hidden.shape[1]:] != 0])[:, 1:].logsumexp(-1).mean()
    loss.backward()
    assert torch.isfinite(loss) and model.item_embedding.weight.grad is not None
    assert model.recommend_scores(items).shape == (3, 41)
