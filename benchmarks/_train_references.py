"""Plain-PyTorch baselines for benchmarks/gpu_train.py, written the way people write them, and weight copies from ours.

- `TorchTranslator`: shared embedding x sqrt(D) + sinusoidal positions + input dropout, `torch.nn.Transformer`
  (pre-LN, ReLU, batch_first), tied output projection; the loss is `F.cross_entropy` on the logits with
  label smoothing, the same function as `translate.model.module.translation_loss`.
- `SASRecReference`: item embedding x sqrt(D) + learned positions + input dropout, `nn.TransformerEncoder`
  (pre-LN, GELU, causal mask + key padding mask, final LayerNorm), tied dot-product scores over the N items
  and `F.cross_entropy`, the same function as StreamRec's full softmax.

Both set `nn.MultiheadAttention`'s attention-weight dropout to 0 (ours: `attn_dropout` 0); `nn.Transformer*Layer`
passes its one `dropout` there too. The `copy_*` functions put our weights into a reference (our fused
projections are rows [q; k; v], the layout of `in_proj_weight`), so both compute one function: the benchmark
reports the loss difference at initialisation.

Legend: B batch, S source length, T target or history length, D model width, V vocabulary, N items.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from core.nn.blocks import DecoderLayer, EncoderLayer
from streamrec.model.network import StreamRecModel
from translate.model.transformer import Translator


def sinusoid_table(max_len: int, d_model: int) -> Tensor:
    """(max_len, D) sine/cosine positions, sines at even columns (core.nn.positions' layout)."""
    pos = torch.arange(max_len, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    table = torch.zeros(max_len, d_model)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)
    return table


def _no_attention_dropout(module: nn.Module) -> None:
    for m in module.modules():
        if isinstance(m, nn.MultiheadAttention):
            m.dropout = 0.0


class TorchTranslator(nn.Module):
    """`torch.nn.Transformer` with shared, scaled embeddings, sinusoidal positions and a tied output layer.

    Args:
        vocab_size: joint vocabulary V.
        d_model: model width D.
        n_heads: attention heads.
        n_layers: encoder and decoder layers (each).
        d_ff: feed-forward width.
        dropout: dropout on embeddings, sublayer outputs and the feed-forward hidden.
        max_len: longest source or target.
        pad_id: padding id.
    """

    def __init__(self, vocab_size: int, d_model: int, n_heads: int, n_layers: int, d_ff: int, dropout: float,
                 max_len: int, pad_id: int):
        super().__init__()
        self.pad_id, self.scale = pad_id, math.sqrt(d_model)
        self.embed = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        self.register_buffer("positions", sinusoid_table(max_len, d_model), persistent=False)
        self.drop = nn.Dropout(dropout)
        self.transformer = nn.Transformer(d_model, n_heads, n_layers, n_layers, d_ff, dropout, activation="relu",
                                          batch_first=True, norm_first=True)
        _no_attention_dropout(self.transformer)
        self.output = nn.Linear(d_model, vocab_size, bias=False)
        self.output.weight = self.embed.weight

    def _embed(self, ids: Tensor) -> Tensor:
        return self.drop(self.embed(ids) * self.scale + self.positions[: ids.shape[1]])  # (B, T, D)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """(B, S) source and (B, T) decoder input ids -> (B, T, V) teacher-forced logits."""
        t = tgt_in.shape[1]
        future = torch.ones(t, t, dtype=torch.bool, device=src.device).triu(1)  # True = may NOT attend
        pad = src == self.pad_id  # (B, S), True = padding
        h = self.transformer(self._embed(src), self._embed(tgt_in), tgt_mask=future, src_key_padding_mask=pad,
                             memory_key_padding_mask=pad, tgt_is_causal=True)
        return self.output(h)


def torch_translation_loss(model: nn.Module, src: Tensor, tgt_in: Tensor, tgt_out: Tensor, pad_id: int,
                           smoothing: float) -> Tensor:
    """Mean label-smoothed cross-entropy per non-padding target token, on materialised (B*T, V) logits."""
    logits = model(src, tgt_in)  # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1).float(), tgt_out.flatten(), ignore_index=pad_id,
                           label_smoothing=smoothing)


class SASRecReference(nn.Module):
    """SASRec in plain PyTorch: embeddings, learned positions, a causal pre-LN `nn.TransformerEncoder`.

    Args:
        num_items: catalogue size N (ids 1..N, 0 = padding).
        d_model: model width D.
        n_heads: attention heads.
        n_layers: transformer blocks.
        d_ff: feed-forward width.
        dropout: dropout on embeddings, sublayer outputs and the feed-forward hidden.
        max_len: history length.
    """

    def __init__(self, num_items: int, d_model: int, n_heads: int, n_layers: int, d_ff: int, dropout: float,
                 max_len: int):
        super().__init__()
        self.scale = math.sqrt(d_model)
        self.items = nn.Embedding(num_items + 1, d_model, padding_idx=0)
        self.positions = nn.Embedding(max_len, d_model)
        self.drop = nn.Dropout(dropout)
        layer = nn.TransformerEncoderLayer(d_model, n_heads, d_ff, dropout, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, n_layers, norm=nn.LayerNorm(d_model), enable_nested_tensor=False)
        _no_attention_dropout(self.encoder)

    def forward(self, items: Tensor) -> Tensor:
        """(B, T) item ids -> (B, T, D) hidden states; position t sees items up to t."""
        t = items.shape[1]
        pos = torch.arange(t, device=items.device)
        x = self.drop(self.items(items) * self.scale + self.positions(pos))
        future = torch.ones(t, t, dtype=torch.bool, device=items.device).triu(1)  # True = may NOT attend
        return self.encoder(x, mask=future, src_key_padding_mask=items == 0, is_causal=True)


def sasrec_loss(model: SASRecReference, items: Tensor, targets: Tensor) -> Tensor:
    """Full-softmax cross-entropy over the N items at every non-padding position (tied item vectors)."""
    hidden = model(items)  # (B, T, D)
    keep = targets != 0
    logits = hidden[keep] @ model.items.weight[1:].T  # (M, N)
    return F.cross_entropy(logits.float(), targets[keep] - 1)


# ----------------------------------------------------------------------------- weight copies


def _copy(dst: nn.Module, src: nn.Module) -> None:
    dst.weight.copy_(src.weight)
    if getattr(dst, "bias", None) is not None:
        dst.bias.copy_(src.bias)


def _copy_attention(dst: nn.MultiheadAttention, weight: Tensor, bias: Tensor, out: nn.Linear) -> None:
    dst.in_proj_weight.copy_(weight)  # (3D, D), rows [q; k; v] in both
    dst.in_proj_bias.copy_(bias)
    _copy(dst.out_proj, out)


def _copy_encoder_layer(dst: nn.TransformerEncoderLayer, src: EncoderLayer) -> None:
    _copy_attention(dst.self_attn, src.self_attn.qkv.weight, src.self_attn.qkv.bias, src.self_attn.out)
    _copy(dst.linear1, src.ff.up)
    _copy(dst.linear2, src.ff.down)
    _copy(dst.norm1, src.attn_block.norm)
    _copy(dst.norm2, src.ff_block.norm)


def _copy_decoder_layer(dst: nn.TransformerDecoderLayer, src: DecoderLayer) -> None:
    _copy_attention(dst.self_attn, src.self_attn.qkv.weight, src.self_attn.qkv.bias, src.self_attn.out)
    cross = src.cross_attn
    _copy_attention(dst.multihead_attn, torch.cat([cross.q.weight, cross.kv.weight]),
                    torch.cat([cross.q.bias, cross.kv.bias]), cross.out)
    _copy(dst.linear1, src.ff.up)
    _copy(dst.linear2, src.ff.down)
    _copy(dst.norm1, src.self_block.norm)
    _copy(dst.norm2, src.cross_block.norm)
    _copy(dst.norm3, src.ff_block.norm)


@torch.no_grad()
def copy_translator_weights(ours: Translator, ref: TorchTranslator) -> None:
    """Put our translator's weights into `ref` (pre-LN, shared embeddings, sinusoidal positions)."""
    ref.embed.weight.copy_(ours.tgt_embed.weight)  # the output layer is tied to it in both
    for dst, src in zip(ref.transformer.encoder.layers, ours.encoder.layers, strict=True):
        _copy_encoder_layer(dst, src)
    for dst, src in zip(ref.transformer.decoder.layers, ours.decoder.layers, strict=True):
        _copy_decoder_layer(dst, src)
    _copy(ref.transformer.encoder.norm, ours.encoder.norm)
    _copy(ref.transformer.decoder.norm, ours.decoder.norm)


@torch.no_grad()
def copy_sasrec_weights(ours: StreamRecModel, ref: SASRecReference) -> None:
    """Put our StreamRec network's weights into `ref` (tied item vectors, learned positions)."""
    ref.items.weight.copy_(ours.item_embedding.weight)
    ref.positions.weight.copy_(ours.encoder.additive.embedding.weight)
    for dst, src in zip(ref.encoder.layers, ours.encoder.layers, strict=True):
        _copy_encoder_layer(dst, src)
    _copy(ref.encoder.norm, ours.encoder.norm)
