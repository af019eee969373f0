"""Translate training logic: label-smoothed cross-entropy, AdamW + warmup-cosine, BLEU validation. Under DDP each rank
decodes its own batches; at epoch end the (index, hypothesis) pairs of all ranks are gathered, duplicates (the batch
sampler repeats a few batches so ranks run equally many steps) are dropped by `Batch.index`, and every rank scores the
same merged corpus, so all ranks log the same `val_bleu` and the checkpoint callback agrees everywhere. The vocabularies
travel in the checkpoint (`VOCAB_KEY`), so inference needs nothing else.

Legend: B batch, S source length, T target length, V target vocabulary."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace
from typing import Any

import lightning as L
import sacrebleu
import torch
import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor

from core.nn import InverseSqrtLR, WarmupCosineLR, linear_cross_entropy, rdrop_cross_entropy, stops_on_time
from core.nn.compile import compile_in_place, pad_to_bucket
from core.nn.cpu_fastpath import enable_cpu_fastpath
from core.nn.options import SpeedOptions
from core.runtime.checkpoint import SafeLoadMixin
from core.runtime.distributed import destroy_process_group_at_exit, process_group_running
from translate.data.corpus import Batch, Split
from translate.data.vocab import PAD_ID, SubwordVocab, vocabs_from_checkpoint
from translate.model.hparams import upgrade_hparams
from translate.model.networks import Arch, TranslatorNetwork, build_translator
from translate.model.options import AdamWOptions, BleuOptions, LossOptions, RecurrentOptions, TransformerOptions
from translate.model.transformer import MAX_LEN
from translate.search.decoding import search
from translate.search.options import SearchOptions

GROUP_NAMES = ("block", "rnn", "objective", "optimizer", "evaluation", "speed")


def translation_loss(model: TranslatorNetwork, batch: Batch, pad_id: int, smoothing: float,
                     rdrop_alpha: float = 0.0) -> Tensor:
    """Mean label-smoothed cross-entropy (PyTorch's definition) per non-padding target token of a batch. Computed from
    the decoder states without a (tokens, V) logits tensor (`core.nn.linear_cross_entropy`). With `rdrop_alpha` > 0
    (training only: it needs dropout) the batch runs twice in one forward pass and R-Drop's symmetric KL between the two
    predictions is added."""
    keep = batch.tgt_out != pad_id
    targets = batch.tgt_out[keep]
    if rdrop_alpha > 0.0:
        states = model.states(batch.src.repeat(2, 1), batch.tgt_in.repeat(2, 1))  # (2B, T, D)
        pair = torch.stack([half[keep] for half in states.chunk(2)])  # (2, tokens, D)
        return rdrop_cross_entropy(pair, model.output.weight, targets, smoothing, rdrop_alpha)
    states = model.states(batch.src, batch.tgt_in)  # (B, T, D)
    return linear_cross_entropy(states[keep], model.output.weight, targets, smoothing)


def corpus_scores(hypotheses: list[str], references: list[str], tokenize: str = "13a",
                  lowercase: bool = False) -> tuple[float, float, str]:
    """sacreBLEU corpus BLEU, chrF and the BLEU signature for detokenised text."""
    # force: pre-tokenised references (the demo's " ." endings) are not an error here, since
    # sentencepiece's detokenised output reproduces the spacing of the training text.
    bleu = sacrebleu.BLEU(tokenize=tokenize, lowercase=lowercase, force=True)
    score = bleu.corpus_score(hypotheses, [references]).score
    chrf = sacrebleu.CHRF().corpus_score(hypotheses, [references]).score
    return score, chrf, str(bleu.get_signature())


class TranslationModule(SafeLoadMixin, L.LightningModule):
    """Encoder-decoder translator trained with label-smoothed cross-entropy, validated by BLEU.

    Args:
        src_vocab_size: source vocabulary size (linked from the data module).
        tgt_vocab_size: target vocabulary size (linked from the data module).
        pad_id: padding id (linked from the data module).
        arch: the network: "transformer" or "rnn" (a bidirectional GRU/LSTM encoder and an attentional decoder
            with input feeding); `n_heads`, `d_ff` and the `block` group are the transformer's only.
        d_model: model width.
        n_heads: attention heads; must divide d_model.
        n_encoder_layers: encoder blocks.
        n_decoder_layers: decoder blocks.
        d_ff: feed-forward width.
        dropout: dropout on embeddings and inside blocks.
        max_len: longest source or target in subwords (linked from `data.max_len`).
        share_embeddings: one embedding for source, target and output (needs a joint vocabulary).
        lr: peak learning rate (AdamW).
        weight_decay: AdamW weight decay.
        block: the transformer's blocks: grouped-query heads, dropouts, positions, activation, pre- or post-LN.
        rnn: the rnn's cell, attention score function and recurrent width.
        objective: the loss: label smoothing and R-Drop.
        optimizer: AdamW's betas and the learning-rate schedule (warmup, cosine or inverse square root).
        evaluation: how validate and test decode (beam widths, length penalty) and score BLEU.
        speed: how the network runs (CPU fast path, torch.compile); a checkpoint is the same under every setting."""

    upgrade_hparams = staticmethod(upgrade_hparams)

    def __init__(
        self, src_vocab_size: int = 8, tgt_vocab_size: int = 8, *, pad_id: int = PAD_ID, arch: Arch = "transformer",
        d_model: int = 256, n_heads: int = 4, n_encoder_layers: int = 3, n_decoder_layers: int = 3,
        d_ff: int = 1024, dropout: float = 0.1, max_len: int = MAX_LEN, share_embeddings: bool = True,
        lr: float = 1e-3, weight_decay: float = 1e-4,
        block: TransformerOptions = TransformerOptions(),  # noqa: B008 - frozen: one shared default is safe
        rnn: RecurrentOptions = RecurrentOptions(),  # noqa: B008
        objective: LossOptions = LossOptions(),  # noqa: B008
        optimizer: AdamWOptions = AdamWOptions(),  # noqa: B008
        evaluation: BleuOptions = BleuOptions(),  # noqa: B008
        speed: SpeedOptions = SpeedOptions(),  # noqa: B008
    ):
        super().__init__()
        if not 0.0 <= dropout <= 1.0:
            raise ValueError(f"`model.dropout` ({dropout}) must be a probability in [0, 1]")
        self.block = TransformerOptions.of(block, "model.block")
        self.rnn = RecurrentOptions.of(rnn, "model.rnn")
        self.objective = LossOptions.of(objective, "model.objective")
        self.optimizer = AdamWOptions.of(optimizer, "model.optimizer")
        self.evaluation = BleuOptions.of(evaluation, "model.evaluation")
        self.speed = SpeedOptions.of(speed, "model.speed")
        # Plain values only: checkpoints are read back with torch.load(weights_only=True).
        self.save_hyperparameters({
            "src_vocab_size": src_vocab_size, "tgt_vocab_size": tgt_vocab_size, "pad_id": pad_id, "arch": arch,
            "d_model": d_model, "n_heads": n_heads, "n_encoder_layers": n_encoder_layers,
            "n_decoder_layers": n_decoder_layers, "d_ff": d_ff, "dropout": dropout, "max_len": max_len,
            "share_embeddings": share_embeddings, "lr": lr, "weight_decay": weight_decay,
            **{name: getattr(self, name).as_dict() for name in GROUP_NAMES},
        })
        self.model = build_translator(self.hparams)
        if self.speed.cpu_fastpath:
            enable_cpu_fastpath(self.model)
        # Set from a checkpoint by `on_load_checkpoint`; a trainer's data module takes precedence.
        self.src_vocab: SubwordVocab | None = None
        self.tgt_vocab: SubwordVocab | None = None
        self._outputs: list[tuple[int, str]] = []  # (dataset index, hypothesis) decoded on this rank
        self._signature_shown: set[str] = set()
        self._compiled = False

    def setup(self, stage: str) -> None:
        destroy_process_group_at_exit()  # each DDP rank, once its process group exists
        mode = self.speed.compile_mode
        if mode is not None and not self._compiled:  # here, not in __init__: a spawned DDP rank unpickles it eager
            compile_in_place([self.model.encoder, self.model.decoder], mode, self.speed.compile_backend)
            self._compiled = True

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)  # refuses a checkpoint that does not fit
        # `load_from_checkpoint` outside a trainer still knows how to detokenise.
        vocabs = vocabs_from_checkpoint(checkpoint)
        if vocabs is not None:
            self.src_vocab, self.tgt_vocab = vocabs

    def compute_loss(self, batch: Batch) -> Tensor:
        """Label-smoothed cross-entropy per non-padding target token of a batch, without R-Drop."""
        return translation_loss(self.model, self._bucketed(batch), self.hparams.pad_id, self.objective.label_smoothing)

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        o = self.objective
        loss = translation_loss(self.model, self._bucketed(batch), self.hparams.pad_id, o.label_smoothing,
                                o.rdrop_alpha)
        self.log("train_loss", loss, prog_bar=True, batch_size=self._tokens(batch))
        return loss

    def configure_optimizers(self) -> dict[str, Any]:
        hp, o = self.hparams, self.optimizer
        opt = torch.optim.AdamW(self.parameters(), lr=hp.lr, betas=tuple(o.betas), weight_decay=hp.weight_decay)
        if o.schedule == "inverse_sqrt":
            sched = InverseSqrtLR(opt, o.warmup_steps)
        else:
            sched = WarmupCosineLR.for_run(
                opt, o.warmup_steps, run_steps=self.trainer.estimated_stepping_batches, floor=o.lr_floor,
                clock_limited=stops_on_time(self.trainer.callbacks),
                advice=", or use model.optimizer.schedule: inverse_sqrt, which needs no run length",
            )
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def _bucketed(self, batch: Batch) -> Batch:
        """Under CUDA graphs (one graph per shape) the lengths padded to `core.nn.compile.BUCKET` steps; padding
        is masked in the source and after the targets, and the loss skips it."""
        if self.speed.compile_mode != "reduce-overhead":
            return batch
        pad, src_len, tgt_len = self.hparams.pad_id, self.model.max_src_len, self.model.max_tgt_len
        tgt_in, tgt_out = (pad_to_bucket(t, tgt_len, pad) for t in (batch.tgt_in, batch.tgt_out))
        return replace(batch, src=pad_to_bucket(batch.src, src_len, pad), tgt_in=tgt_in, tgt_out=tgt_out)

    def _tokens(self, batch: Batch) -> int:
        return int((batch.tgt_out != self.hparams.pad_id).sum())

    def on_validation_epoch_start(self) -> None:
        self._outputs = []

    on_test_epoch_start = on_validation_epoch_start

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def _evaluate(self, batch: Batch, split: Split) -> None:
        self.log(f"{split}_loss", self.compute_loss(batch), batch_size=self._tokens(batch), sync_dist=True)
        self._outputs += self._translate(batch, split, skip_blank=False)

    def search_options(self, split: Split) -> SearchOptions:
        """How `validate` (`evaluation.val_beam_size`), and `test` and `predict` (`test_beam_size`), decode."""
        e = self.evaluation
        return SearchOptions(beam_size=e.val_beam_size if split == "val" else e.test_beam_size, alpha=e.alpha)

    def _translate(self, batch: Batch, split: Split, skip_blank: bool) -> list[tuple[int, str]]:
        """(dataset index, best translation) per row; with `skip_blank` a blank source gives "" without a search."""
        blank = (batch.src == self.hparams.pad_id).all(1) & skip_blank  # (B,)
        texts = [""] * len(blank)
        rows = (~blank).nonzero()[:, 0].tolist()
        if rows:
            # On CPU, bf16 autocast makes the search's per-step matmuls (a few rows each) several times slower
            # than fp32; the weights stay fp32 under bf16-mixed. Compiled stacks run eager here: each search step
            # is one position that updates a KV cache in place, which would recompile or miss the CUDA graphs.
            with (torch.autocast("cpu", enabled=False) if self.device.type == "cpu" else nullcontext(),
                  torch.compiler.set_stance("force_eager") if self._compiled else nullcontext()):
                hypotheses = search(self.model, batch.src[rows], self.search_options(split))
            vocab = self._target_vocab()
            for row, hyps in zip(rows, hypotheses, strict=True):
                texts[row] = vocab.decode(hyps[0].tokens)
        return list(zip(batch.index.tolist(), texts, strict=True))

    def predict_step(self, batch: Batch, batch_idx: int) -> list[tuple[int, str]]:
        """Decoded as `test` decodes, and a blank source as `python -m translate.infer` does ("")."""
        return self._translate(batch, "test", skip_blank=True)

    def on_validation_epoch_end(self) -> None:
        self._score("val")

    def on_test_epoch_end(self) -> None:
        self._score("test")

    def _score(self, split: Split) -> None:
        outputs = _gather(self._outputs)
        self._outputs = []
        if not outputs:  # e.g. limit_val_batches=0
            return
        by_index = dict(outputs)  # DDP may decode a sentence twice; both copies are identical
        indices = sorted(by_index)
        refs = self.trainer.datamodule.dataset(split).refs
        e = self.evaluation
        bleu, chrf, signature = corpus_scores([by_index[i] for i in indices], [refs[i] for i in indices],
                                              e.bleu_tokenize, e.bleu_lowercase)
        # Every rank scored the same merged corpus: `max` keeps the value exact and silences
        # Lightning's "use sync_dist in distributed setting" warning.
        self.log(f"{split}_bleu", bleu, prog_bar=True, sync_dist=True, reduce_fx="max")
        self.log(f"{split}_chrf", chrf, sync_dist=True, reduce_fx="max")
        if split not in self._signature_shown:
            self._signature_shown.add(split)
            rank_zero_info(f"{split} BLEU signature: {signature}")
            if self.logger is not None:  # beside the metrics it qualifies (CSVLogger: hparams.yaml)
                self.logger.log_hyperparams({f"{split}_bleu_signature": signature})
        if not self.trainer.sanity_checking:
            rank_zero_info(f"{split} epoch {self.current_epoch}: BLEU {bleu:.2f}, chrF {chrf:.2f} "
                           f"on {len(indices)} of {len(refs)} sentences (beam {self.search_options(split).beam_size})")

    def _target_vocab(self) -> SubwordVocab:
        # Read from the data module each time: it adopts a checkpoint's vocabulary after setup().
        vocab = getattr(getattr(self._trainer, "datamodule", None), "tgt_vocab", None) or self.tgt_vocab
        if vocab is None:
            raise ValueError("decoding needs the target vocabulary: evaluate with TranslationDataModule "
                             "or load the module from a Translate checkpoint")
        return vocab


def _gather(outputs: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Concatenate every rank's (index, hypothesis) pairs; identity without a process group."""
    if not process_group_running() or dist.get_world_size() == 1:
        return list(outputs)
    gathered: list[list[tuple[int, str]] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, outputs)
    return [pair for part in gathered for pair in (part or [])]
