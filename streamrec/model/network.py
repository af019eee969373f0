"""The session networks: one item table and scoring, and four sequence encoders on `core` (`SASRec`, `BERT4Rec`,
`GRU4Rec`, `TVRec`), one class each. The variants differ only in injected parts (the encoder, the training inputs, the
attention masks, what each cannot honour: `refuse`); the item table, features and scoring are the base class's. A new
network is one subclass and one line of `NETWORKS`; nothing else names an architecture.

With categorical item features (`num_features` > 0, as RecTools' SASRec offers them), an item's vector is its
id embedding plus the mean of its features' embeddings, inputs and tied scores alike; a cold item (never in the
training histories) has an untrained id row, so its vector is its features' alone. With `items.features: attention`
(DIF-SR) the features' mean is a side stream instead (`core.nn.SideStream`): it adds attention logits in every layer,
and item vectors are the id embeddings alone; with `items.features: stream` (FDSA) it runs through an encoder of its
own, fused with the ids' states by a linear layer before the scores.

Legend: B batch (users), T history length, D model width, N items (ids 1..N, 0 = padding), F feature slots per item."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

import torch
from torch import Tensor, nn

from core.nn import Encoder, SideStream, TokenEmbedding, causal_padding_mask, padding_mask
from core.nn.blocks import GatedResidual, Residual
from core.nn.compile import bucket_length
from core.nn.recurrent import CausalRecurrentEncoder
from core.nn.time_variant import TimeVariantEncoder
from streamrec.data.constants import MAX_LEN, PAD_ID
from streamrec.model.hparams import upgrade_hparams
from streamrec.model.options import (
    BlockOptions,
    ContrastiveOptions,
    ItemOptions,
    MixingOptions,
    ObjectiveOptions,
    OptimizerOptions,
)

Arch = Literal["sasrec", "bert4rec", "gru", "tvrec"]


def trim_padding(items: Tensor, multiple: int = 1) -> tuple[Tensor, int]:
    """Drop the leading columns that are padding in every row: (B, T) -> (B, T') and T - T'. Padding is never attended
    and the kept items keep their positions (the encoder gets the offset), so outputs are unchanged while a batch costs
    what its longest row costs. Under export or tracing every column is kept: a graph with a dynamic length cannot hold
    a data-dependent cut. `multiple` > 1 rounds T' up to a multiple of it (or T): CUDA graphs (`core.nn.compile`,
    "reduce-overhead") are recorded per length."""
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
    """Item embedding x sqrt(d_model), the subclass's sequence encoder, dot-product scores against the item
    vectors; the arguments are `StreamRecModule`'s network ones (a test keeps the defaults equal)."""

    arch: str = ""  # the `model.arch` name of the subclass, set by `NETWORKS`
    causal: bool = True  # position t summarises items up to t only (the contrastive term needs it)
    has_attention: bool = True  # explanations can read attention weights
    extra_rows: int = 0  # input-table rows past the items that are never scored (bert4rec's mask token)

    # Lengths a trimmed batch is rounded up to (`trim_padding`'s `multiple`); 1: the longest row's. Not an
    # argument: only CUDA graphs want it, and `StreamRecModule` sets it when it compiles in that mode.
    length_multiple: int = 1

    def __init__(self, num_items: int, *, d_model: int = 64, n_heads: int = 2, n_layers: int = 2, d_ff: int = 256,
                 dropout: float = 0.2, max_len: int = MAX_LEN, num_features: int = 0, features_per_item: int = 0,
                 block: BlockOptions | Mapping[str, Any] | None = None,
                 mixing: MixingOptions | Mapping[str, Any] | None = None,
                 items: ItemOptions | Mapping[str, Any] | None = None):
        super().__init__()
        block, mixing = BlockOptions.of(block, "model.block"), MixingOptions.of(mixing, "model.mixing")
        items = ItemOptions.of(items, "model.items")
        if num_items < 1:
            raise ValueError(f"`num_items` must be >= 1, got {num_items}")
        if num_features < 0 or features_per_item < 0 or (num_features > 0) != (features_per_item > 0):
            raise ValueError(f"`num_features` ({num_features}) and `features_per_item` ({features_per_item}) must "
                             "both be 0 (no item features) or both positive; link them from the data module")
        if items.id_dropout and not num_features:
            raise ValueError("`model.items.id_dropout` needs item features (`data.item_features`): without them an "
                             "item whose id vector is dropped has no vector at all")
        if num_features and not items.tied:
            raise ValueError("item features need `model.items.tied: true`: a separate output table has no features, "
                             "so it could not score cold items")
        self.refuse(block, mixing, num_features, items)
        if items.features == "attention" and (not num_features or mixing.attention != "full"):
            raise ValueError("`model.items.features: attention` needs item features (`data.item_features`) and "
                             "`model.mixing.attention: full` (its logits join the softmax's)")
        if items.features == "stream" and not num_features:
            raise ValueError("`model.items.features: stream` needs item features (`data.item_features`)")
        self.block, self.mixing, self.items = block, mixing, items
        self.adds_features = bool(num_features) and items.features == "add"
        width = items.feature_width or d_model
        self.side = SideStream(width) if num_features and items.features == "attention" else None
        self.id_dropout, self.history_dropout = items.id_dropout, items.history_dropout
        self.num_items = num_items
        self.max_len = max_len  # the history length inputs are padded or cut to, whatever the encoder
        self.mask_id = num_items + 1  # bert4rec's mask token: a row of the input table only, never scored
        init_std = items.init_std
        self.item_embedding = TokenEmbedding(num_items + 1 + self.extra_rows, d_model, pad_id=PAD_ID, init_std=init_std)
        self.encoder = self.build_encoder(d_model, n_heads, n_layers, d_ff, dropout, max_len, block, mixing)
        # FDSA's feature stream: an encoder of its own over the features' means, fused with the ids' before scoring.
        streams = bool(num_features) and items.features == "stream"
        self.feature_encoder = self.build_encoder(d_model, n_heads, n_layers, d_ff, dropout, max_len, block,
                                                  mixing) if streams else None
        self.fuse = nn.Linear(2 * d_model, d_model) if streams else None
        # BERT's masked-LM head (BERT4Rec's, RecBole's): the states are transformed once more before scoring.
        self.head = nn.Sequential(nn.Linear(d_model, d_model), nn.GELU(), nn.LayerNorm(d_model)) if block.output_head \
            else None
        self.output: nn.Embedding | None = None
        if not items.tied:
            self.output = nn.Embedding(num_items + 1, d_model, padding_idx=PAD_ID)
            nn.init.normal_(self.output.weight, std=d_model**-0.5 if init_std is None else init_std)
        self.feature_embedding: nn.EmbeddingBag | None = None
        if num_features:
            # A mean over each item's features; padding slots are left out (an item without any gets zeros).
            self.feature_embedding = nn.EmbeddingBag(num_features + 1, width, mode="mean", padding_idx=PAD_ID)
            nn.init.normal_(self.feature_embedding.weight, std=width**-0.5 if init_std is None else init_std)
            self.feature_embedding.weight.data[PAD_ID].zero_()
            # Filled by `set_item_features` from the data; persistent, so checkpoints and exports carry them.
            self.register_buffer("item_features", torch.zeros(num_items + 1, features_per_item, dtype=torch.long))
            self.register_buffer("cold_items", torch.zeros(num_items + 1, dtype=torch.bool))

    upgrade_hparams = staticmethod(upgrade_hparams)  # for the loaders in `core.runtime`

    @classmethod
    def from_hparams(cls, hparams: Mapping[str, Any]) -> StreamRecModel:
        return build_network(hparams)

    @classmethod
    def refuse(cls, block: BlockOptions, mixing: MixingOptions, num_features: int, items: ItemOptions) -> None:
        """Raise ValueError, naming the key to change, for a setting this network cannot honour."""

    @classmethod
    def refuse_training(cls, objective: ObjectiveOptions, contrastive: ContrastiveOptions,
                        optimizer: OptimizerOptions) -> None:
        """Raise ValueError for a training setting this network cannot honour (the module asks)."""
        if contrastive.weight and not cls.causal:
            raise ValueError(f"`model.contrastive.weight` needs a causal network (sasrec, gru), not {cls.arch}; "
                             "`--model.contrastive.weight 0` trains without it")

    def build_encoder(self, d_model: int, n_heads: int, n_layers: int, d_ff: int, dropout: float, max_len: int,
                      block: BlockOptions, mixing: MixingOptions) -> nn.Module:
        """The sequence encoder: pre-LN transformer blocks with a final LayerNorm (causal when `causal`)."""
        return Encoder(d_model, n_heads, n_kv_heads=block.n_kv_heads, n_layers=n_layers, d_ff=d_ff, dropout=dropout,
                       attn_dropout=block.attn_dropout, max_len=max_len, positions=block.positions,
                       activation=block.activation, norm_first=True, causal=self.causal, mix=mixing.lowpass(max_len),
                       kernel=mixing.kernel(), residual=GatedResidual if block.residual == "gated" else Residual,
                       side=self.side)

    def training_inputs(self, inputs: Tensor, targets: Tensor, last_only: bool,
                        mask_prob: float) -> tuple[Tensor, Tensor, int | None]:
        """A training batch's (B, T) inputs and targets as this network trains on them, and how many last positions
        to train (None: all). Causal networks predict the next item at each position (prefix windows: the last)."""
        return inputs, targets, 1 if last_only else None

    def scoring_inputs(self, items: Tensor) -> Tensor:
        """(B, T) histories -> the (B, T) encoder inputs whose last position recommends: the histories themselves."""
        return items

    def history_positions(self, weights: Tensor) -> Tensor:
        """(B, T) weights over `scoring_inputs` positions -> the same over the history's positions."""
        return weights

    def _masks(self, items: Tensor, keys: Tensor) -> tuple[Tensor | None, Tensor | None]:
        """The attention mask for (B, T) items with (B, 1, 1, T) padding `keys` (None with a long-history kernel,
        which must not hold T x T), and the (B, T) valid positions the low-pass mix and those kernels read."""
        full = self.encoder.kernel is None
        wants_valid = not full or self.encoder.layers[0].mix is not None
        mask = (causal_padding_mask(keys) if self.causal else keys) if full else None
        return mask, (keys.reshape(items.shape) if wants_valid else None)

    def _run(self, items: Tensor, offset: int, last: int | None = None) -> Tensor:
        """The encoder on (B, T) items whose first column is history position `offset` -> (B, T or last, D)."""
        mask, valid = self._masks(items, padding_mask(items, PAD_ID))  # keys (B, 1, 1, T)
        hidden = self.encoder(self._embed(items), mask, last=last, offset=offset, valid=valid, side=self._side(items))
        if self.feature_encoder is not None:
            features = self.feature_encoder(self._feature_means(items, math.sqrt(hidden.shape[-1])), mask, last=last,
                                            offset=offset, valid=valid)
            hidden = self.fuse(torch.cat([hidden, features], dim=-1))
        return hidden if self.head is None else self.head(hidden)

    def _side(self, items: Tensor) -> Tensor | None:
        """`features: attention`'s side stream: (B, T) ids -> (B, T, W) their features' means, scaled as the item
        inputs are (unit variance at the start); None without it. Every layer reads it as it is, and `history_dropout`
        leaves it whole: a blanked item's attributes still steer attention, its id is what is hidden."""
        return None if self.side is None else self._feature_means(items, math.sqrt(self.side.width))

    def _feature_means(self, items: Tensor, scale: float) -> Tensor:
        """(B, T) ids -> (B, T, W) the means of their features' embeddings, times `scale`."""
        bags = self.feature_embedding(self.item_features[items].reshape(-1, self.item_features.shape[1]))
        return bags.view(*items.shape, -1) * scale

    def set_item_features(self, features: Tensor, cold: Tensor) -> None:
        """Take the data's (N+1, F) feature ids and (N+1,) bool cold items (never in the training histories)."""
        if self.feature_embedding is None:
            raise ValueError("this model was built without item features (`num_features` 0); link `num_features` "
                             "and `features_per_item` from the data module")
        if features.shape != self.item_features.shape or cold.shape != self.cold_items.shape:
            raise ValueError(f"item features {tuple(features.shape)} and cold items {tuple(cold.shape)} do not fit "
                             f"the model's {tuple(self.item_features.shape)}; use the data the model was built for")
        if int(features.max()) > self.feature_embedding.num_embeddings - 1:
            raise ValueError(f"feature id {int(features.max())} is over `num_features` "
                             f"({self.feature_embedding.num_embeddings - 1}); use the data the model was built for")
        self.item_features.copy_(features)
        self.cold_items.copy_(cold)
        self.cold_items[PAD_ID] = False

    @torch.no_grad()
    def start_items_from(self, vectors: Tensor) -> int:
        """Start the id rows of the items `vectors` (N+1, E) gives (NaN rows: items it lacks) at the vectors'
        principal components: centred, projected on their top min(D, E) directions, then scaled to the table's own
        spread, so the scores start at the scale a random start has; the rest of the row, and the rows of items the
        vectors lack, keep their random start. The tied output table moves with it; an untied one keeps its own.
        Returns the number of rows started."""
        if vectors.shape[0] != self.num_items + 1:
            raise ValueError(f"item vectors for {vectors.shape[0] - 1} items do not fit the model's {self.num_items}; "
                             "use the data the model was built for")
        weight = self.item_embedding.weight
        known = ~vectors.isnan().any(dim=1)
        known[PAD_ID] = False
        rows = known.nonzero().squeeze(1)
        if len(rows) < 2:
            return 0
        centred = vectors[rows].double()
        centred -= centred.mean(dim=0)
        k = min(weight.shape[1], centred.shape[1], len(rows))
        _, _, vh = torch.linalg.svd(centred, full_matrices=False)
        projected = centred @ vh[:k].T
        spread = weight[1:self.num_items + 1].double().std()
        projected *= spread / projected.std().clamp_min(torch.finfo(torch.float64).tiny)
        weight[rows.to(weight.device), :k] = projected.to(weight)
        return len(rows)

    def item_rows(self, ids: Tensor) -> Tensor:
        """(...) item ids -> (..., D) their vectors (unscaled): the id embedding, plus the features' mean when added."""
        vectors = self.item_embedding.weight[ids]
        if not self.adds_features:
            return vectors
        drop = self.cold_items[ids]  # an untrained id row adds noise
        if self.training and self.id_dropout:  # DropoutNet: learn to score an item by its features alone
            drop = drop | (torch.rand(ids.shape, device=ids.device) < self.id_dropout)
        vectors = vectors.masked_fill(drop.unsqueeze(-1), 0.0)
        bags = self.feature_embedding(self.item_features[ids].reshape(-1, self.item_features.shape[1]))  # (*, D)
        return vectors + bags.view(vectors.shape)

    def _embed(self, items: Tensor) -> Tensor:
        """(B, T) ids -> (B, T, D) encoder inputs, scaled by sqrt(D) as `TokenEmbedding` scales them; in training,
        `history_dropout` blanks whole history items (their position stays), so that no single item is relied on."""
        vectors = (self.item_rows(items) * self.item_embedding.scale if self.adds_features
                   else self.item_embedding(items))
        if self.training and self.history_dropout:
            real = (items != PAD_ID) & (items != self.mask_id)  # bert4rec's mask tokens are what it must fill
            blank = (torch.rand(items.shape, device=items.device) < self.history_dropout) & real
            vectors = vectors.masked_fill(blank.unsqueeze(-1), 0.0)
        return vectors

    @property
    def device(self) -> torch.device:
        """Where the weights live, without building `item_vectors` (a whole table when items have features)."""
        return self.item_embedding.weight.device

    @property
    def item_vectors(self) -> Tensor:
        """(N+1, D) vectors that hidden states are scored against; row 0 is padding. With added item features, computed
        at each use: hold the result while scoring many batches, and never write to it."""
        if self.adds_features:
            return self.item_rows(torch.arange(self.num_items + 1, device=self.item_features.device))
        if self.output is not None:
            return self.output.weight
        weight = self.item_embedding.weight  # whole, not sliced: a sparse gradient (rowwise_adagrad) has no views
        return weight[: self.num_items + 1] if self.extra_rows else weight

    def encode(self, items: Tensor, trim: bool = False, last: int | None = None) -> Tensor:
        """(B, T) left-padded ids -> (B, T, D) hidden states; `trim` skips all-padding leading columns (B, T', D);
        `last`: only the last `last` positions (the final layer computes only those)."""
        items, offset = trim_padding(items, self.length_multiple) if trim else (items, 0)
        return self._run(items, offset, last)

    def score(self, hidden: Tensor) -> Tensor:
        """(..., D) hidden states -> (..., N+1) scores of every item; column 0 (padding) is -inf, never ranked."""
        scores = hidden @ self.item_vectors.T.to(hidden.dtype)
        scores[..., PAD_ID] = float("-inf")
        return scores

    def last_hidden(self, items: Tensor) -> Tensor:
        """(B, T) left-padded histories -> (B, D), the state that recommends the next item."""
        items, offset = trim_padding(self.scoring_inputs(items), self.length_multiple)
        return self._run(items, offset, last=1)[:, -1]

    @torch.no_grad()
    def recommend_scores(self, items: Tensor) -> Tensor:
        """(B, T) left-padded histories -> (B, N+1) next-item scores (padding -inf)."""
        return self.score(self.last_hidden(items))


class SASRec(StreamRecModel):
    """A causal transformer (Kang & McAuley, 2018): every history position predicts the next item."""


class BERT4Rec(StreamRecModel):
    """A bidirectional transformer trained to fill masked items (Sun et al., 2019), recommending from a mask token
    placed after the history."""

    causal = False
    extra_rows = 1

    @classmethod
    def refuse(cls, block: BlockOptions, mixing: MixingOptions, num_features: int, items: ItemOptions) -> None:
        _refuse_sasrec_options(cls.arch, mixing, items)
        if num_features:
            raise ValueError("item features are not offered with arch bert4rec (its mask token has no features); "
                             "use arch sasrec or gru")

    @classmethod
    def refuse_training(cls, objective: ObjectiveOptions, contrastive: ContrastiveOptions,
                        optimizer: OptimizerOptions) -> None:
        super().refuse_training(objective, contrastive, optimizer)
        if optimizer.sparse:
            raise ValueError("`model.optimizer.item_optimizer: rowwise_adagrad` does not work with arch bert4rec (its "
                             "item table holds the mask token, which is never scored); use `item_optimizer: adamw`")

    def training_inputs(self, inputs: Tensor, targets: Tensor, last_only: bool,
                        mask_prob: float) -> tuple[Tensor, Tensor, int | None]:
        """The cloze task on each sequence's last T items (targets' last column ends a row), at every position."""
        items = torch.cat([inputs, targets[:, -1:]], dim=1)[:, 1:]  # (B, T)
        return *self.mask_items(items, mask_prob), None

    def scoring_inputs(self, items: Tensor) -> Tensor:
        """(B, T) histories -> their last T - 1 items and the mask token (the position it learned to fill)."""
        return torch.cat([items[:, 1:], items.new_full((items.shape[0], 1), self.mask_id)], dim=1)

    def history_positions(self, weights: Tensor) -> Tensor:
        """The inputs were the last T - 1 items and the mask: shift back to the history's positions."""
        return torch.cat([torch.zeros_like(weights[:, :1]), weights[:, :-1]], dim=1)

    def mask_items(self, items: Tensor, prob: float, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """BERT4Rec's cloze task: each real item masked with probability `prob`, at least one per row (its last, the
        case scoring asks for). Returns (B, T) inputs and targets (the masked items, 0 elsewhere)."""
        real = items != PAD_ID
        chosen = (torch.rand(items.shape, device=items.device, generator=generator) < prob) & real
        chosen[:, -1] |= ~chosen.any(1) & real[:, -1]
        return items.masked_fill(chosen, self.mask_id), items.masked_fill(~chosen, PAD_ID)


class GRU4Rec(StreamRecModel):
    """GRU4Rec's recurrent network (Hidasi et al., 2016): `n_layers` GRU layers of width `d_model`, causal like
    sasrec; the attention settings do not apply, and explanations have no attention view."""

    has_attention = False

    @classmethod
    def refuse(cls, block: BlockOptions, mixing: MixingOptions, num_features: int, items: ItemOptions) -> None:
        _refuse_sasrec_options(cls.arch, mixing, items)
        if block.residual != "plain":
            raise ValueError("`model.block.residual: gated` gates the transformer blocks' residuals; arch gru has "
                             "none: set it to plain")

    def build_encoder(self, d_model: int, n_heads: int, n_layers: int, d_ff: int, dropout: float, max_len: int,
                      block: BlockOptions, mixing: MixingOptions) -> nn.Module:
        return CausalRecurrentEncoder(d_model, n_layers=n_layers, dropout=dropout)

    def _run(self, items: Tensor, offset: int, last: int | None = None) -> Tensor:
        hidden = self.encoder(self._embed(items), padding_mask(items, PAD_ID).reshape(items.shape))  # keys (B, T)
        hidden = hidden if last is None else hidden[:, -last:]
        return hidden if self.head is None else self.head(hidden)


class TVRec(StreamRecModel):
    """TV-Rec's network (Shin et al., NeurIPS 2025): time-variant convolutions (`core.nn.time_variant`, with
    `model.mixing.bases` basis filters) in place of self-attention, causal like sasrec; the filters know each position,
    so there is no positional embedding, and explanations have no attention view."""

    has_attention = False

    @classmethod
    def refuse(cls, block: BlockOptions, mixing: MixingOptions, num_features: int, items: ItemOptions) -> None:
        _refuse_sasrec_options(cls.arch, mixing, items)

    def build_encoder(self, d_model: int, n_heads: int, n_layers: int, d_ff: int, dropout: float, max_len: int,
                      block: BlockOptions, mixing: MixingOptions) -> nn.Module:
        return TimeVariantEncoder(d_model, n_layers=n_layers, d_ff=d_ff, max_len=max_len, n_bases=mixing.bases,
                                  dropout=dropout, activation=block.activation,
                                  residual=GatedResidual if block.residual == "gated" else Residual)

    def _run(self, items: Tensor, offset: int, last: int | None = None) -> Tensor:
        valid = padding_mask(items, PAD_ID).reshape(items.shape)  # (B, T)
        hidden = self.encoder(self._embed(items), valid, last=last, offset=offset)
        return hidden if self.head is None else self.head(hidden)


def _refuse_sasrec_options(arch: str, mixing: MixingOptions, items: ItemOptions) -> None:
    """The mixing and feature options only sasrec's transformer takes, refused for another network."""
    if mixing.lowpass_alpha > 0:
        raise ValueError(f"`model.mixing.lowpass_alpha` is a causal filter of the sasrec transformer; set it to 0 for "
                         f"arch {arch}")
    if mixing.attention != "full":
        raise ValueError(f"`model.mixing.attention: {mixing.attention}` is causal attention for sasrec; use "
                         f"`attention: full` with arch {arch}")
    if items.features != "add":
        raise ValueError(f"`model.items.features: {items.features}` is offered with arch sasrec only; use "
                         "`features: add`")


# The one place an architecture's name is read: `model.arch` -> its class.
NETWORKS: dict[str, type[StreamRecModel]] = {"sasrec": SASRec, "bert4rec": BERT4Rec, "gru": GRU4Rec, "tvrec": TVRec}
for _name, _cls in NETWORKS.items():
    _cls.arch = _name

# The module's hyper-parameters the network takes; the others are training settings.
NETWORK_KEYS = ("num_items", "d_model", "n_heads", "n_layers", "d_ff", "dropout", "max_len", "num_features",
                "features_per_item", "block", "mixing", "items")
TRAINING_KEYS = ("lr", "weight_decay", "objective", "contrastive", "optimizer", "evaluation", "speed")


def network_class(arch: str) -> type[StreamRecModel]:
    if arch not in NETWORKS:
        raise ValueError(f"`model.arch` must be {', '.join(NETWORKS)}; got {arch!r}")
    return NETWORKS[arch]


def module_settings(hparams: Mapping[str, Any]) -> dict[str, Any]:
    """A module's stored hyper-parameters (a checkpoint's, an export's) as its settings: old flat names mapped
    (`upgrade_hparams`), LightningCLI's bookkeeping (`_instantiator`) left out, an unknown key refused."""
    hp = {k: v for k, v in upgrade_hparams(hparams).items() if not k.startswith("_")}
    unknown = [k for k in hp if k not in ("arch", *NETWORK_KEYS, *TRAINING_KEYS)]
    if unknown:
        raise ValueError(f"hyper-parameter {unknown[0]!r} is not a StreamRec setting; the settings are arch, "
                         f"{', '.join(NETWORK_KEYS + TRAINING_KEYS)}")
    return hp


def network_arguments(hparams: Mapping[str, Any]) -> tuple[type[StreamRecModel], dict[str, Any]]:
    """The one handoff from a module's hyper-parameters (a checkpoint's, an export's, the module's own) to its
    network: the class and exactly its arguments (`module_settings`)."""
    hp = module_settings(hparams)
    return network_class(hp.get("arch", "sasrec")), {k: hp[k] for k in NETWORK_KEYS if k in hp}


def build_network(hparams: Mapping[str, Any]) -> StreamRecModel:
    cls, arguments = network_arguments(hparams)
    return cls(**arguments)
