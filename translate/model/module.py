"""Translate training logic: label-smoothed cross-entropy, AdamW + warmup-cosine, BLEU validation.

Validation and test decode their whole split (greedy or beam search) and score the
detokenised output with sacreBLEU (BLEU and chrF) against the raw reference lines.
Under DDP each rank decodes its own batches; at epoch end the (index, hypothesis) pairs of
all ranks are gathered with `all_gather_object`, duplicates (the batch sampler repeats a few
batches so ranks run equally many steps) are dropped by `Batch.index`, and every rank scores
the same merged corpus, so all ranks log the same `val_bleu` and the checkpoint callback
agrees everywhere.

Vocabularies live in one place in a checkpoint: Lightning stores `TranslationDataModule.state_dict()`
(the sentencepiece protos as bytes) under the key `"TranslationDataModule"` (`VOCAB_KEY`);
`vocabs_from_checkpoint` reads them back, so inference needs nothing but the checkpoint.

Legend: B batch, S source length, T target length, V target vocabulary.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace
from typing import Any, Literal

import lightning as L
import sacrebleu
import torch
import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor

from core.nn import InverseSqrtLR, WarmupCosineLR, linear_cross_entropy, rdrop_cross_entropy, stops_on_time
from core.nn.blocks import Activation
from core.nn.compile import CompileMode, check_backend, compile_in_place, compile_mode, pad_to_bucket
from core.nn.cpu_fastpath import enable_cpu_fastpath
from core.nn.recurrent import Cell, Scoring
from core.nn.stacks import Positions
from core.runtime.checkpoint import SafeLoadMixin
from core.runtime.distributed import destroy_process_group_at_exit, process_group_running
from translate.data.corpus import Batch, Split
from translate.data.vocab import PAD_ID, SubwordVocab, vocabs_from_checkpoint
from translate.model.networks import Arch, TranslatorNetwork, build_translator
from translate.model.transformer import MAX_LEN
from translate.search.decoding import search
from translate.search.options import SearchOptions


def translation_loss(
    model: TranslatorNetwork, batch: Batch, pad_id: int, smoothing: float, rdrop_alpha: float = 0.0,
) -> Tensor:
    """Mean label-smoothed cross-entropy per non-padding target token of a batch.

    The target distribution is (1 - eps) on the gold token plus eps / V on every token
    (PyTorch's definition). `core.linear_cross_entropy` computes it from the decoder states
    without a (tokens, V) logits tensor, in fp32 even under bf16 autocast.
    With `rdrop_alpha` > 0 (training only: it needs dropout) the batch runs twice in one forward
    pass and `core.rdrop_cross_entropy` adds R-Drop's symmetric KL between the two predictions.
    """
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
        d_model: model width.
        n_heads: attention heads; must divide d_model.
        n_kv_heads: key/value heads for grouped-query attention (default n_heads).
        n_encoder_layers: encoder blocks.
        n_decoder_layers: decoder blocks.
        d_ff: feed-forward width.
        dropout: dropout on embeddings and inside blocks.
        attn_dropout: dropout on attention weights.
        ff_dropout: dropout after the feed-forward activation (fairseq's `activation_dropout`,
            0 in its recipes); None uses `dropout`.
        max_len: longest source or target in subwords (linked from `data.max_len`).
        positions: position encoding (self-attention only).
        activation: feed-forward activation.
        norm_first: pre-LN (True, the default) or post-LN (False, the original Transformer).
        share_embeddings: one embedding for source, target and output (needs a joint vocabulary).
        label_smoothing: eps of the label-smoothed cross-entropy (0 = plain cross-entropy).
        lr: peak learning rate (AdamW).
        betas: AdamW betas.
        weight_decay: AdamW weight decay.
        warmup_steps: optimizer steps of linear warmup.
        lr_floor: final learning rate as a fraction of the peak (cosine decay over the whole run).
        schedule: "cosine" (warmup, then cosine decay to `lr_floor` at the run's last step) or
            "inverse_sqrt" (warmup, then lr * sqrt(warmup_steps / step), fairseq's `inverse_sqrt`; it
            needs no run length and ignores `lr_floor`).
        val_beam_size: beam width when validating (1 = greedy search, fastest).
        test_beam_size: beam width when testing.
        alpha: GNMT length-penalty exponent for beam search.
        bleu_tokenize: sacreBLEU tokenizer ("13a" is the WMT default; "intl", "char", "none").
        bleu_lowercase: score lowercased BLEU (chrF stays cased).
        rdrop_alpha: R-Drop weight (0 = off): each training batch runs through two dropout masks and
            the loss adds alpha / 4 times the symmetric KL of their predictions (the paper's alpha,
            5 in its IWSLT runs). A step costs about twice as much.
        cpu_fastpath: fp32 CPU linears in oneDNN and a cheaper dropout mask (`core.nn.cpu_fastpath`; off: plain
            `nn.Linear` / `nn.Dropout`). Off by default: it speeds training steps up a little and beam search
            not at all (docs/results.md, `benchmarks/cpu_fastpath.py`).
        compile: torch.compile the encoder and decoder stacks when a trainer sets the module up
            (`core.nn.compile`): null or false (default) runs eager; default, reduce-overhead (CUDA graphs;
            source and target lengths are then padded to a multiple of 16 so that a few graphs serve every
            batch), max-autotune or max-autotune-no-cudagraphs. Beam and greedy search stay eager: their steps
            are small and update a KV cache in place. The first steps are slower while it compiles; checkpoints
            are the same either way, and `load_from_checkpoint` outside a trainer stays eager.
        compile_backend: torch.compile backend; "eager" or "aot_eager" check the plumbing without inductor.
        arch: the network: "transformer" (the default) or "rnn", a bidirectional GRU/LSTM encoder and an
            attentional decoder with input feeding (`core.nn.recurrent`). The rnn reads `d_model` (embeddings,
            memory and output width), `n_encoder_layers`, `n_decoder_layers`, `dropout`, `share_embeddings`,
            `cell`, `attention` and `hidden_size`; the attention-stack settings are the transformer's alone.
        cell: the rnn's recurrent cell, "gru" or "lstm".
        attention: the rnn's attention scores: "additive" (Bahdanau), "general" or "dot" (Luong; "dot"
            needs hidden_size == d_model).
        hidden_size: the rnn's recurrent width (each encoder direction's, and the decoder's).
    """

    def __init__(
        self, src_vocab_size: int = 8, tgt_vocab_size: int = 8, *, pad_id: int = PAD_ID, d_model: int = 256,
        n_heads: int = 4, n_kv_heads: int | None = None, n_encoder_layers: int = 3, n_decoder_layers: int = 3,
        d_ff: int = 1024, dropout: float = 0.1, attn_dropout: float = 0.0, ff_dropout: float | None = None,
        max_len: int = MAX_LEN, positions: Positions = "sinusoidal", activation: Activation = "relu",
        norm_first: bool = True, share_embeddings: bool = True, label_smoothing: float = 0.1, lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.98), weight_decay: float = 1e-4, warmup_steps: int = 400,
        lr_floor: float = 0.01, val_beam_size: int = 1, test_beam_size: int = 5, alpha: float = 0.6,
        bleu_tokenize: Literal["13a", "intl", "char", "none"] = "13a", bleu_lowercase: bool = False,
        schedule: Literal["cosine", "inverse_sqrt"] = "cosine",
        rdrop_alpha: float = 0.0, cpu_fastpath: bool = False, compile: bool | CompileMode | None = None,
        compile_backend: str = "inductor", arch: Arch = "transformer", cell: Cell = "gru",
        attention: Scoring = "additive", hidden_size: int = 256,
    ):
        super().__init__()
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"`label_smoothing` ({label_smoothing}) must be in [0, 1)")
        if val_beam_size < 1 or test_beam_size < 1:
            raise ValueError(f"`val_beam_size` ({val_beam_size}) and `test_beam_size` ({test_beam_size}) must be >= 1")
        for name, p in (("dropout", dropout), ("attn_dropout", attn_dropout), ("ff_dropout", ff_dropout)):
            if p is not None and not 0.0 <= p <= 1.0:
                raise ValueError(f"`model.{name}` ({p}) must be a probability in [0, 1]")
        if rdrop_alpha < 0.0:
            raise ValueError(f"`model.rdrop_alpha` ({rdrop_alpha}) must be >= 0 (0 turns R-Drop off)")
        if schedule not in ("cosine", "inverse_sqrt"):
            raise ValueError(f"`model.schedule` ({schedule!r}) must be 'cosine' or 'inverse_sqrt'")
        if schedule == "inverse_sqrt" and warmup_steps < 1:
            raise ValueError(f"`model.warmup_steps` ({warmup_steps}) must be >= 1 with the inverse_sqrt schedule")
        compile_mode(compile)  # refuse a bad value before any training
        check_backend(compile_backend)
        self.save_hyperparameters()
        self.model = build_translator(
            src_vocab_size, tgt_vocab_size, arch=arch, pad_id=pad_id, d_model=d_model, n_heads=n_heads,
            n_kv_heads=n_kv_heads, n_encoder_layers=n_encoder_layers, n_decoder_layers=n_decoder_layers, d_ff=d_ff,
            dropout=dropout, attn_dropout=attn_dropout, ff_dropout=ff_dropout, max_len=max_len, positions=positions,
            activation=activation, norm_first=norm_first, share_embeddings=share_embeddings, cell=cell,
            attention=attention, hidden_size=hidden_size,
        )
        if cpu_fastpath:
            enable_cpu_fastpath(self.model)
        # Set from a checkpoint by `on_load_checkpoint`; a trainer's data module takes precedence.
        self.src_vocab: SubwordVocab | None = None
        self.tgt_vocab: SubwordVocab | None = None
        self._outputs: list[tuple[int, str]] = []  # (dataset index, hypothesis) decoded on this rank
        self._signature_shown: set[str] = set()
        self._compiled = False

    def setup(self, stage: str) -> None:
        destroy_process_group_at_exit()  # each DDP rank, once its process group exists
        mode = compile_mode(self.hparams.compile)
        if mode is not None and not self._compiled:  # here, not in __init__: a spawned DDP rank unpickles it eager
            compile_in_place([self.model.encoder, self.model.decoder], mode, self.hparams.compile_backend)
            self._compiled = True

    # ------------------------------------------------------------------ checkpoints
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)  # refuses a checkpoint that does not fit
        # `load_from_checkpoint` outside a trainer still knows how to detokenise.
        vocabs = vocabs_from_checkpoint(checkpoint)
        if vocabs is not None:
            self.src_vocab, self.tgt_vocab = vocabs

    # ------------------------------------------------------------------ training
    def compute_loss(self, batch: Batch) -> Tensor:
        """Label-smoothed cross-entropy per non-padding target token of a batch."""
        return translation_loss(self.model, self._bucketed(batch), self.hparams.pad_id, self.hparams.label_smoothing)

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        hp = self.hparams
        loss = translation_loss(self.model, self._bucketed(batch), hp.pad_id, hp.label_smoothing, hp.rdrop_alpha)
        self.log("train_loss", loss, prog_bar=True, batch_size=self._tokens(batch))
        return loss

    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        opt = torch.optim.AdamW(self.parameters(), lr=hp.lr, betas=tuple(hp.betas), weight_decay=hp.weight_decay)
        if hp.schedule == "inverse_sqrt":
            sched = InverseSqrtLR(opt, hp.warmup_steps)
        else:
            sched = WarmupCosineLR.for_run(
                opt, hp.warmup_steps, run_steps=self.trainer.estimated_stepping_batches, floor=hp.lr_floor,
                clock_limited=stops_on_time(self.trainer.callbacks),
                advice=", or use model.schedule: inverse_sqrt, which needs no run length",
            )
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def _bucketed(self, batch: Batch) -> Batch:
        """`batch` with its lengths padded to `core.nn.compile.BUCKET` steps under CUDA graphs (one graph per
        shape), else `batch` itself. Padding is masked in the source and after the targets, and the loss skips it.
        """
        if compile_mode(self.hparams.compile) != "reduce-overhead":
            return batch
        pad, src_len, tgt_len = self.hparams.pad_id, self.model.max_src_len, self.model.max_tgt_len
        tgt_in, tgt_out = (pad_to_bucket(t, tgt_len, pad) for t in (batch.tgt_in, batch.tgt_out))
        return replace(batch, src=pad_to_bucket(batch.src, src_len, pad), tgt_in=tgt_in, tgt_out=tgt_out)

    def _tokens(self, batch: Batch) -> int:
        return int((batch.tgt_out != self.hparams.pad_id).sum())

    # ------------------------------------------------------------------ evaluation
    def on_validation_epoch_start(self) -> None:
        self._outputs = []

    def on_test_epoch_start(self) -> None:
        self._outputs = []

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def _evaluate(self, batch: Batch, split: Split) -> None:
        self.log(f"{split}_loss", self.compute_loss(batch), batch_size=self._tokens(batch), sync_dist=True)
        self._outputs += self._translate(batch, split, skip_blank=False)

    def search_options(self, split: Split) -> SearchOptions:
        """How `validate` (`val_beam_size`), and `test` and `predict` (`test_beam_size`), decode."""
        hp = self.hparams
        return SearchOptions(beam_size=hp.val_beam_size if split == "val" else hp.test_beam_size, alpha=hp.alpha)

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
        """(dataset index, translation) per row, decoded as `test` decodes and a blank source as
        `python -m translate.infer` does (""); `translate.predict.TranslationWriter` writes them in input order."""
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
        hp = self.hparams
        bleu, chrf, signature = corpus_scores([by_index[i] for i in indices], [refs[i] for i in indices],
                                              hp.bleu_tokenize, hp.bleu_lowercase)
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
        vocab = getattr(getattr(self._trainer, "datamodule", None), "tgt_vocab", None)
        vocab = self.tgt_vocab if vocab is None else vocab
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
