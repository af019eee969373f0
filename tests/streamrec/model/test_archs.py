"""The three session networks (`model.arch`): the registry that maps the name to its class, GRU4Rec's recurrent
encoder against a GRU run on each history alone, BERT4Rec's cloze inputs and mask-token scoring written out by
hand, each network learning a pattern it can only learn by reading the history, and their refusals."""

from __future__ import annotations

import pytest
import torch

from core.nn.recurrent import CausalRecurrentEncoder
from core.runtime.errors import InputError
from streamrec.data.datasets import TrainBatch
from streamrec.model.module import StreamRecModule
from streamrec.model.network import (
    NETWORK_KEYS,
    NETWORKS,
    PAD_ID,
    BERT4Rec,
    GRU4Rec,
    SASRec,
    StreamRecModel,
    build_network,
    network_arguments,
)
from streamrec.model.options import (
    BlockOptions,
    ContrastiveOptions,
    EvalOptions,
    MixingOptions,
    ObjectiveOptions,
    OptimizerOptions,
)
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


@pytest.mark.parametrize("arch", ["sasrec", "gru", "tvrec"])
def test_causal_networks_never_read_a_later_item(arch):
    torch.manual_seed(0)
    model = NETWORKS[arch](9, **SMALL).eval()
    changed = HISTORIES.clone()
    changed[:, -1] = torch.tensor([2, 2, 3])
    a, b = model.encode(HISTORIES), model.encode(changed)
    torch.testing.assert_close(a[:, :-1], b[:, :-1], atol=0, rtol=0)
    assert not torch.allclose(a[:, -1], b[:, -1])


def test_bert4rec_reads_both_ways_and_scores_from_a_mask_token_after_the_history():
    torch.manual_seed(0)
    model = BERT4Rec(9, **SMALL).eval()
    changed = HISTORIES.clone()
    changed[:, -1] = torch.tensor([2, 2, 3])
    assert not torch.allclose(model.encode(HISTORIES)[:, -2], model.encode(changed)[:, -2])  # bidirectional
    shifted = model.scoring_inputs(HISTORIES)
    assert shifted.tolist()[0] == [0, 0, 0, 3, 1, 4, 1, 10] and model.mask_id == 10  # the oldest slot gives way
    torch.testing.assert_close(model.last_hidden(HISTORIES), model.encode(shifted)[:, -1], atol=1e-6, rtol=0)
    assert model.item_vectors.shape == (10, 16)  # the mask token is an input, never a recommendation
    assert model.recommend_scores(HISTORIES).shape == (3, 10)


@pytest.mark.parametrize("arch", ["sasrec", "bert4rec", "gru", "tvrec"])
def test_the_output_head_transforms_every_state_that_is_scored(arch):
    """dense, GELU, LayerNorm written out on the encoder's own states: in training (`encode`) and in scoring
    (`last_hidden`) alike."""
    torch.manual_seed(0)
    model = NETWORKS[arch](9, block=BlockOptions(output_head=True), **SMALL).eval()
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
    assert "head.0.weight" in model.state_dict() and "head.0.weight" not in NETWORKS[arch](9, **SMALL).state_dict()


def test_mask_items_masks_real_items_only_and_at_least_one_per_row():
    model = BERT4Rec(9, **SMALL)
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
                                               ("sasrec", {"block": {"residual": "gated", "activation": "swiglu"}})])
def test_each_network_learns_the_next_item_of_a_cycle(arch, options):
    """The next item is the last one + 1 (mod n): a most-popular ranking gets 1 in n right; a network has to
    read the history. Trained through `training_step` (for bert4rec: its cloze task), judged on its top item."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    n = 12
    module = StreamRecModule(n, arch=arch, lr=1e-2, optimizer=OptimizerOptions(warmup_steps=1),
                             evaluation=EvalOptions(popularity_baseline=False), **SMALL, **options)
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
    """Each class's own `refuse` and `refuse_training`, asked directly (`test_options` meets them through the
    module); sasrec takes every setting."""
    with pytest.raises(ValueError, match=r"`model.mixing.lowpass_alpha` .* set it to 0 for arch gru"):
        GRU4Rec(9, mixing=MixingOptions(lowpass_alpha=0.5))
    with pytest.raises(ValueError, match="`model.block.residual: gated` gates the transformer blocks' residuals"):
        GRU4Rec(9, block={"residual": "gated"})
    with pytest.raises(ValueError, match=r"`model.mixing.attention: window` .* `attention: full` with arch bert4rec"):
        BERT4Rec(9, mixing=MixingOptions(attention="window"))
    with pytest.raises(ValueError, match="item features are not offered with arch bert4rec"):
        BERT4Rec(9, num_features=3, features_per_item=2)
    SASRec(9, mixing=MixingOptions(attention="window", lowpass_alpha=0.5), block=BlockOptions(residual="gated"))
    objective, rowwise = ObjectiveOptions(loss="sampled"), OptimizerOptions(item_optimizer="rowwise_adagrad")
    with pytest.raises(ValueError, match="`model.optimizer.item_optimizer: rowwise_adagrad` does not work with arch"):
        BERT4Rec.refuse_training(objective, ContrastiveOptions(), rowwise)
    with pytest.raises(ValueError, match=r"`model.contrastive.weight` needs a causal network \(sasrec, gru\)"):
        BERT4Rec.refuse_training(ObjectiveOptions(), ContrastiveOptions(weight=0.1), OptimizerOptions())
    for cls in (SASRec, GRU4Rec):
        cls.refuse_training(objective, ContrastiveOptions(weight=0.1), rowwise)  # causal, and one item table


@pytest.mark.parametrize("arch", sorted(NETWORKS))
def test_every_registered_network_builds_and_round_trips_through_build_network(arch):
    """`model.arch` is read in one place: the registry. A module's hyper-parameters rebuild the same class with
    the same arguments, whose weights load strictly and score as the module's network does."""
    cls = NETWORKS[arch]
    assert issubclass(cls, StreamRecModel) and cls.arch == arch
    direct = build_network({"num_items": 9, "arch": arch, **SMALL})
    assert type(direct) is cls
    torch.manual_seed(0)
    module = StreamRecModule(9, arch=arch, block={"output_head": True}, **SMALL)
    assert type(module.model) is cls
    found, arguments = network_arguments(module.hparams)
    assert found is cls and set(arguments) == set(NETWORK_KEYS)  # the training settings stay with the module
    rebuilt = build_network(module.hparams).eval()
    rebuilt.load_state_dict(module.model.state_dict(), strict=True)
    torch.testing.assert_close(rebuilt.recommend_scores(HISTORIES), module.model.eval().recommend_scores(HISTORIES))
    assert StreamRecModel.from_hparams(dict(module.hparams)).__class__ is cls


def test_network_arguments_refuse_an_unknown_key_and_an_unknown_arch_in_one_line():
    with pytest.raises(ValueError, match="hyper-parameter 'colour' is not a StreamRec setting; the settings are arch, "
                                         "num_items, ") as err:
        network_arguments({"num_items": 9, "colour": "red"})
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="`model.arch` must be sasrec, bert4rec, gru, tvrec; got 'transformer'") as err:
        build_network({"num_items": 9, "arch": "transformer"})
    assert "\n" not in str(err.value)
    assert network_arguments({"num_items": 9, "_instantiator": "x"})[1] == {"num_items": 9}  # bookkeeping is skipped
    assert type(build_network({"num_items": 9})) is SASRec  # no arch: the default


def test_explanations_where_attention_exists():
    """bert4rec's attention comes back on history positions: the oldest item, left out of its inputs, gets 0;
    a gru has no attention view, and its occlusion view works."""
    torch.manual_seed(0)
    bert = BERT4Rec(9, **SMALL).eval()
    weights = attention_weights(bert, HISTORIES)
    assert weights.shape == HISTORIES.shape and (weights[:, 0] == 0).all() and (weights[HISTORIES == 0] == 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(3))
    gru = GRU4Rec(9, **SMALL).eval()
    with pytest.raises(InputError, match="a gru model has no attention"):
        attention_weights(gru, HISTORIES)
    drops = occlusion_drops(gru, HISTORIES, torch.tensor([[1], [2], [3]]))
    assert drops.shape == (3, 1, 8) and (drops[HISTORIES[:, None, :] == 0] == 0).all()
