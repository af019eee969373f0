"""StreamRec training logic: losses, optimisation, full-catalogue validation. The constructor is the config schema
(LightningCLI turns it into `--model.*` and YAML); `num_items` and `max_len` are linked from the data module.

Legend: B batch, T history length, D model width, N items, M non-padding positions."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import lightning as L
import torch
from torch import Tensor

from core.nn import WarmupCosineLR, stops_on_time
from core.nn.compile import BUCKET, compile_in_place
from core.nn.cpu_fastpath import enable_cpu_fastpath
from core.nn.optim import RowwiseAdagradAdamW
from core.nn.options import SpeedOptions
from core.runtime.checkpoint import SafeLoadMixin
from core.runtime.distributed import destroy_process_group_at_exit
from core.runtime.errors import InputError
from streamrec.data.constants import MAX_LEN
from streamrec.data.datasets import EvalBatch, PredictBatch, SameTargetWindows, TrainBatch, TrainDataset
from streamrec.data.vocab import VOCAB_KEY, ItemVocab
from streamrec.model.hparams import upgrade_hparams
from streamrec.model.losses import Objective
from streamrec.model.metrics import RankingMetrics, SampledRankingMetrics, most_popular_scores
from streamrec.model.network import NETWORK_KEYS, Arch, module_settings, network_class
from streamrec.model.options import (
    BlockOptions,
    ContrastiveOptions,
    EvalOptions,
    ItemOptions,
    MixingOptions,
    ObjectiveOptions,
    OptimizerOptions,
    check_training,
    full_softmax_terms,
)
from streamrec.ranking.batch import RankingOptions, rank
from streamrec.ranking.predict import RankedBatch

log = logging.getLogger(__name__)

__all__ = ["StreamRecModule", "full_softmax_terms"]
GROUPS = {"block": BlockOptions, "mixing": MixingOptions, "items": ItemOptions, "objective": ObjectiveOptions,
          "contrastive": ContrastiveOptions, "optimizer": OptimizerOptions, "evaluation": EvalOptions,
          "speed": SpeedOptions}  # the option groups, in the constructor's order


class StreamRecModule(SafeLoadMixin, L.LightningModule):
    """Next-item recommender: a session network trained to predict the next items (`streamrec.model.network`).

    Args:
        num_items: catalogue size N (linked from the data module).
        arch: sasrec (default): a causal transformer predicting every next item; bert4rec: a bidirectional one
            filling masked items (`objective.mask_prob`); gru: GRU4Rec, `n_layers` GRU layers trained like sasrec
            (no attention settings, and no attention view in explanations).
        d_model: model width.
        n_heads: attention heads.
        n_layers: transformer blocks.
        d_ff: feed-forward width.
        dropout: dropout on embeddings and in blocks.
        max_len: history length read by the model (linked from the data module).
        num_features: distinct categorical item features (linked from `data.item_features`; 0: ids only): an
            item's vector adds its features' mean embedding, a cold item's is that alone; needs `items.tied: true`.
        features_per_item: the most features an item has (linked from the data module); 0 without features.
        lr: peak learning rate (AdamW). 1e-2 by default: our item vectors enter at unit scale (x sqrt(d_model)),
            and a smaller rate learns them more slowly per epoch (docs/results.md, "Why short races lost").
        weight_decay: AdamW weight decay (decoupled; with `optimizer.item_optimizer: rowwise_adagrad` also on the
            item rows a step touches).
        block: the transformer blocks' shape (`streamrec.model.options.BlockOptions`).
        mixing: how blocks mix positions: attention kind, low-pass branch (`MixingOptions`).
        items: how items become vectors: tied scores, dropouts (`ItemOptions`).
        objective: the loss and its terms: label smoothing, R-Drop, negatives (`ObjectiveOptions`).
        contrastive: the contrastive term (`ContrastiveOptions`).
        optimizer: the schedule and the item tables' optimizer (`OptimizerOptions`).
        evaluation: what validation and test measure (`EvalOptions`).
        speed: how the network runs, not what it computes (`core.nn.options.SpeedOptions`)."""

    upgrade_hparams = staticmethod(upgrade_hparams)  # old checkpoints' flat names, for the loaders

    def __init__(self, num_items: int = 1, *, arch: Arch = "sasrec", d_model: int = 64, n_heads: int = 2,
                 n_layers: int = 2, d_ff: int = 256, dropout: float = 0.2, max_len: int = MAX_LEN,
                 num_features: int = 0, features_per_item: int = 0, lr: float = 1e-2, weight_decay: float = 0.0,
                 block: BlockOptions = BlockOptions(), mixing: MixingOptions = MixingOptions(),
                 items: ItemOptions = ItemOptions(), objective: ObjectiveOptions = ObjectiveOptions(),
                 contrastive: ContrastiveOptions = ContrastiveOptions(),
                 optimizer: OptimizerOptions = OptimizerOptions(), evaluation: EvalOptions = EvalOptions(),
                 speed: SpeedOptions = SpeedOptions()):
        super().__init__()
        given = (block, mixing, items, objective, contrastive, optimizer, evaluation, speed)
        groups = {name: cls.of(value, f"model.{name}")
                  for (name, cls), value in zip(GROUPS.items(), given, strict=True)}
        self.objective, self.contrastive = groups["objective"], groups["contrastive"]
        self.optim, self.evaluation, self.speed = groups["optimizer"], groups["evaluation"], groups["speed"]
        network = network_class(arch)
        check_training(self.objective, self.contrastive, self.optim, num_features)
        network.refuse_training(self.objective, self.contrastive, self.optim)
        # Plain values only: checkpoints are read by the restricted unpickler, which builds none of our classes.
        self.save_hyperparameters({
            "num_items": num_items, "arch": arch, "d_model": d_model, "n_heads": n_heads, "n_layers": n_layers,
            "d_ff": d_ff, "dropout": dropout, "max_len": max_len, "num_features": num_features,
            "features_per_item": features_per_item, "lr": lr, "weight_decay": weight_decay,
            **{name: group.as_dict() for name, group in groups.items()},
        })
        self.model = network(**{k: groups.get(k, self.hparams.get(k)) for k in NETWORK_KEYS})
        if self.speed.cpu_fastpath:
            enable_cpu_fastpath(self.model)
        if self.optim.sparse:
            # The input lookup's gradient becomes (rows read, D) instead of (N+1, D); DDP reads the flag when it
            # wraps the model and expects a sparse gradient for these tables.
            for table in self._item_table_modules():
                table.sparse = True
        self.loss_fn = Objective(self.objective, self.contrastive, sparse=self.optim.sparse)
        ks, exclude_seen = self.evaluation.ks, self.evaluation.exclude_seen
        self.val_metrics = RankingMetrics(ks, exclude_seen, cross_entropy=True)
        self.test_metrics = RankingMetrics(ks, exclude_seen, cross_entropy=True)
        self.sampled_metrics = (SampledRankingMetrics(num_items, ks, exclude_seen=exclude_seen)
                                if self.evaluation.sampled_metrics else None)
        self.baseline_metrics = RankingMetrics(ks, exclude_seen) if self.evaluation.popularity_baseline else None
        self.item_vocab: ItemVocab | None = None
        self._compiled = False
        self._partners: SameTargetWindows | None = None  # training windows by last target, on the first draw
        # (N+1,) item counts in the training histories, filled in setup() (zeros until then). Sized here, not
        # there: a weight-averaging callback (Lightning's EMAWeightAveraging) copies the module before setup.
        self.register_buffer("item_counts", torch.zeros(num_items + 1), persistent=False)

    @classmethod
    def from_hparams(cls, hparams: Mapping[str, Any]) -> StreamRecModule:
        """The module stored hyper-parameters describe (old names mapped), refusing a key it does not know."""
        return cls(**module_settings(hparams))

    def setup(self, stage: str) -> None:
        destroy_process_group_at_exit()  # each DDP rank, once its process group exists
        self._compile()
        datamodule = getattr(self.trainer, "datamodule", None)
        if datamodule is None:
            return
        mixing, prefixes = self.model.mixing, getattr(datamodule, "prefixes", False)
        if stage == "fit" and mixing.lowpass_kind == "fourier" and mixing.lowpass_alpha > 0 and not prefixes:
            raise InputError("`model.mixing.lowpass_kind: fourier` reads each position's future, so it trains at the "
                             "last position only: set `data.prefixes: true` (or `model.mixing.lowpass_kind: causal`)")
        if datamodule.num_items != self.hparams.num_items:
            raise ValueError(f"the data has {datamodule.num_items} items but the model was built for "
                             f"{self.hparams.num_items}; use the checkpoint's data file or retrain")
        self.item_vocab = datamodule.vocab
        self.item_counts.copy_(datamodule.train_item_counts())
        self._take_item_features(datamodule)
        if stage == "fit":  # a resumed fit restores its trained rows after this
            self._start_items(datamodule)

    def _take_item_features(self, datamodule: Any) -> None:
        """The data's feature table into the model's buffers; cold items are those the training histories lack."""
        hp, features = self.hparams, getattr(datamodule, "item_features", None)
        found = (0, 0) if features is None else (datamodule.num_features, datamodule.features_per_item)
        if found != (hp.num_features, hp.features_per_item):
            raise ValueError(f"the data has {found[0]} item features ({found[1]} per item) but the model was built "
                             f"for {hp.num_features} ({hp.features_per_item}); use the checkpoint's data and "
                             "`item_features` file, or retrain")
        if features is not None:
            self.model.set_item_features(features.to(self.device), self.item_counts == 0)

    def _start_items(self, datamodule: Any) -> None:
        """The data's item vectors (`data.item_vectors`), if any, as the id table's start."""
        vectors = getattr(datamodule, "item_vectors", None)
        if vectors is not None:
            started = self.model.start_items_from(vectors.to(self.device))
            log.info("item vectors: %d of %d items start at their vectors' principal components", started,
                     self.hparams.num_items)

    def _compile(self) -> None:
        """Compile the encoder once, in the process that trains: a spawned DDP rank unpickles an eager module."""
        mode = self.speed.compile_mode
        if mode is None or self._compiled:
            return
        compile_in_place([self.model.encoder], mode, self.speed.compile_backend)
        if mode == "reduce-overhead":
            self.model.length_multiple = BUCKET
        self._compiled = True

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Scoring and explanations read original item ids from the checkpoint alone.
        if self.item_vocab is not None:
            checkpoint[VOCAB_KEY] = self.item_vocab.to_dict()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)  # refuses a checkpoint that does not fit
        if VOCAB_KEY in checkpoint:
            self.item_vocab = ItemVocab.from_dict(checkpoint[VOCAB_KEY])

    def training_step(self, batch: TrainBatch, batch_idx: int) -> Tensor:
        partners = self.partner_inputs if self.contrastive.positive == "same_target" else None
        loss, positions = self.loss_fn(self.model, batch, self.item_counts, partners)
        self.log("train_loss", loss, prog_bar=True, batch_size=positions)
        return loss

    def partner_inputs(self, last_targets: Tensor) -> Tensor:
        """(B, max_len) inputs of a training window ending in each of the (B,) last targets, for
        `contrastive.positive: same_target`. Drawn from (seed, global step), so a resumed run draws the same."""
        if self._partners is None:  # the windows of the loader being trained on, with or without a data module
            dataset = getattr(self.trainer.train_dataloader, "dataset", None)
            if not isinstance(dataset, TrainDataset):
                raise RuntimeError("`contrastive.positive: same_target` draws windows from the training data: train "
                                   "on a StreamRecDataModule's training loader")
            self._partners = SameTargetWindows(dataset, self.hparams.num_items)
        seed = torch.initial_seed() % 2**31  # seed_everything's
        generator = torch.Generator().manual_seed(seed * 1_000_003 + self.global_step)
        return self._partners.draw(last_targets, self.hparams.max_len, generator).to(last_targets.device)

    def configure_optimizers(self) -> dict[str, Any]:
        opt = self.make_optimizer()
        sched = WarmupCosineLR.for_run(opt, self.optim.warmup_steps, run_steps=self.trainer.estimated_stepping_batches,
                                       floor=self.optim.lr_floor, clock_limited=stops_on_time(self.trainer.callbacks))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def make_optimizer(self) -> torch.optim.Optimizer:
        """AdamW on every parameter, or (`item_optimizer: rowwise_adagrad`) one optimizer with AdamW on all but
        the item table(s) and row-wise AdaGrad on those (`core.nn.optim.RowwiseAdagradAdamW`), at the peak rate."""
        hp = self.hparams
        if not self.optim.sparse:
            return torch.optim.AdamW(self.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
        tables = [m.weight for m in self._item_table_modules()]
        dense = [p for p in self.parameters() if not any(p is t for t in tables)]
        return RowwiseAdagradAdamW([{"params": dense}, {"params": tables, "rowwise": True, "lr": self.optim.item_lr}],
                                   lr=hp.lr, weight_decay=hp.weight_decay)

    def configure_gradient_clipping(self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        """Lightning's clipping, except that `rowwise_adagrad`'s sparse table gradients are left out: torch's
        norms refuse sparse tensors, and AdaGrad already divides each row by its own gradient history."""
        if not self.optim.sparse or not gradient_clip_val:
            return super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
        dense = [p for g in optimizer.param_groups if not g.get("rowwise") for p in g["params"]]
        if gradient_clip_algorithm == "value":
            torch.nn.utils.clip_grad_value_(dense, gradient_clip_val)
        else:
            torch.nn.utils.clip_grad_norm_(dense, gradient_clip_val)
        return None

    def _item_table_modules(self) -> list[torch.nn.Embedding]:
        """The (N+1, D) tables: the input embedding, and the output table when it is not tied."""
        tables = [self.model.item_embedding.embedding]
        return tables if self.model.output is None else [*tables, self.model.output]

    def validation_step(self, batch: EvalBatch, batch_idx: int) -> None:
        self._evaluate(batch, self.val_metrics)

    def test_step(self, batch: EvalBatch, batch_idx: int) -> None:
        self._evaluate(batch, self.test_metrics)

    def _evaluate(self, batch: EvalBatch, metrics: RankingMetrics) -> None:
        scores = self.model.recommend_scores(batch.inputs).float()  # (B, N+1)
        metrics.update(scores, batch.targets, batch.seen)
        if self.sampled_metrics is not None:
            self.sampled_metrics.update(scores, batch.targets, batch.seen)
        if self.baseline_metrics is not None and self.item_counts.any():
            popular = most_popular_scores(self.item_counts, scores.shape[0])
            self.baseline_metrics.update(popular, batch.targets, batch.seen)

    def on_validation_epoch_end(self) -> None:
        self._log_metrics("val", self.val_metrics)

    def on_test_epoch_end(self) -> None:
        self._log_metrics("test", self.test_metrics)

    def _log_metrics(self, prefix: str, metrics: RankingMetrics) -> None:
        # compute() already reduces the metric states across DDP ranks.
        values = metrics.compute()
        if self.sampled_metrics is not None:
            values.update(self.sampled_metrics.compute())
            self.sampled_metrics.reset()
        if self.baseline_metrics is not None and self.baseline_metrics.update_count:
            values.update({f"mostpop_{k}": v for k, v in self.baseline_metrics.compute().items()})
            self.baseline_metrics.reset()
        metrics.reset()
        for name, value in values.items():
            # compute() gave every rank the same value: `max` keeps it exact and silences Lightning's
            # "use sync_dist in distributed setting" warning (one per metric under DDP).
            self.log(f"{prefix}_{name}", value, prog_bar=name == "ndcg@10", sync_dist=True, reduce_fx="max")

    # How `predict` ranks; `ranking.predict.RecommendationWriter` sets it from its arguments. Not a hyper-parameter:
    # when predicting, a checkpoint's would override the command line's.
    predict_options: RankingOptions = RankingOptions()

    def predict_step(self, batch: PredictBatch, batch_idx: int) -> RankedBatch:
        """The best items after each user's whole history (`StreamRecDataModule.predict_dataloader`)."""
        top = rank(self.model, batch.inputs, batch.seen, self.predict_options)
        return RankedBatch(batch.rows, batch.users, top.items, top.scores)
