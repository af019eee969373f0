"""The causal session model: a SASRec-style decoder-only transformer on `core`.

Each history position predicts the next item. Scores are dot products between the hidden
state and every item's vector: the item embedding itself (tied, default) or a separate
output table.

Legend: B batch (users), T history length, D model width, N items (ids 1..N, 0 = padding),
M selected positions.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from core.nn import Encoder, TokenEmbedding, causal_padding_mask, padding_mask
from core.nn.blocks import Activation
from core.nn.compile import bucket_length
from core.nn.mixing import LowPassMix
from core.nn.stacks import Positions
from streamrec.data.constants import MAX_LEN, PAD_ID


def trim_padding(items: Tensor, multiple: int = 1) -> tuple[Tensor, int]:
    """Drop the leading columns that are padding in every row: (B, T) -> (B, T') and T - T'.

    Padding is never attended and the kept items keep their positions (the encoder is given
    the offset), so outputs are unchanged while a batch of short histories costs what its
    longest row costs: Amazon Beauty's histories average 9 items at max_len 50.

    Under `torch.export`, ONNX export or tracing every column is kept (offset 0): the cut depends on the
    data, which a graph with a dynamic length cannot hold. Padding is masked either way, so the outputs at
    the non-padding positions are the same (to float rounding).

    `multiple` > 1 keeps a few padding columns more, so that T' is a multiple of it (or T): CUDA graphs
    (`core.nn.compile`, mode "reduce-overhead") are recorded per length and then replayed for every batch
    of that length.
    """
    if exporting():
        return items, 0
    occupied = (items != PAD_ID).any(0).to(torch.uint8)
    start = int(occupied.argmax())  # the first occupied column (argmax returns the first maximum); 0 if none
    if multiple > 1:
        start = items.shape[1] - bucket_length(items.shape[1] - start, items.shape[1], multiple)
    return items[:, start:], start


def exporting() -> bool:
    """Whether a graph is being captured for export (torch.export, the ONNX exporters, jit tracing)."""
    return torch.compiler.is_exporting() or torch.onnx.is_in_onnx_export() or torch.jit.is_tracing()


class StreamRecModel(nn.Module):
    """Item embedding x sqrt(d_model), positions, pre-LN causal blocks, final LayerNorm, dot-product scores.

    Args: the network's arguments of `streamrec.model.module.StreamRecModule`, with its names, meanings and
    defaults (a test keeps the defaults equal).
    """

    # Lengths a trimmed batch is rounded up to (`trim_padding`'s `multiple`); 1: the longest row's. Not an
    # argument: only CUDA graphs want it, and `StreamRecModule` sets it when it compiles in that mode.
    length_multiple: int = 1

    def __init__(
        self, num_items: int, *, d_model: int = 64, n_heads: int = 2, n_kv_heads: int | None = None,
        n_layers: int = 2, d_ff: int = 256, dropout: float = 0.2, attn_dropout: float = 0.0, max_len: int = MAX_LEN,
        positions: Positions = "learned", activation: Activation = "gelu", tied: bool = True,
        item_init_std: float | None = None, lowpass_alpha: float = 0.0, lowpass_window: int = 16,
    ):
        super().__init__()
        if num_items < 1:
            raise ValueError(f"`num_items` must be >= 1, got {num_items}")
        self.num_items = num_items
        self.item_embedding = TokenEmbedding(num_items + 1, d_model, pad_id=PAD_ID, init_std=item_init_std)
        self.encoder = Encoder(
            d_model, n_heads, n_kv_heads=n_kv_heads, n_layers=n_layers, d_ff=d_ff, dropout=dropout,
            attn_dropout=attn_dropout, max_len=max_len, positions=positions, activation=activation, norm_first=True,
            causal=True, mix=LowPassMix(lowpass_alpha, lowpass_window) if lowpass_alpha > 0 else None,
        )
        self.output: nn.Embedding | None = None
        if not tied:
            self.output = nn.Embedding(num_items + 1, d_model, padding_idx=PAD_ID)
            nn.init.normal_(self.output.weight, std=d_model**-0.5 if item_init_std is None else item_init_std)

    @property
    def item_vectors(self) -> Tensor:
        """(N+1, D) vectors that hidden states are scored against; row 0 is padding."""
        return self.item_embedding.weight if self.output is None else self.output.weight

    def encode(self, items: Tensor, trim: bool = False) -> Tensor:
        """Hidden state after each history position.

        Args:
            items: (B, T) item ids, left-padded with 0.
            trim: skip the leading columns that are padding in every row (see `trim_padding`); the
                result then covers only the last T' <= T positions, with the same values there.

        Returns:
            (B, T, D), or (B, T', D) with `trim`; position t summarises items up to and including t.
        """
        offset = 0
        if trim:
            items, offset = trim_padding(items, self.length_multiple)
        valid = padding_mask(items, PAD_ID)
        mask = causal_padding_mask(valid)  # (B, 1, T, T)
        return self.encoder(self.item_embedding(items), mask, offset=offset, valid=self._valid(valid))

    def score(self, hidden: Tensor) -> Tensor:
        """(..., D) hidden states -> (..., N+1) scores of every item; column 0 (padding) is -inf, never ranked."""
        scores = hidden @ self.item_vectors.T.to(hidden.dtype)
        scores[..., PAD_ID] = float("-inf")
        return scores

    def last_hidden(self, items: Tensor) -> Tensor:
        """(B, T) left-padded histories -> (B, D), the state that recommends the next item."""
        items, offset = trim_padding(items, self.length_multiple)
        valid = padding_mask(items, PAD_ID)
        mask = causal_padding_mask(valid)
        return self.encoder(self.item_embedding(items), mask, last=1, offset=offset, valid=self._valid(valid))[:, -1]

    def _valid(self, valid: Tensor) -> Tensor | None:
        """(B, T) token positions for the low-pass mix, or None without one (nothing to compute)."""
        return valid.reshape(valid.shape[0], -1) if self.encoder.layers[0].mix is not None else None

    @torch.no_grad()
    def recommend_scores(self, items: Tensor) -> Tensor:
        """(B, T) left-padded histories -> (B, N+1) next-item scores (padding -inf)."""
        return self.score(self.last_hidden(items))
