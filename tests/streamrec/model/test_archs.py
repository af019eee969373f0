"""The three session networks (`model.arch`): GRU4Rec's recurrent encoder against a GRU run on each history
alone, BERT4Rec's cloze inputs and mask-token scoring written out by hand, each network learning a pattern
it can only learn by reading the history, and their refusals."""

from __future__ import annotations

import pytest
import torch

from core.nn.recurrent import CausalRecurrentEncoder
from core.runtime.errors import InputError
from streamrec.data.datasets import TrainBatch
from streamrec.model.module import StreamRecModule
from streamrec.model.network import PAD_ID, StreamRecModel
from streamrec.ranking.explain import attention_weights, occlusion_drops

SMALL = dict(d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=8, dropout=0.0)
HISTORIES = torch.tensor([[0, 0, 0, 0, 3, 1, 4, 1], [0, 0, 0, 0, 0, 0, 5, 9], [2, 6, 5, 3, 5, 8, 9, 7]])


def test_recurrent_encoder_equals_a_gru_on_each_history_alone():
    """Reference: the same nn.GRU (+ norm) run on the real items only, one row at a time; padding outputs 0."""
    torch.manual_seed(0)
    enc = CausalRecurrentEncoder(6, n_layers=2).eval()
    x, valid = torch.randn(3, 5, 6), torch.tensor([[0, 0, 1, 1, 1], [0, 0, 0, 0, 1], [1, 1, 1, 1, 1]]).bool()
    out = enc(x, valid)
    for row in range(3):
        real = x[row, valid[row]][None]  # (1, n, 6)
        alone = enc.norm(enc.rnn(real)[0])[0]
        torch.testing.assert_close(out[row, valid[row]], alone, atol=1e-6, rtol=0)
        assert (out[row, ~valid[row]] == 0).all()


@pytest.mark.parametrize("arch", ["sasrec", "gru"])
def test_causal_networks_never_read_a_later_item(arch):
    torch.manual_seed(0)
    model = StreamRecModel(9, arch=arch, **SMALL).eval()
    changed = HISTORIES.clone()
    changed[:, -1] = torch.tensor([2, 2, 3])
    a, b = model.encode(HISTORIES), model.encode(changed)
    torch.testing.assert_close(a[:, :-1], b[:, :-1], atol=0, rtol=0)
    assert not torch.allclose(a[:, -1], b[:, -1])


def test_bert4rec_reads_both_ways_and_scores_from_a_mask_token_after_the_history():
    torch.manual_seed(0)
    model = StreamRecModel(9, arch="bert4rec", **SMALL).eval()
    changed = HISTORIES.clone()
    changed[:, -1] = torch.tensor([2, 2, 3])
    assert not torch.allclose(model.encode(HISTORIES)[:, -2], model.encode(changed)[:, -2])  # bidirectional
    shifted = model.scoring_inputs(HISTORIES)
    assert shifted.tolist()[0] == [0, 0, 0, 3, 1, 4, 1, 10] and model.mask_id == 10  # the oldest slot gives way
    torch.testing.assert_close(model.last_hidden(HISTORIES), model.encode(shifted)[:, -1], atol=1e-6, rtol=0)
    assert model.item_vectors.shape == (10, 16)  # the mask token is an input, never a recommendation
    assert model.recommend_scores(HISTORIES).shape == (3, 10)


@pytest.mark.parametrize("arch", ["sasrec", "bert4rec", "gru"])
def test_the_output_head_transforms_every_state_that_is_scored(arch):
    """dense, GELU, LayerNorm written out on the encoder's own states: in training (`encode`) and in scoring
    (`last_hidden`) alike."""
    torch.manual_seed(0)
    model = StreamRecModel(9, arch=arch, output_head=True, **SMALL).eval()
    dense, norm = model.head[0], model.head[2]
    head, model.head = model.head, None
    plain, plain_last = model.encode(HISTORIES), model.last_hidden(HISTORIES)
    model.head = head

    def by_hand(x):
        y = x @ dense.weight.T + dense.bias
        y = 0.5 * y * (1 + torch.erf(y / 2**0.5))
        y = (y - y.mean(-1, keepdim=True)) / (y.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()
        return y * norm.weight + norm.bias

    torch.testing.assert_close(model.encode(HISTORIES), by_hand(plain), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model.last_hidden(HISTORIES), by_hand(plain_last), atol=1e-5, rtol=1e-5)
    assert "head.0.weight" in model.state_dict() and "head.0.weight" not in StreamRecModel(9, **SMALL).state_dict()


def test_mask_items_masks_real_items_only_and_at_least_one_per_row():
    model = StreamRecModel(9, arch="bert4rec", **SMALL)
    g = torch.Generator().manual_seed(0)
    inputs, targets = model.mask_items(HISTORIES, 1e-9, generator=g)  # nothing drawn: each row's last item
    assert (inputs == HISTORIES).sum() == HISTORIES.numel() - 3 and (inputs[:, -1] == 10).all()
    assert targets[:, -1].tolist() == HISTORIES[:, -1].tolist() and (targets[:, :-1] == PAD_ID).all()
    inputs, targets = model.mask_items(HISTORIES, 1 - 1e-9, generator=g)  # everything drawn
    real = HISTORIES != PAD_ID
    assert (inputs[real] == 10).all() and (inputs[~real] == PAD_ID).all() and torch.equal(targets, HISTORIES)
    inputs, targets = model.mask_items(HISTORIES.repeat(200, 1), 0.3, generator=g)
    share = (inputs == 10).sum() / (HISTORIES != PAD_ID).sum() / 200
    assert 0.25 < share < 0.4  # 0.3, plus the rows whose draw chose nothing
    assert torch.equal(torch.where(inputs == 10, targets, inputs), HISTORIES.repeat(200, 1))


def _cycles(rows: int, length: int, n: int, g: torch.Generator) -> torch.Tensor:
    """Histories walking the cycle 1, 2, ..., n from a random start: the next item is the last one + 1."""
    start = torch.randint(0, n, (rows, 1), generator=g)
    return (start + torch.arange(length)) % n + 1


@pytest.mark.filterwarnings(r"ignore:You are trying to `self.log\(\)`")
@pytest.mark.parametrize(("arch", "options"), [("sasrec", {}), ("bert4rec", {}), ("gru", {}),
                                               ("sasrec", {"gated_residual": True, "activation": "swiglu"})])
def test_each_network_learns_the_next_item_of_a_cycle(arch, options):
    """The next item is the last one + 1 (mod n): a most-popular ranking gets 1 in n right; a network has to
    read the history. Trained through `training_step` (for bert4rec: its cloze task), judged on its top item."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    n = 12
    module = StreamRecModule(n, arch=arch, lr=1e-2, warmup_steps=1, popularity_baseline=False, **SMALL, **options)
    opt = torch.optim.AdamW(module.parameters(), lr=1e-2)
    module.train()
    for _ in range(150):
        seq = _cycles(32, 9, n, g)
        seq[:16, :3] = PAD_ID  # some shorter histories
        loss = module.training_step(TrainBatch(seq[:, :-1], seq[:, 1:]), 0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    module.eval()
    test = _cycles(64, 9, n, g)
    top = module.model.recommend_scores(test[:, :-1]).argmax(-1)
    assert (top == test[:, -1]).float().mean() > 0.8  # chance: 1 in 12


def test_the_networks_refuse_options_they_cannot_honour():
    with pytest.raises(ValueError, match=r"`lowpass_alpha` .* set it to 0 for arch gru"):
        StreamRecModel(9, arch="gru", lowpass_alpha=0.5)
    with pytest.raises(ValueError, match="`gated_residual` gates the transformer blocks' residuals; arch gru"):
        StreamRecModel(9, arch="gru", gated_residual=True)
    with pytest.raises(ValueError, match=r"`attention: window` .* use `attention: full` with arch bert4rec"):
        StreamRecModel(9, arch="bert4rec", attention="window")
    with pytest.raises(ValueError, match="item features are not offered with arch bert4rec"):
        StreamRecModel(9, arch="bert4rec", num_features=3, features_per_item=2)
    with pytest.raises(ValueError, match="`arch` must be sasrec, bert4rec or gru"):
        StreamRecModel(9, arch="transformer")
    with pytest.raises(ValueError, match=r"`mask_prob` must be in \(0, 1\)"):
        StreamRecModule(9, arch="bert4rec", mask_prob=0.0)
    with pytest.raises(ValueError, match="`item_optimizer: rowwise_adagrad` does not work with arch bert4rec"):
        StreamRecModule(9, arch="bert4rec", item_optimizer="rowwise_adagrad", loss="sampled")


def test_explanations_where_attention_exists():
    """bert4rec's attention comes back on history positions: the oldest item, left out of its inputs, gets 0;
    a gru has no attention view, and its occlusion view works."""
    torch.manual_seed(0)
    bert = StreamRecModel(9, arch="bert4rec", **SMALL).eval()
    weights = attention_weights(bert, HISTORIES)
    assert weights.shape == HISTORIES.shape and (weights[:, 0] == 0).all() and (weights[HISTORIES == 0] == 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(3))
    gru = StreamRecModel(9, arch="gru", **SMALL).eval()
    with pytest.raises(InputError, match="a gru model has no attention"):
        attention_weights(gru, HISTORIES)
    drops = occlusion_drops(gru, HISTORIES, torch.tensor([[1], [2], [3]]))
    assert drops.shape == (3, 1, 8) and (drops[HISTORIES[:, None, :] == 0] == 0).all()
