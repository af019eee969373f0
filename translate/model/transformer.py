"""The encoder-decoder translator network on `core` (no training or search code here).

Legend: B batch, S source length, T target length, D model width, V target vocabulary."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from core.nn import Decoder, DecoderCache, Encoder, TokenEmbedding, padding_mask, tie_weights
from core.nn.blocks import Activation
from core.nn.stacks import Positions
from translate.data.vocab import PAD_ID

MAX_LEN = 128
"""Default longest source or target, in subwords (a target counts its BOS/EOS position): the model's
positions and the data's length filter (`TranslationDataModule.max_len`, linked into the model's by the CLI)."""


def token_embeddings(src_vocab_size: int, tgt_vocab_size: int, d_model: int, pad_id: int,
                     share: bool) -> tuple[TokenEmbedding, TokenEmbedding]:
    """(source, target) embeddings of both architectures; one shared table with `share`, which needs one
    joint vocabulary (the target table is also the tied output projection)."""
    if share and src_vocab_size != tgt_vocab_size:
        raise ValueError(f"`share_embeddings` needs a joint vocabulary, but sizes differ "
                         f"({src_vocab_size} vs {tgt_vocab_size}); set share_embeddings: false")
    tgt = TokenEmbedding(tgt_vocab_size, d_model, pad_id=pad_id)
    return (tgt if share else TokenEmbedding(src_vocab_size, d_model, pad_id=pad_id)), tgt


class EncoderDecoder(nn.Module):
    """What both networks share on their `encoder`, `decoder`, embeddings and tied `output`."""

    pad_id: int

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """(B, S) source ids, right-padded with `pad_id` -> memory (B, S, D) and the source mask (B, 1, 1, S)."""
        src_mask = padding_mask(src, self.pad_id)
        return self.encoder(self.src_embed(src), src_mask), src_mask

    def decode(self, tgt: Tensor, memory: Tensor, src_mask: Tensor, cache: Any = None) -> Tensor:
        """Next-token logits (B, T, V) of (B, T) decoder inputs (BOS first; with a cache, only the new steps). `memory`
        may be (B / G, S, D), one row shared by each G consecutive target rows (the beams of a sentence;
        `core.CrossAttention`'s shared memory rows), with `src_mask` as many rows."""
        return self.output(self.decoder(self.tgt_embed(tgt), memory, src_mask, cache=cache))

    def states(self, src: Tensor, tgt: Tensor) -> Tensor:
        """Teacher-forced decoder outputs (B, T, D), before the output projection `self.output`. Target padding needs no
        mask: it comes after every real token (causal attention and a recurrent decoder never read it for one), and the
        loss ignores it."""
        memory, src_mask = self.encode(src)
        return self.decoder(self.tgt_embed(tgt), memory, src_mask)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        return self.output(self.states(src, tgt))


class TransformerTranslator(EncoderDecoder):
    """Bidirectional encoder, causal decoder with cross-attention, tied embeddings. Args: the network's arguments of
    `translate.model.module.TranslationModule` and its `block` group (`translate.model.options.TransformerOptions`),
    with their names, meanings and defaults (a test keeps the defaults equal);
    `translate.model.networks.build_translator` hands them over."""

    def __init__(self, src_vocab_size: int, tgt_vocab_size: int, *, pad_id: int = PAD_ID, d_model: int = 256,
                 n_heads: int = 4, n_kv_heads: int | None = None, n_encoder_layers: int = 3, n_decoder_layers: int = 3,
                 d_ff: int = 1024, dropout: float = 0.1, attn_dropout: float = 0.0, ff_dropout: float | None = None,
                 max_len: int = MAX_LEN, positions: Positions = "sinusoidal", activation: Activation = "relu",
                 norm_first: bool = True, share_embeddings: bool = True):
        super().__init__()
        self.pad_id = pad_id
        self.src_embed, self.tgt_embed = token_embeddings(src_vocab_size, tgt_vocab_size, d_model, pad_id,
                                                          share_embeddings)
        common = dict(n_kv_heads=n_kv_heads, d_ff=d_ff, dropout=dropout, attn_dropout=attn_dropout,
                      ff_dropout=ff_dropout, max_len=max_len, positions=positions, activation=activation,
                      norm_first=norm_first)
        self.encoder = Encoder(d_model, n_heads, n_layers=n_encoder_layers, **common)
        self.decoder = Decoder(d_model, n_heads, n_layers=n_decoder_layers, **common)
        self.output = nn.Linear(d_model, tgt_vocab_size, bias=False)
        tie_weights(self.output, self.tgt_embed)

    @property
    def max_src_len(self) -> int:
        return self.encoder.max_len

    @property
    def max_tgt_len(self) -> int:
        """Longest decoder input (BOS included), in subwords."""
        return self.decoder.max_len

    def new_cache(self, capacity: int = 16) -> DecoderCache:
        """An empty cache for incremental decoding, first sized for `capacity` steps (it grows past them)."""
        return self.decoder.new_cache(capacity)
