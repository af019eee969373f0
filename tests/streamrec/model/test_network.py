"""StreamRecModel invariants (on SASRec, the default network, unless a test names another)."""

import pytest
import torch

from streamrec.model.network import BERT4Rec, SASRec, StreamRecModel, trim_padding
from streamrec.model.options import BlockOptions, ItemOptions, MixingOptions


def _model(cls: type[StreamRecModel] = SASRec, **kw) -> StreamRecModel:
    torch.manual_seed(0)
    return cls(num_items=30, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_len=10, **kw).eval()


def test_future_items_do_not_change_earlier_states():
    model = _model()
    items = torch.tensor([[0, 0, 3, 4, 5, 6, 7, 8, 9, 10]])
    changed = items.clone()
    changed[0, 7:] = torch.tensor([20, 21, 22])
    a, b = model.encode(items), model.encode(changed)
    assert torch.allclose(a[:, :7], b[:, :7], atol=1e-6)
    assert not torch.allclose(a[:, 7:], b[:, 7:])


def test_scores_are_dot_products_with_item_embedding_and_never_padding():
    model = _model()
    items = torch.tensor([[0, 0, 0, 1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]])
    scores = model.recommend_scores(items)
    h = model.encode(items)[:, -1]
    want = h @ model.item_embedding.embedding.weight.T
    assert torch.isneginf(scores[:, 0]).all()
    assert torch.allclose(scores[:, 1:], want[:, 1:], atol=1e-5)


def test_trim_padding_drops_only_columns_padded_in_every_row():
    items = torch.tensor([[0, 0, 0, 4, 5], [0, 0, 2, 3, 1]])
    trimmed, offset = trim_padding(items)
    assert offset == 2 and trimmed.tolist() == [[0, 4, 5], [2, 3, 1]]
    assert trim_padding(torch.zeros(2, 4, dtype=torch.long))[1] == 0  # nothing occupied: nothing to trim


@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "rope", "alibi"])
def test_trimmed_padding_leaves_every_real_state_unchanged(positions):
    """Short histories are encoded without their all-padding columns; the full-width run is the reference."""
    model = _model(block=BlockOptions(positions=positions))
    items = torch.tensor([[0, 0, 0, 0, 0, 0, 3, 4, 5, 6], [0, 0, 0, 0, 0, 0, 0, 0, 9, 2]])
    full = model.encode(items)
    trimmed = model.encode(items, trim=True)
    assert trimmed.shape == (2, 4, 16)
    real = (items != 0)[:, -4:]
    assert torch.allclose(trimmed[real], full[:, -4:][real], atol=1e-5)
    assert torch.allclose(model.last_hidden(items), full[:, -1], atol=1e-5)


def test_training_loss_is_unchanged_by_trimming():
    from streamrec.data.datasets import TrainBatch
    from streamrec.model.losses import full_softmax
    from streamrec.model.module import StreamRecModule

    torch.manual_seed(0)
    module = StreamRecModule(num_items=30, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_len=10, dropout=0.0)
    module.log = lambda *a, **k: None  # no trainer attached
    inputs = torch.tensor([[0, 0, 0, 0, 0, 0, 3, 4, 5, 6], [0, 0, 0, 0, 0, 0, 0, 0, 9, 2]])
    targets = torch.tensor([[0, 0, 0, 0, 0, 0, 4, 5, 6, 7], [0, 0, 0, 0, 0, 0, 0, 0, 2, 8]])
    hidden = module.model.encode(inputs)  # full width
    keep = targets != 0
    want = full_softmax(hidden[keep], targets[keep], module.model.item_vectors)
    assert torch.allclose(module.training_step(TrainBatch(inputs, targets), 0), want, atol=1e-6)


@pytest.mark.parametrize("arch", ["sasrec", "gru"])
def test_prefix_batch_loss_is_the_cross_entropy_of_each_prefix_scored_alone(arch):
    # Reference: each prefix through the untrimmed encoder on its own, its last state scored against all items
    # by plain F.cross_entropy; the prefix batch computes the final layer at the last column only.
    from streamrec.data.datasets import collate_train
    from streamrec.model.module import StreamRecModule

    torch.manual_seed(0)
    module = StreamRecModule(num_items=30, arch=arch, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_len=6,
                             dropout=0.0)
    module.log = lambda *a, **k: None  # no trainer attached
    windows = [[3, 4, 5, 6], [9, 2], [1, 7, 7, 8, 2, 5, 11]]
    batch = collate_train(windows, max_len=6, last_only=True)
    right_aligned = [[0] * (7 - len(w)) + w[:-1] for w in windows]  # the learned positions count from the end
    logits = torch.stack([module.model.encode(torch.tensor([r]))[0, -1] for r in right_aligned])
    logits = logits @ module.model.item_vectors.T
    logits[:, 0] = float("-inf")  # padding is never a candidate
    want = torch.nn.functional.cross_entropy(logits, torch.tensor([w[-1] for w in windows]))
    assert torch.allclose(module.training_step(batch, 0), want, atol=1e-5)


def test_fourier_low_pass_is_refused_by_fit_without_prefix_windows():
    from types import SimpleNamespace

    from core.runtime.errors import InputError
    from streamrec.model.module import StreamRecModule

    module = StreamRecModule(num_items=30, d_model=16, max_len=6,
                             mixing=MixingOptions(lowpass_alpha=0.5, lowpass_kind="fourier"))
    module._trainer = SimpleNamespace(datamodule=SimpleNamespace(prefixes=False, num_items=30))
    with pytest.raises(InputError, match="`model.mixing.lowpass_kind: fourier` reads .* `data.prefixes: true`"):
        module.setup("fit")


def test_setup_refuses_data_the_module_was_not_built_for():
    from types import SimpleNamespace

    from streamrec.model.module import StreamRecModule

    module = StreamRecModule(num_items=30, d_model=16, max_len=6)
    module._trainer = SimpleNamespace(datamodule=SimpleNamespace(prefixes=False, num_items=31))
    with pytest.raises(ValueError, match="the data has 31 items but the model was built for 30"):
        module.setup("fit")
    featured = StreamRecModule(num_items=30, d_model=16, max_len=6, num_features=3, features_per_item=2)
    plain_data = SimpleNamespace(prefixes=False, num_items=30, vocab=None, item_features=None,
                                 train_item_counts=lambda: torch.ones(31))
    featured._trainer = SimpleNamespace(datamodule=plain_data)
    with pytest.raises(ValueError, match=r"the data has 0 item features \(0 per item\) but the model was built for 3"):
        featured.setup("fit")


def test_untied_head_uses_its_own_table():
    model = _model(items=ItemOptions(tied=False))
    assert model.item_vectors.data_ptr() != model.item_embedding.weight.data_ptr()
    assert model.item_vectors.shape == (31, 16)


def test_padding_positions_stay_finite():
    model = _model()
    items = torch.tensor([[0] * 9 + [5]])
    assert torch.isfinite(model.encode(items)).all()


def test_seed_m4_parameter_count_matches_hand_arithmetic():
    """configs/streamrec/seed_m4.yaml's model: 1,000 items, d_model 128, 4 heads, 2 layers, d_ff 512, max_len 50."""
    model = SASRec(num_items=1000, d_model=128, n_heads=4, n_layers=2, d_ff=512, max_len=50)
    d, f, n, t = 128, 512, 1000, 50
    item_table = (n + 1) * d  # padding row included; tied output adds nothing
    positions = t * d
    attention = d * 3 * d + 3 * d + d * d + d  # fused qkv + output projection, with biases
    feed_forward = d * f + f + f * d + d
    norms = 2 * 2 * d  # two LayerNorms per block
    per_layer = attention + feed_forward + norms
    final_norm = 2 * d
    expected = item_table + positions + 2 * per_layer + final_norm
    assert expected == 531_328
    assert sum(p.numel() for p in model.parameters()) == expected


def test_history_dropout_blanks_whole_items_in_training_only():
    items = torch.tensor([[0, 0, 3, 4, 5, 6, 7, 8, 9, 10]] * 200)
    plain, model = _model(dropout=0.0), _model(dropout=0.0, items=ItemOptions(history_dropout=0.3))
    assert torch.equal(model.recommend_scores(items), plain.recommend_scores(items))  # eval: nothing blanked
    model.train()
    rows = model._embed(items)  # (200, 10, D)
    whole = model.item_embedding(items)  # the scaled vectors, unblanked
    blank = (rows == 0).all(-1)
    assert torch.equal(rows[~blank], whole[~blank])  # a row is its item's vector or zero, never partly changed
    real = items != 0
    share = float(blank[real].float().mean())  # 1,600 real items at 0.3: sd 0.011
    assert 0.25 < share < 0.35
    assert bool(blank[~real].all())  # padding stays padding
    per_item = blank[real].view(200, 8)
    assert per_item.any(0).all() and not per_item.all(1).any()  # draws vary by row and position


@pytest.mark.parametrize("p", [-0.1, 1.0])
def test_history_dropout_refuses_a_share_outside_0_1(p):
    with pytest.raises(ValueError, match=rf"`model.items.history_dropout` must be in \[0, 1\), got {p}"):
        _model(items={"history_dropout": p})


def test_history_dropout_never_blanks_bert4rec_mask_tokens():
    model = _model(BERT4Rec, dropout=0.0, items=ItemOptions(history_dropout=0.9)).train()
    items = torch.full((50, 10), model.mask_id)
    items[:, :5] = torch.arange(1, 6)
    rows = model._embed(items)
    assert not (rows[:, 5:] == 0).all(-1).any()  # every mask token keeps its vector
    assert (rows[:, :5] == 0).all(-1).float().mean() > 0.8  # 250 real items at 0.9
