"""StreamRecModule against hand-written references: the training loss on padded (trimmed) batches and its terms,
validation metrics from a brute-force ranking, the optimiser's schedule and the sparse item gradients, the handoff
of its option groups to the network and the refusal of the old flat names."""

from __future__ import annotations

import inspect
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from core.nn.optim import RowwiseAdagradAdamW
from core.nn.options import OptionGroup, SpeedOptions
from streamrec.data.constants import MAX_LEN
from streamrec.data.datamodule import StreamRecDataModule
from streamrec.data.datasets import EvalBatch, TrainBatch, TrainDataset
from streamrec.model import network
from streamrec.model.module import StreamRecModule
from streamrec.model.network import NETWORK_KEYS, NETWORKS, SASRec, StreamRecModel
from streamrec.model.options import (
    BlockOptions,
    ContrastiveOptions,
    EvalOptions,
    ItemOptions,
    MixingOptions,
    ObjectiveOptions,
    OptimizerOptions,
)

N = 30


def make_module(**kw) -> StreamRecModule:
    torch.manual_seed(0)
    args = dict(num_items=N, max_len=6, d_model=16, n_heads=2, n_layers=1, d_ff=32, dropout=0.0,
                evaluation=EvalOptions(ks=(10,), popularity_baseline=False))
    return StreamRecModule(**{**args, **kw})


def padded_batch() -> TrainBatch:
    # Left padding; the first two columns are padding in every row, so training trims them.
    inputs = torch.tensor([[0, 0, 0, 3, 7, 9], [0, 0, 5, 6, 2, 8]])
    targets = torch.tensor([[0, 0, 0, 7, 9, 4], [0, 0, 6, 2, 8, 1]])
    return TrainBatch(inputs, targets)


@pytest.mark.filterwarnings("ignore:You are trying to `self.log\\(\\)`")  # no trainer here: logging is not tested
def test_training_loss_is_cross_entropy_over_the_catalogue_at_non_padding_positions():
    module = make_module().eval()  # no dropout either way; eval keeps it deterministic
    batch = padded_batch()
    got = module.training_step(batch, 0)
    # Reference: the untrimmed encoder, explicit (M, N) logits, F.cross_entropy over items 1..N.
    hidden = module.model.encode(batch.inputs)  # (B, T, D), no trimming
    keep = batch.targets != 0
    logits = hidden[keep] @ module.model.item_vectors[1:].T  # (M, N)
    want = F.cross_entropy(logits, batch.targets[keep] - 1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _two_passes(module, inputs, targets):
    """The training step's loss under seed 5, and the reference's pieces from the same two passes (same seed):
    each pass's (M, N) logits at the non-padding positions, their targets, and each pass's (B, D) last states."""
    module.log = lambda *a, **k: None  # no trainer attached
    torch.manual_seed(5)
    got = module.training_step(TrainBatch(inputs, targets), 0)
    torch.manual_seed(5)
    first, second = module.model.encode(inputs.repeat(2, 1)).chunk(2)
    keep, items = targets != 0, module.model.item_vectors[1:]
    return got, first[keep] @ items.T, second[keep] @ items.T, targets[keep] - 1, first[:, -1], second[:, -1]


def test_rdrop_loss_is_mean_cross_entropy_of_two_dropout_passes_plus_their_symmetric_kl():
    module = make_module(dropout=0.3, objective=ObjectiveOptions(rdrop_alpha=2.0, label_smoothing=0.1)).train()
    inputs = torch.tensor([[2, 3, 7, 9, 0, 4], [0, 5, 6, 2, 8, 1]])  # no all-padding column: nothing is trimmed
    targets = torch.tensor([[3, 7, 9, 4, 4, 11], [0, 6, 2, 8, 1, 12]])
    got, z1, z2, t, _, _ = _two_passes(module, inputs, targets)
    # Reference: PyTorch's CE and the KL written out on explicit logits.
    ce = (F.cross_entropy(z1, t, label_smoothing=0.1) + F.cross_entropy(z2, t, label_smoothing=0.1)) / 2
    l1, l2 = z1.log_softmax(-1), z2.log_softmax(-1)
    kl = ((l1.exp() * (l1 - l2)).sum(-1) + (l2.exp() * (l2 - l1)).sum(-1)).mean()
    assert kl > 1e-3  # the two masks differ, so the consistency term is in play
    torch.testing.assert_close(got, ce + 2.0 / 4 * kl, rtol=1e-5, atol=1e-5)


def _nt_xent_rows_0_and_2_alike(last1, last2, temperature: float):
    """NT-Xent over three windows' two views, written out view by view; rows 0 and 2 end in the same item, so they
    are not each other's negatives."""
    views = torch.cat([last1, last2])
    sim = views @ views.T / temperature
    terms = []
    for i in range(6):
        others = [j for j in range(6) if j != i and {i % 3, j % 3} != {0, 2}]
        terms.append(torch.logsumexp(sim[i, others], 0) - sim[i, (i + 3) % 6])
    return torch.stack(terms).mean()


def test_contrastive_term_compares_each_windows_last_state_across_two_dropout_passes():
    module = make_module(dropout=0.3, contrastive=ContrastiveOptions(weight=0.5, temperature=0.7)).train()
    inputs = torch.tensor([[2, 3, 7, 9, 0, 4], [0, 5, 6, 2, 8, 1], [0, 0, 0, 4, 3, 2]])
    targets = torch.tensor([[3, 7, 9, 4, 4, 11], [0, 6, 2, 8, 1, 12], [0, 0, 0, 3, 2, 11]])  # rows 0 and 2 end alike
    got, z1, z2, t, last1, last2 = _two_passes(module, inputs, targets)
    ce = (F.cross_entropy(z1, t) + F.cross_entropy(z2, t)) / 2
    torch.testing.assert_close(got, ce + 0.5 * _nt_xent_rows_0_and_2_alike(last1, last2, 0.7), rtol=1e-5, atol=1e-5)


def test_without_the_second_pass_softmax_the_second_pass_serves_only_the_contrastive_term():
    module = make_module(dropout=0.3, contrastive=ContrastiveOptions(weight=0.5, second_pass_softmax=False)).train()
    module.log = lambda *a, **k: None
    inputs = torch.tensor([[2, 3, 7, 9, 0, 4], [0, 5, 6, 2, 8, 1], [0, 0, 0, 4, 3, 2]])
    targets = torch.tensor([[3, 7, 9, 4, 4, 11], [0, 6, 2, 8, 1, 12], [0, 0, 0, 3, 2, 11]])  # rows 0 and 2 end alike
    torch.manual_seed(5)
    got = module.training_step(TrainBatch(inputs, targets), 0)
    torch.manual_seed(5)
    first = module.model.encode(inputs)
    last2 = module.model.encode(inputs, last=1)[:, -1]
    keep = targets != 0
    ce = F.cross_entropy(first[keep] @ module.model.item_vectors[1:].T, targets[keep] - 1)  # the first pass only
    assert not torch.allclose(first[:, -1], last2)  # two dropout masks
    torch.testing.assert_close(got, ce + 0.5 * _nt_xent_rows_0_and_2_alike(first[:, -1], last2, 1.0),
                               rtol=1e-5, atol=1e-5)


def test_same_target_positives_contrast_each_window_with_a_training_window_heading_for_its_item():
    module = make_module(dropout=0.3, contrastive=ContrastiveOptions(weight=0.5, second_pass_softmax=False,
                                                                     positive="same_target")).train()
    module.log = lambda *a, **k: None
    # One training window ends in 8 and one in 10, so each row's partner is known whatever the draw.
    windows = TrainDataset([[5, 6, 8], [1, 2, 3, 4, 11, 12, 10], [7, 9]], max_len=6)
    module._trainer = SimpleNamespace(train_dataloader=SimpleNamespace(dataset=windows), global_step=3)
    inputs = torch.tensor([[2, 3, 7, 9, 0, 4], [0, 5, 6, 2, 8, 1], [0, 0, 0, 4, 3, 2]])
    targets = torch.tensor([[3, 7, 9, 4, 4, 8], [0, 6, 2, 8, 1, 10], [0, 0, 0, 3, 2, 8]])  # rows 0 and 2 end alike
    torch.manual_seed(5)
    got = module.training_step(TrainBatch(inputs, targets), 0)
    partners = torch.tensor([[0, 0, 0, 0, 5, 6], [1, 2, 3, 4, 11, 12], [0, 0, 0, 0, 5, 6]])  # by hand
    torch.manual_seed(5)
    first = module.model.encode(inputs)
    last2 = module.model.encode(partners, last=1)[:, -1]
    keep = targets != 0
    ce = F.cross_entropy(first[keep] @ module.model.item_vectors[1:].T, targets[keep] - 1)
    torch.testing.assert_close(got, ce + 0.5 * _nt_xent_rows_0_and_2_alike(first[:, -1], last2, 1.0),
                               rtol=1e-5, atol=1e-5)


def test_same_target_positives_need_the_training_windows():
    module = make_module(contrastive={"weight": 0.5, "second_pass_softmax": False, "positive": "same_target"})
    module.log = lambda *a, **k: None
    module._trainer = SimpleNamespace(train_dataloader=SimpleNamespace(dataset=[[1, 2]]), global_step=0)
    with pytest.raises(RuntimeError, match="draws windows from the training data"):
        module.training_step(padded_batch(), 0)


def test_validation_metrics_equal_a_brute_force_ranking():
    module = make_module().eval()
    inputs = torch.tensor([[0, 3, 7, 9], [5, 6, 2, 8], [0, 0, 0, 4]])
    targets = torch.tensor([11, 2, 20])
    seen = torch.tensor([[3, 7, 9, 0], [5, 6, 2, 8], [4, 0, 0, 0]])  # row 1's target was seen: a miss
    batch = EvalBatch(torch.arange(3), inputs, targets, seen)
    module.validation_step(batch, 0)
    got = module.val_metrics.compute()
    # Brute force: rank all items 1..N by score, seen items removed, find the target's rank.
    scores = module.model.recommend_scores(inputs).float()
    ndcg, hits = [], []
    for row in range(3):
        ranked = [int(i) for i in scores[row, 1:].argsort(descending=True) + 1 if int(i) not in seen[row].tolist()]
        rank = ranked.index(int(targets[row])) if int(targets[row]) in ranked else None
        hits.append(float(rank is not None and rank < 10))
        ndcg.append(1 / math.log2(rank + 2) if rank is not None and rank < 10 else 0.0)
    assert got["hr@10"].item() == pytest.approx(sum(hits) / 3)
    assert got["ndcg@10"].item() == pytest.approx(sum(ndcg) / 3, abs=1e-6)


def test_optimiser_is_adamw_with_linear_warmup_then_cosine_to_the_floor():
    module = make_module(lr=2e-3, weight_decay=0.05, optimizer=OptimizerOptions(warmup_steps=4, lr_floor=0.1))
    module._trainer = SimpleNamespace(estimated_stepping_batches=20, callbacks=[])  # what the method reads
    config = module.configure_optimizers()
    opt, sched = config["optimizer"], config["lr_scheduler"]["scheduler"]
    assert isinstance(opt, torch.optim.AdamW)
    assert opt.param_groups[0]["weight_decay"] == 0.05
    lrs = []
    for _ in range(20):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] < lrs[1] < lrs[2] < lrs[3] < lrs[4]  # warmup
    assert lrs[4] == pytest.approx(2e-3)
    assert all(a >= b for a, b in zip(lrs[4:], lrs[5:], strict=False))  # then never rises
    assert lrs[-1] >= 2e-4 * 0.999 and lrs[-1] < 2e-3 * 0.5  # towards the floor, not below it


@pytest.mark.parametrize("tied", [True, False])
def test_rowwise_adagrad_is_one_optimizer_with_the_item_tables_in_a_rowwise_group(tied):
    module = make_module(lr=2e-3, weight_decay=0.01, objective=ObjectiveOptions(loss="sampled"),
                         optimizer=OptimizerOptions(item_optimizer="rowwise_adagrad", item_lr=0.05, warmup_steps=4),
                         items=ItemOptions(tied=tied))
    module._trainer = SimpleNamespace(estimated_stepping_batches=20, callbacks=[])
    config = module.configure_optimizers()
    opt, sched = config["optimizer"], config["lr_scheduler"]["scheduler"]
    assert isinstance(opt, RowwiseAdagradAdamW)
    dense, rows = opt.param_groups
    tables = [module.model.item_embedding.weight] + ([] if tied else [module.model.output.weight])
    assert [id(p) for p in rows["params"]] == [id(t) for t in tables] and rows["rowwise"] and not dense["rowwise"]
    assert sorted(map(id, dense["params"] + rows["params"])) == sorted(map(id, module.parameters()))  # each once
    assert dense["weight_decay"] == rows["weight_decay"] == 0.01
    for _ in range(10):  # the schedule scales both peaks by the same factor
        assert rows["lr"] == pytest.approx(dense["lr"] * 25)
        opt.step()
        sched.step()


@pytest.mark.parametrize("loss", ["bce", "gbce", "sampled"])
def test_rowwise_adagrad_losses_equal_the_dense_ones_with_sparse_table_gradients(loss):
    objective = ObjectiveOptions(loss=loss, num_negatives=5)
    dense = make_module(objective=objective)
    sparse = make_module(objective=objective, optimizer=OptimizerOptions(item_optimizer="rowwise_adagrad"))
    hidden, targets = torch.randn(4, 16), torch.tensor([1, 5, 9, 30])
    got, values = [], []
    for module in (dense, sparse):
        torch.manual_seed(3)
        values.append(module.loss_fn.loss(module.model, hidden, targets, None))
        values[-1].backward()
        got.append(module.model.item_vectors.grad)
    assert torch.equal(values[0], values[1])
    assert not got[0].is_sparse and got[1].is_sparse
    torch.testing.assert_close(got[1].to_dense(), got[0])


def test_every_network_argument_reaches_the_network_under_its_own_name(monkeypatch):
    """The module hands the network exactly `NETWORK_KEYS`, each by keyword, the groups as validated objects; a
    dropped or renamed one fails here."""
    seen: dict = {}

    class Spy(SASRec):
        def __init__(self, num_items, **kwargs):
            seen.update(num_items=num_items, **kwargs)
            super().__init__(num_items, **kwargs)

    monkeypatch.setitem(network.NETWORKS, "sasrec", Spy)
    module = make_module(block=BlockOptions(n_kv_heads=1, positions="rope", attn_dropout=0.1),
                         mixing={"lowpass_alpha": 0.5}, items=ItemOptions(tied=False, init_std=0.05))
    assert isinstance(module.model, Spy)
    assert set(seen) == set(NETWORK_KEYS) == set(inspect.signature(StreamRecModel).parameters)
    assert all(isinstance(seen[g], cls) for g, cls in (("block", BlockOptions), ("mixing", MixingOptions),
                                                       ("items", ItemOptions)))
    plain = {k: v.as_dict() if isinstance(v, OptionGroup) else v for k, v in seen.items()}
    assert plain == {name: module.hparams[name] for name in NETWORK_KEYS}
    assert module.hparams["mixing"]["lowpass_alpha"] == 0.5 and module.hparams["items"]["init_std"] == 0.05


def _group_default(name: str, default: object) -> object:
    """A network's default for an option group is None, which stands for the group's own defaults."""
    groups = {"block": BlockOptions, "mixing": MixingOptions, "items": ItemOptions}
    return groups[name].of(default) if name in groups else default


def test_network_module_and_data_share_their_defaults():
    """One home for defaults: `streamrec.data.constants.MAX_LEN`, and the network's arguments are the module's,
    with the module's defaults; the module's arguments are the network's and the training settings."""
    module = inspect.signature(StreamRecModule).parameters
    assert inspect.signature(StreamRecDataModule).parameters["max_len"].default == MAX_LEN
    assert set(module) == {"arch", *NETWORK_KEYS, *network.TRAINING_KEYS}
    for cls in (StreamRecModel, *NETWORKS.values()):
        model = inspect.signature(cls).parameters
        assert list(model) == list(NETWORK_KEYS), cls.__name__
        assert model["max_len"].default == module["max_len"].default == MAX_LEN
        defaults = {n: _group_default(n, p.default) for n, p in model.items()
                    if p.default is not inspect.Parameter.empty}
        assert set(defaults) == set(NETWORK_KEYS) - {"num_items"}
        assert defaults == {n: module[n].default for n in defaults}, cls.__name__
    assert module["speed"].default == SpeedOptions()


@pytest.mark.parametrize("old", [{"filter_seen": False}, {"exclude_seen": False}, {"contrastive_weight": 0.1},
                                 {"loss": "sampled"}, {"attention_window": 16}, {"gated_residual": True}])
def test_the_old_flat_names_are_refused_by_the_constructor(old):
    """Only the loaders map the old flat names (`streamrec.model.hparams`); a call or config must use the groups."""
    with pytest.raises(TypeError, match=next(iter(old))):
        make_module(**old)


def test_a_group_given_as_a_mapping_is_validated_and_stored_as_a_plain_dict():
    module = make_module(evaluation={"exclude_seen": False, "ks": [5, 10], "popularity_baseline": False})
    assert module.hparams["evaluation"] == {"ks": [5, 10], "exclude_seen": False, "sampled_metrics": False,
                                            "popularity_baseline": False}
    assert module.val_metrics.exclude_seen is False and make_module().val_metrics.exclude_seen is True
    assert module.baseline_metrics is None and module.sampled_metrics is None
    with pytest.raises(ValueError, match="`model.evaluation` has no key 'filter_seen'; its keys are ks, ") as err:
        make_module(evaluation={"filter_seen": False})
    assert "\n" not in str(err.value)


def test_validation_logs_the_held_out_items_cross_entropy() -> None:
    import torch.nn.functional as F

    from streamrec.data.datasets import EvalBatch
    from streamrec.model.module import StreamRecModule

    module = StreamRecModule(12, max_len=6, d_model=8, n_heads=2, n_layers=1, d_ff=16).eval()
    inputs = torch.tensor([[0, 0, 1, 2, 3, 4], [0, 0, 0, 0, 5, 6], [0, 0, 0, 0, 0, 9]])
    targets = torch.tensor([7, 1, 2])
    seen = torch.zeros(3, 1, dtype=torch.long)
    module.validation_step(EvalBatch(torch.arange(2), inputs[:2], targets[:2], seen[:2]), 0)
    module.validation_step(EvalBatch(torch.arange(1), inputs[2:], targets[2:], seen[2:]), 1)
    scores = module.model.recommend_scores(inputs)
    want = F.cross_entropy(scores[:, 1:], targets - 1)  # the padding column (-inf) holds no probability
    assert float(module.val_metrics.compute()["loss"]) == pytest.approx(float(want), rel=1e-5)  # per row, not batch
