"""StreamRec training logic: losses, optimisation, full-catalogue validation.

The constructor is the config schema (LightningCLI turns it into `--model.*` and YAML);
`num_items` and `max_len` are linked from the data module so nobody types them twice.

Legend: B batch, T history length, D model width, N items, M non-padding positions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import lightning as L
import torch
from torch import Tensor

from core.nn import WarmupCosineLR, contrastive_loss, stops_on_time
from core.nn.attention import AttentionKind
from core.nn.blocks import Activation
from core.nn.compile import BUCKET, CompileMode, check_backend, compile_in_place, compile_mode
from core.nn.cpu_fastpath import enable_cpu_fastpath
from core.nn.mixing import LowPassKind
from core.nn.optim import RowwiseAdagradAdamW
from core.nn.stacks import Positions
from core.runtime.checkpoint import SafeLoadMixin
from core.runtime.deprecation import warn_renamed
from core.runtime.distributed import destroy_process_group_at_exit
from core.runtime.errors import InputError
from streamrec.data.constants import MAX_LEN
from streamrec.data.datasets import EvalBatch, PredictBatch, SameTargetWindows, TrainBatch, TrainDataset
from streamrec.data.vocab import VOCAB_KEY, ItemVocab
from streamrec.model import losses
from streamrec.model.metrics import RankingMetrics, SampledRankingMetrics, most_popular_scores
from streamrec.model.network import Arch, StreamRecModel
from streamrec.ranking.batch import RankingOptions, rank
from streamrec.ranking.predict import RankedBatch

LossName = Literal["full", "sampled", "bce", "gbce"]
ItemOptimizer = Literal["adamw", "rowwise_adagrad"]


FULL_SOFTMAX_TERMS = ("label_smoothing", "rdrop_alpha", "contrastive_weight")


def full_softmax_terms(hparams: Mapping[str, Any]) -> list[str]:
    """The training terms `hparams` turns on that ride on the full softmax, so that `loss` must stay full.

    One list for the module's refusal and for `tune`, which leaves the loss out of its search when a config sets one.
    """
    return [name for name in FULL_SOFTMAX_TERMS if hparams.get(name)]


class StreamRecModule(SafeLoadMixin, L.LightningModule):
    """Next-item recommender: a session network trained to predict the next items (`streamrec.model.network`).

    Args:
        num_items: catalogue size N (linked from the data module).
        arch: the network. sasrec (default): a causal transformer trained to predict every next item. bert4rec:
            a bidirectional transformer trained to fill masked items (`mask_prob`), recommending from a mask
            token after the history. gru: GRU4Rec, a recurrent network trained like sasrec (`n_layers` GRU
            layers of width `d_model`; the attention options do not apply, and explanations have no attention
            view).
        d_model: model width.
        n_heads: attention heads.
        n_kv_heads: key/value heads for grouped-query attention (default n_heads).
        n_layers: transformer blocks.
        d_ff: feed-forward width.
        dropout: dropout on embeddings and in blocks.
        attn_dropout: dropout on attention weights.
        max_len: history length read by the model (linked from the data module).
        positions: learned (SASRec), sinusoidal, rope, alibi or none.
        activation: feed-forward activation.
        gated_residual: each block's two residual updates scaled by a learned sigmoid gate of the block's input
            (LiGR's block, which eSASRec trains with `activation: swiglu`; `core.nn.blocks`). Transformer
            networks only (sasrec, bert4rec).
        tied: score with the item embedding (True) or a separate output table.
        item_init_std: standard deviation of the initial item vectors (None: d_model ** -0.5).
        lowpass_alpha: weight of a causal low-pass filter branch mixed with each layer's attention (BSARec's
            "beyond self-attention", made causal: `core.nn.mixing`); 0 (default): attention only.
        lowpass_window: that filter's moving-average length in items (fourier: BSARec's c, `core.nn.mixing`).
        lowpass_kind: causal (default), or fourier: BSARec's own filter over the whole history, which reads each
            position's future, so it needs training at the last position only (`data.prefixes: true`).
        num_features: distinct categorical item features (linked from the data module's `item_features`); 0: items
            are ids only. An item's vector is then its id embedding plus the mean of its features' embeddings, and a
            cold item's (never in the training histories) its features' alone; needs `tied: true`.
        features_per_item: the most features an item has (linked from the data module); 0 without features.
        id_dropout: with item features, the share of item id vectors left out in training (each occurrence, in the
            inputs and the scored table), so that items are also learnt by their features alone, as DropoutNet
            trains for cold start: cold items have nothing else to be scored by. 0 (default): none.
        history_dropout: the share of history items blanked in training (input vector zeroed, position kept; each
            pass draws its own, so the contrastive term's two views differ by items too, as CL4SRec's item masks
            do), against leaning on single past items, which short sparse histories invite. It did not beat
            `beauty.yaml` on Beauty's validation (docs/results.md, "StreamRec"). 0 (default): none.
        attention: full (default), or for histories of thousands of items, with time and memory linear in
            their length: window (each position attends to the last `attention_window` items) or linear
            (linear attention, elu + 1 features). `core.nn.attention.MultiHeadAttention`'s `kind`.
        attention_window: the window of `attention: window`.
        mask_prob: bert4rec's share of history items masked in each training sequence (at least one per
            sequence); unused by the other networks.
        output_head: a dense layer, GELU and LayerNorm on each hidden state before it is scored: BERT's
            masked-LM head, part of BERT4Rec as published (and of RecBole's); any network takes it.
        loss: full (softmax over all items), sampled (softmax over shared negatives with
            logQ correction), bce (SASRec: one negative set per position), gbce (gSASRec).
        label_smoothing: eps of label smoothing in the full softmax (eps / N on every item); 0: none.
        rdrop_alpha: R-Drop's weight (Liang et al., 2021; 0, the default, is off): each training batch runs
            through two dropout masks, and `core.rdrop_cross_entropy` adds the symmetric KL between the two
            predicted next-item distributions to their mean cross-entropy. A training step costs about twice
            as much; needs `loss: full`.
        contrastive_weight: weight of a contrastive term (CL4SRec, DuoRec; 0, the default, is off): each batch
            runs through two dropout masks, and each window's last state must pick its other view out of the
            batch (`core.contrastive_loss`; windows with the same last target are not negatives, as DuoRec
            has it), added to the two passes' mean cross-entropy. About twice the step (`second_pass_softmax`);
            `loss: full`, and a causal network (sasrec, gru).
        contrastive_temperature: that term's temperature on dot products (1, as CL4SRec and DuoRec).
        contrastive_positive: what the term's second view of a window is. dropout (default): the window itself under
            another dropout mask (CL4SRec's and DuoRec's unsupervised view). same_target: another training window
            with the same last target (DuoRec's supervised positive: two histories heading for the same item should
            look alike; `streamrec.data.datasets.SameTargetWindows`); needs `second_pass_softmax: false`, since the
            second pass then encodes other windows.
        second_pass_softmax: with the contrastive term alone, whether the second pass also trains the full softmax
            at every position. False runs it for the term only (its last state, as DuoRec arranges the passes):
            the softmax over the catalogue is most of a step on sparse data, so the term then costs a fraction of
            a step instead of doubling it. R-Drop needs both passes' softmax.
        num_negatives: negatives per step (sampled: shared by the batch; bce/gbce: per position).
        negative_sampling: uniform or popularity (popularity only for `sampled`).
        gbce_t: gSASRec calibration t in [0, 1] (0 = plain BCE).
        lr: peak learning rate (AdamW). 1e-2 by default: our item vectors enter at unit scale (x sqrt(d_model))
            and 1e-3 learned several times slower per epoch; picked on validation of Beauty, Sports, Yelp
            and ML-1M (docs/results.md, "Why short races lost").
        weight_decay: AdamW weight decay (decoupled; with `rowwise_adagrad` also on the item rows a step touches).
        item_optimizer: how the item table(s) learn. adamw (default): like every other parameter, with a dense
            (N, D) gradient and two AdamW states, about 6 item tables at the peak of a step. rowwise_adagrad:
            sparse gradients (only the rows a step reads: its inputs, targets and negatives) and row-wise AdaGrad
            with one accumulator per row (TorchRec / FBGEMM's embedding optimizer), about 1 table plus the
            touched rows; the rest of the model keeps AdamW and the schedule scales both. Use it when the item
            table dominates memory (millions of items); it needs a sampled loss (sampled, bce or gbce), and
            under DDP a backend that all-reduces sparse gradients (gloo; not NCCL).
        item_lr: peak learning rate of the item rows under `rowwise_adagrad` (unused with adamw). AdaGrad's steps
            shrink as a row's squared gradients add up, so it wants a larger rate than AdamW: on the demo data
            (10 epochs, lr 3e-3, `loss: sampled`) val NDCG@10 was 0.58 at 3e-3, 0.70 at 0.03, 0.72 at 0.1 and 0.3,
            against AdamW's 0.69.
        warmup_steps: linear warmup steps of the warmup-cosine schedule.
        lr_floor: final learning rate as a fraction of the peak.
        ks: cutoffs for HR@K, NDCG@K, MRR@K.
        exclude_seen: leave items already in the history out of the validation and test ranking.
        sampled_metrics: also log the SASRec paper's sampled metrics (100 negatives; for comparison only).
        popularity_baseline: also log a most-popular baseline's metrics on the same cases
            (`*_mostpop_*`), so every run shows what the model adds.
        cpu_fastpath: fp32 CPU linears in oneDNN and a cheaper dropout mask (`core.nn.cpu_fastpath`; off: plain
            `nn.Linear` / `nn.Dropout`). Off by default: what it gains depends on the CPU, and beam search may not
            gain (`benchmarks/cpu_fastpath.py` measures it; docs/results.md, "CPU fast path").
        compile: torch.compile the encoder stack when a trainer sets the module up (`core.nn.compile`): null or
            false (default) runs eager; default, reduce-overhead (CUDA graphs; batch lengths are then rounded up
            to a multiple of 16 so that a few graphs serve every batch), max-autotune or
            max-autotune-no-cudagraphs. The first steps are slower while it compiles; checkpoints are the same
            either way, and `load_from_checkpoint` outside a trainer stays eager.
        compile_backend: torch.compile backend; "eager" or "aot_eager" check the plumbing without inductor.
        filter_seen: deprecated: the old name of `exclude_seen`.
    """

    def __init__(
        self, num_items: int = 1, *, arch: Arch = "sasrec", d_model: int = 64, n_heads: int = 2,
        n_kv_heads: int | None = None, n_layers: int = 2, d_ff: int = 256, dropout: float = 0.2,
        attn_dropout: float = 0.0, max_len: int = MAX_LEN,
        positions: Positions = "learned", activation: Activation = "gelu", gated_residual: bool = False,
        tied: bool = True, item_init_std: float | None = None, lowpass_alpha: float = 0.0, lowpass_window: int = 16,
        lowpass_kind: LowPassKind = "causal",
        num_features: int = 0, features_per_item: int = 0, id_dropout: float = 0.0, history_dropout: float = 0.0,
        attention: AttentionKind = "full", attention_window: int = 256, mask_prob: float = 0.2,
        output_head: bool = False, loss: LossName = "full",
        label_smoothing: float = 0.0, rdrop_alpha: float = 0.0, contrastive_weight: float = 0.0,
        contrastive_temperature: float = 1.0, contrastive_positive: Literal["dropout", "same_target"] = "dropout",
        second_pass_softmax: bool = True, num_negatives: int = 256,
        negative_sampling: Literal["uniform", "popularity"] = "uniform", gbce_t: float = 0.75,
        lr: float = 1e-2, weight_decay: float = 0.0, item_optimizer: ItemOptimizer = "adamw",
        item_lr: float = 0.1, warmup_steps: int = 100, lr_floor: float = 0.1,
        ks: tuple[int, ...] = (10, 20), exclude_seen: bool = True, sampled_metrics: bool = False,
        popularity_baseline: bool = True, cpu_fastpath: bool = False, compile: bool | CompileMode | None = None,
        compile_backend: str = "inductor", filter_seen: bool | None = None,
    ):
        super().__init__()
        if filter_seen is not None:  # the deprecated name, still read from old configs and checkpoints
            warn_renamed("`filter_seen`", "`exclude_seen`")
            exclude_seen = filter_seen
        if loss not in ("full", "sampled", "bce", "gbce"):
            raise ValueError(f"`loss` must be full, sampled, bce or gbce, got {loss!r}")
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"`label_smoothing` must be in [0, 1), got {label_smoothing}")
        if rdrop_alpha < 0.0:
            raise ValueError(f"`rdrop_alpha` must be >= 0 (0 turns R-Drop off), got {rdrop_alpha}")
        if contrastive_weight < 0.0 or contrastive_temperature <= 0.0:
            raise ValueError(f"`contrastive_weight` must be >= 0 and `contrastive_temperature` > 0, got "
                             f"{contrastive_weight} and {contrastive_temperature}")
        terms = full_softmax_terms({"label_smoothing": label_smoothing, "rdrop_alpha": rdrop_alpha,
                                    "contrastive_weight": contrastive_weight})
        if terms and loss != "full":
            one = len(terms) == 1
            raise ValueError(f"{' and '.join(f'`{t}`' for t in terms)} {'needs' if one else 'need'} `loss: full`, "
                             f"not {loss!r}; {' '.join(f'--model.{t} 0' for t in terms)} trains without "
                             f"{'it' if one else 'them'}")
        if contrastive_weight and arch == "bert4rec":
            raise ValueError("`contrastive_weight` needs a causal network (sasrec, gru), not bert4rec; "
                             "`--model.contrastive_weight 0` trains without it")
        if not second_pass_softmax and (not contrastive_weight or rdrop_alpha):
            raise ValueError("`second_pass_softmax: false` needs the contrastive term without R-Drop "
                             f"(contrastive_weight > 0, rdrop_alpha 0), got {contrastive_weight} and {rdrop_alpha}")
        if contrastive_positive not in ("dropout", "same_target"):
            raise ValueError(f"`contrastive_positive` must be dropout or same_target, got {contrastive_positive!r}")
        if contrastive_positive == "same_target" and second_pass_softmax:
            raise ValueError("`contrastive_positive: same_target` needs `second_pass_softmax: false` (and the "
                             "contrastive term): its second pass encodes other windows than the first")
        if loss != "full" and num_negatives < 1:
            raise ValueError(f"`num_negatives` must be >= 1 for loss={loss!r}, got {num_negatives}")
        if negative_sampling == "popularity" and loss != "sampled":
            raise ValueError("`negative_sampling: popularity` needs `loss: sampled` (it relies on the logQ correction)")
        if item_optimizer not in ("adamw", "rowwise_adagrad"):
            raise ValueError(f"`item_optimizer` must be adamw or rowwise_adagrad, got {item_optimizer!r}")
        if item_optimizer == "rowwise_adagrad" and loss == "full":
            raise ValueError("`item_optimizer: rowwise_adagrad` needs a sampled loss (sampled, bce or gbce): "
                             "`loss: full` gives every item row a gradient each step")
        if item_optimizer == "rowwise_adagrad" and num_features:
            raise ValueError("`item_optimizer: rowwise_adagrad` does not work with item features: every item's "
                             "vector reads the shared feature table; use `item_optimizer: adamw`")
        if item_optimizer == "rowwise_adagrad" and arch == "bert4rec":
            raise ValueError("`item_optimizer: rowwise_adagrad` does not work with arch bert4rec (its item table "
                             "holds the mask token, which is never scored); use `item_optimizer: adamw`")
        if item_lr <= 0:
            raise ValueError(f"`item_lr` must be > 0, got {item_lr}")
        if not 0.0 < mask_prob < 1.0:
            raise ValueError(f"`mask_prob` must be in (0, 1), got {mask_prob}")
        compile_mode(compile)  # refuse a bad value before any training
        check_backend(compile_backend)
        self.save_hyperparameters(ignore=["filter_seen"])
        self.model = StreamRecModel(
            num_items, d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads, n_layers=n_layers, d_ff=d_ff,
            dropout=dropout, attn_dropout=attn_dropout, max_len=max_len, positions=positions, activation=activation,
            tied=tied, item_init_std=item_init_std, lowpass_alpha=lowpass_alpha, lowpass_window=lowpass_window,
            lowpass_kind=lowpass_kind,
            num_features=num_features, features_per_item=features_per_item, id_dropout=id_dropout,
            attention=attention, attention_window=attention_window, arch=arch, output_head=output_head,
            gated_residual=gated_residual, history_dropout=history_dropout,
        )
        if cpu_fastpath:
            enable_cpu_fastpath(self.model)
        if item_optimizer == "rowwise_adagrad":
            # The input lookup's gradient becomes (rows read, D) instead of (N+1, D); DDP reads the flag when it
            # wraps the model and expects a sparse gradient for these tables.
            for table in self._item_table_modules():
                table.sparse = True
        self.val_metrics = RankingMetrics(ks, exclude_seen)
        self.test_metrics = RankingMetrics(ks, exclude_seen)
        self.sampled_metrics = (
            SampledRankingMetrics(num_items, ks, filter_seen=exclude_seen) if sampled_metrics else None
        )
        self.baseline_metrics = RankingMetrics(ks, exclude_seen) if popularity_baseline else None
        self.item_vocab: ItemVocab | None = None
        self._compiled = False
        self._partners: SameTargetWindows | None = None  # training windows by last target, on the first draw
        # (N+1,) item counts in the training histories, filled in setup() (zeros until then). Sized here, not
        # there: a weight-averaging callback (Lightning's EMAWeightAveraging) copies the module before setup.
        self.register_buffer("item_counts", torch.zeros(num_items + 1), persistent=False)

    # ------------------------------------------------------------------ setup and checkpoints
    def setup(self, stage: str) -> None:
        destroy_process_group_at_exit()  # each DDP rank, once its process group exists
        self._compile()
        datamodule = getattr(self.trainer, "datamodule", None)
        if datamodule is None:
            return
        hp = self.hparams
        prefixes = getattr(datamodule, "prefixes", False)
        if stage == "fit" and hp.lowpass_kind == "fourier" and hp.lowpass_alpha > 0 and not prefixes:
            raise InputError("`model.lowpass_kind: fourier` reads each position's future, so it trains at the last "
                             "position only: set `data.prefixes: true` (or `model.lowpass_kind: causal`)")
        if datamodule.num_items != self.hparams.num_items:
            raise ValueError(f"the data has {datamodule.num_items} items but the model was built for "
                             f"{self.hparams.num_items}; use the checkpoint's data file or retrain")
        self.item_vocab = datamodule.vocab
        self.item_counts.copy_(datamodule.train_item_counts())
        self._take_item_features(datamodule)

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

    def _compile(self) -> None:
        """Compile the encoder once, in the process that trains: a spawned DDP rank unpickles an eager module."""
        mode = compile_mode(self.hparams.compile)
        if mode is None or self._compiled:
            return
        compile_in_place([self.model.encoder], mode, self.hparams.compile_backend)
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

    # ------------------------------------------------------------------ training
    def training_step(self, batch: TrainBatch, batch_idx: int) -> Tensor:
        hp, inputs, targets = self.hparams, batch.inputs, batch.targets
        if hp.arch == "bert4rec":  # the cloze task on each sequence's last T items
            items = torch.cat([inputs, targets[:, -1:]], dim=1)[:, 1:]  # (B, T): targets' last column ends a row
            inputs, targets = self.model.mask_items(items, hp.mask_prob)
        last = 1 if batch.last_only and hp.arch != "bert4rec" else None  # prefix windows
        two_passes = (hp.rdrop_alpha > 0.0 or hp.contrastive_weight > 0.0) and hp.second_pass_softmax
        # (B, T', D), or (2B, T', D) with two passes
        hidden = self.model.encode(inputs.repeat(2, 1) if two_passes else inputs, trim=True, last=last)
        targets = targets[:, -hidden.shape[1]:]  # inputs and targets share their padding; all-padding columns skipped
        keep = targets != 0
        if two_passes:
            loss = self.two_pass_loss(*hidden.chunk(2), targets, keep)
        else:
            loss = self.compute_loss(hidden[keep], targets[keep])  # (M, D), (M,)
            if hp.contrastive_weight > 0.0:  # the second pass for the term alone: only its last state
                views = inputs if hp.contrastive_positive == "dropout" else self.partner_inputs(targets[:, -1])
                second = self.model.encode(views, trim=True, last=1)[:, -1]
                loss = loss + self.contrastive_term(hidden[:, -1], second, targets)
        self.log("train_loss", loss, prog_bar=True, batch_size=int(keep.sum()))
        return loss

    def partner_inputs(self, last_targets: Tensor) -> Tensor:
        """(B, max_len) inputs of a training window ending in each of the (B,) last targets, for
        `contrastive_positive: same_target`. Drawn from (seed, global step), so a resumed run draws the same."""
        if self._partners is None:  # the windows of the loader being trained on, with or without a data module
            dataset = getattr(self.trainer.train_dataloader, "dataset", None)
            if not isinstance(dataset, TrainDataset):
                raise RuntimeError("`contrastive_positive: same_target` draws windows from the training data: train "
                                   "on a StreamRecDataModule's training loader")
            self._partners = SameTargetWindows(dataset, self.hparams.num_items)
        seed = torch.initial_seed() % 2**31  # seed_everything's
        generator = torch.Generator().manual_seed(seed * 1_000_003 + self.global_step)
        return self._partners.draw(last_targets, self.hparams.max_len, generator).to(last_targets.device)

    def two_pass_loss(self, first: Tensor, second: Tensor, targets: Tensor, keep: Tensor) -> Tensor:
        """The loss of (B, T', D) states of the same rows under two dropout masks: R-Drop's, or the two passes'
        mean cross-entropy, plus the contrastive term when it is on."""
        hp = self.hparams
        if hp.rdrop_alpha > 0.0:
            loss = losses.rdrop_softmax(torch.stack([first[keep], second[keep]]), targets[keep],
                                        self.model.item_vectors, hp.label_smoothing, hp.rdrop_alpha)
        else:  # without R-Drop's KL work
            loss = self.compute_loss(torch.cat([first[keep], second[keep]]), targets[keep].repeat(2))
        if hp.contrastive_weight > 0.0:
            loss = loss + self.contrastive_term(first[:, -1], second[:, -1], targets)
        return loss

    def contrastive_term(self, first: Tensor, second: Tensor, targets: Tensor) -> Tensor:
        """The weighted NT-Xent between two (B, D) views of each window's last state; windows are right-aligned, so
        the last column of the (B, T') targets is every row's last target, and rows sharing it are not negatives."""
        hp = self.hparams
        return hp.contrastive_weight * contrastive_loss(first, second, hp.contrastive_temperature,
                                                        groups=targets[:, -1])

    def compute_loss(self, hidden: Tensor, targets: Tensor) -> Tensor:
        """The configured loss on (M, D) states and (M,) next items."""
        hp, vectors = self.hparams, self.model.item_vectors
        sparse = hp.item_optimizer == "rowwise_adagrad"  # gather the scored rows; never touch the whole table
        if hp.loss == "full":
            return losses.full_softmax(hidden, targets, vectors, label_smoothing=hp.label_smoothing)
        if hp.loss == "sampled":
            probs = self.item_counts if hp.negative_sampling == "popularity" else None
            neg = losses.sample_negatives(hp.num_items, hp.num_negatives, hidden.device, probs)
            log_q = None if probs is None else (probs / probs[1:].sum()).clamp_min(1e-12).log()
            return losses.sampled_softmax(hidden, targets, vectors, neg, log_q, sparse=sparse)
        neg = torch.randint(1, hp.num_items + 1, (hidden.shape[0], hp.num_negatives), device=hidden.device)
        if hp.loss == "bce":
            return losses.bce(hidden, targets, vectors, neg, sparse=sparse)
        beta = losses.gbce_beta(hp.num_negatives, hp.num_items, hp.gbce_t)
        return losses.gbce(hidden, targets, vectors, neg, beta, sparse=sparse)

    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        opt = self.make_optimizer()
        sched = WarmupCosineLR.for_run(opt, hp.warmup_steps, run_steps=self.trainer.estimated_stepping_batches,
                                       floor=hp.lr_floor, clock_limited=stops_on_time(self.trainer.callbacks))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def make_optimizer(self) -> torch.optim.Optimizer:
        """AdamW on every parameter, or (`item_optimizer: rowwise_adagrad`) one optimizer with AdamW on all but
        the item table(s) and row-wise AdaGrad on those (`core.nn.optim.RowwiseAdagradAdamW`), at the peak rate."""
        hp = self.hparams
        if hp.item_optimizer == "adamw":
            return torch.optim.AdamW(self.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
        tables = [m.weight for m in self._item_table_modules()]
        dense = [p for p in self.parameters() if not any(p is t for t in tables)]
        return RowwiseAdagradAdamW([{"params": dense}, {"params": tables, "rowwise": True, "lr": hp.item_lr}],
                                   lr=hp.lr, weight_decay=hp.weight_decay)

    def configure_gradient_clipping(self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        """Lightning's clipping, except that `rowwise_adagrad`'s sparse table gradients are left out: torch's
        norms refuse sparse tensors, and AdaGrad already divides each row by its own gradient history."""
        if self.hparams.item_optimizer == "adamw" or not gradient_clip_val:
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

    # ------------------------------------------------------------------ evaluation
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

    # ------------------------------------------------------------------ prediction
    # How `predict` ranks; `ranking.predict.RecommendationWriter` sets it from its arguments. Not a hyper-parameter:
    # when predicting, a checkpoint's would override the command line's.
    predict_options: RankingOptions = RankingOptions()

    def predict_step(self, batch: PredictBatch, batch_idx: int) -> RankedBatch:
        """The best items after each user's whole history (`StreamRecDataModule.predict_dataloader`)."""
        top = rank(self.model, batch.inputs, batch.seen, self.predict_options)
        return RankedBatch(batch.rows, batch.users, top.items, top.scores)
