"""Training with `item_optimizer: rowwise_adagrad`: a step reads and writes only the item rows it scores (no
dense (N+1, D) tensor, bf16 included), a short fit learns, and a resumed fit ends with the uninterrupted weights."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from core.runtime.resume import ExactResume
from streamrec.data.datamodule import StreamRecDataModule
from streamrec.data.datasets import TrainBatch
from streamrec.model.module import StreamRecModule
from streamrec.model.options import EvalOptions, ItemOptions, ObjectiveOptions, OptimizerOptions

N, K = 5000, 7
ROWWISE = OptimizerOptions(item_optimizer="rowwise_adagrad")


def make_module(**kw) -> StreamRecModule:
    torch.manual_seed(0)
    args = dict(num_items=N, max_len=6, d_model=8, n_heads=2, n_layers=1, d_ff=16, dropout=0.0,
                objective=ObjectiveOptions(loss="sampled", num_negatives=K), optimizer=ROWWISE,
                evaluation=EvalOptions(popularity_baseline=False))
    return StreamRecModule(**{**args, **kw})


BATCH = TrainBatch(torch.tensor([[0, 0, 3, 7, 9, 7], [0, 5, 6, 2, 8, 4000]]),
                   torch.tensor([[0, 0, 7, 9, 7, 11], [0, 6, 2, 8, 4000, 1]]))


class TableSizedTensors(TorchDispatchMode):
    """Records every new dense (N+1, D) tensor an op returns (not the table itself, which the update writes into)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else [out]:
            table_sized = isinstance(t, torch.Tensor) and t.layout == torch.strided and t.shape[:1] == (N + 1,)
            if table_sized and t.dim() == 2 and not any(t is a for a in args):
                self.ops.append(str(func))
        return out


@pytest.mark.filterwarnings("ignore:You are trying to `self.log\\(\\)`")
def test_a_step_touches_exactly_the_rows_it_reads():
    module = make_module().eval()  # no dropout: the only draw is the negatives
    torch.manual_seed(3)
    module.training_step(BATCH, 0).backward()
    torch.manual_seed(3)
    negatives = torch.randint(1, N + 1, (K,))
    grad = module.model.item_vectors.grad
    assert grad.is_sparse
    read = set(BATCH.inputs.flatten().tolist()) | set(BATCH.targets.flatten().tolist()) | set(negatives.tolist())
    assert set(grad.coalesce().indices()[0].tolist()) == read - {0}  # padding reads nothing

    opt = module.make_optimizer()
    before = module.model.item_vectors.detach().clone()
    opt.step()
    changed = (module.model.item_vectors.detach() != before).any(1).nonzero().flatten().tolist()
    assert set(changed) == read - {0}


@pytest.mark.filterwarnings("ignore:You are trying to `self.log\\(\\)`")
@pytest.mark.parametrize("item_optimizer", ["rowwise_adagrad", "adamw"])
def test_no_table_sized_tensor_is_made_in_a_bf16_step(item_optimizer):
    """Under bf16 autocast the old path casts the whole table and gets dense gradients: the check sees them."""
    module = make_module(optimizer=OptimizerOptions(item_optimizer=item_optimizer)).train()
    opt = module.make_optimizer()
    with TableSizedTensors() as seen:
        with torch.autocast("cpu", torch.bfloat16):
            loss = module.training_step(BATCH, 0)
        loss.backward()
        opt.step()
    if item_optimizer == "adamw":
        assert seen.ops  # e.g. aten._to_copy (the bf16 table) and the dense embedding backward
    else:
        assert seen.ops == []


class StopAfter(L.Callback):
    """Ends the fit after `epochs` epochs, as a crash would, without changing the schedule's length."""

    def __init__(self, epochs: int) -> None:
        self.epochs = epochs

    def on_train_epoch_end(self, trainer, pl_module):
        trainer.should_stop = trainer.current_epoch + 1 >= self.epochs


def fit(log: Path, root: Path, ckpt: str | None = None, stop: int = 2) -> tuple[StreamRecModule, L.Trainer]:
    L.seed_everything(0, verbose=False)
    data = StreamRecDataModule(str(log), max_len=8, batch_size=16)
    module = StreamRecModule(num_items=40, max_len=8, d_model=16, n_heads=2, n_layers=1, d_ff=32, weight_decay=0.01,
                             objective=ObjectiveOptions(loss="sampled", num_negatives=16),
                             optimizer=OptimizerOptions(item_optimizer="rowwise_adagrad", warmup_steps=5))
    # No validation: what a resume must restore is training's state, and every fit here skips it alike.
    trainer = L.Trainer(max_epochs=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False, default_root_dir=root, limit_val_batches=0,
                        callbacks=[ExactResume(), StopAfter(stop)])
    trainer.fit(module, data, ckpt_path=ckpt)
    return module, trainer


class EpochLosses(L.Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_epoch_end(self, trainer, pl_module):
        self.losses.append(float(trainer.callback_metrics["train_loss"]))


def test_a_short_fit_learns_and_beats_popularity(tiny_log, tmp_path):
    L.seed_everything(0, verbose=False)
    data = StreamRecDataModule(str(tiny_log), max_len=8, batch_size=16)
    module = StreamRecModule(num_items=40, max_len=8, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                             objective=ObjectiveOptions(loss="sampled", num_negatives=16),
                             optimizer=OptimizerOptions(item_optimizer="rowwise_adagrad", warmup_steps=5))
    losses = EpochLosses()
    trainer = L.Trainer(max_epochs=8, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[losses], gradient_clip_val=1.0)  # clips dense only
    trainer.fit(module, data)
    metrics = trainer.callback_metrics
    assert losses.losses[-1] < 0.8 * losses.losses[0]
    assert float(metrics["val_ndcg@10"]) > float(metrics["val_mostpop_ndcg@10"]) + 0.1


def test_resumed_fit_equals_uninterrupted(tiny_log, tmp_path):
    """One epoch, a checkpoint, one more from it: the weights and optimizer states of two straight epochs."""
    whole, _ = fit(tiny_log, tmp_path / "whole")
    _, first = fit(tiny_log, tmp_path / "first", stop=1)
    ckpt = tmp_path / "one_epoch.ckpt"
    first.save_checkpoint(ckpt)
    resumed, trainer = fit(tiny_log, tmp_path / "resumed", ckpt=str(ckpt))
    assert trainer.global_step > first.global_step
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    states = [trainer.optimizers[0].state_dict(), whole.trainer.optimizers[0].state_dict()]
    assert [g["rowwise"] for g in states[0]["param_groups"]] == [False, True]
    for sa, sb in zip(states[0]["state"].values(), states[1]["state"].values(), strict=True):
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    # The reference can fail: without the AdaGrad sums and AdamW moments the resumed run ends elsewhere.
    state = torch.load(ckpt, weights_only=True)
    state["optimizer_states"][0]["state"] = {}
    torch.save(state, ckpt)
    fresh, _ = fit(tiny_log, tmp_path / "fresh", ckpt=str(ckpt))
    assert not torch.equal(fresh.model.item_vectors, whole.model.item_vectors)


class SaveWeights(L.Callback):
    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def on_train_end(self, trainer, pl_module):
        torch.save(pl_module.state_dict(), self.folder / f"rank{trainer.global_rank}.pt")


@pytest.mark.slow  # two forked ranks (ddp_fork: no process imports torch and Lightning again)
@pytest.mark.parametrize("tied", [True, False])
def test_two_gloo_ranks_all_reduce_the_sparse_gradients_and_end_equal(tiny_log, tmp_path, tied):
    """DDP on CPU (gloo) all-reduces sparse gradients: the ranks end with the same tables (NCCL cannot)."""
    L.seed_everything(0, verbose=False)
    data = StreamRecDataModule(str(tiny_log), max_len=8, batch_size=16)
    module = StreamRecModule(num_items=40, max_len=8, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                             objective=ObjectiveOptions(loss="sampled", num_negatives=16), optimizer=ROWWISE,
                             items=ItemOptions(tied=tied), evaluation=EvalOptions(popularity_baseline=False))
    start = {k: v.clone() for k, v in module.state_dict().items()}
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_fork", max_epochs=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=0, callbacks=[SaveWeights(tmp_path)], gradient_clip_val=1.0)
    trainer.fit(module, data)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    for name in start:
        assert torch.equal(ranks[0][name], ranks[1][name]), name
    tables = ["model.item_embedding.embedding.weight"] + ([] if tied else ["model.output.weight"])
    assert all(not torch.equal(ranks[0][t], start[t]) for t in tables)  # they trained
