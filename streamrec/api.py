"""StreamRec from Python: a trained recommender that recommends for many users, finds similar items and explains.

    from streamrec import Recommender

    rec = Recommender.load("runs/streamrec_demo/checkpoints/best.ckpt")   # several paths: an ensemble
    recs = rec.recommend([["i0012", "i0007"], ["i0031"]], top_k=5)   # one history per user, oldest first
    recs[0]                          # [("i0040", 7.1), ...]: the first user's 5 items, best first
    recs.unknown_items               # ids the checkpoint never saw: skipped, not an error
    rec.similar_items(["i0012"], top_k=5)[0]
    rec.explain(["i0012", "i0007"], top_k=3).because
    Recommender.load(ckpt, items="movies.dat")   # titles and metadata for explanations (`streamrec.data.items`)
    log = rec.read_log("events.csv")   # read as the training log was (its columns, delimiter, ...)
    recs = rec.recommend(list(log.items.values()))

Item ids are strings (as the log's cells read); an integer id is its string form, so `rec.recommend([[1, 2]])`
asks for items "1" and "2". Users need no retraining: a history is read as it is given.

Legend: B users, T history length (the model's max_len), K items per user, N items, D model width."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from core.nn.cpu_fastpath import enable_cpu_fastpath
from core.runtime.checkpoint import load_module
from core.runtime.errors import InputError
from core.runtime.export import is_export_folder, load_folder
from streamrec.data.interactions import Interactions
from streamrec.data.items import ItemCatalog, read_items
from streamrec.data.readers import ReadOptions, read_interactions, read_options_from_checkpoint
from streamrec.data.vocab import VOCAB_KEY, ItemVocab
from streamrec.model.hparams import upgrade_hparams
from streamrec.model.network import PAD_ID, StreamRecModel
from streamrec.ranking.batch import RankingOptions, encode_histories, encode_history, length_batches, recommend
from streamrec.ranking.ensemble import Ensemble, explaining
from streamrec.ranking.explain import attention_weights, occlusion_drops
from streamrec.ranking.topk import top_k_items
from streamrec.reading import with_overrides

WRITTEN_BY = "python -m streamrec fit"
EXPORTED_BY = "python -m streamrec.export --format safetensors"


@dataclass
class Recommendations:
    """Ranked items per query (a user's history, or an item for `similar_items`), in query order.

    Attributes:
        items: per query, (item_id, score) pairs, best first; [] for a cold query.
        unknown_items: the distinct ids (histories, queries, allow-list) the checkpoint never saw, skipped.
        cold: positions of the queries that had nothing known to rank from."""

    items: list[list[tuple[str, float]]]
    unknown_items: list[str]
    cold: list[int]

    def __getitem__(self, i: int) -> list[tuple[str, float]]:
        return self.items[i]

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[list[tuple[str, float]]]:
        return iter(self.items)


@dataclass
class Explanation:
    """Why a history got its recommendations: attention over the history, and occlusion per recommendation.

    Attributes:
        history: the items the model read (the last max_len known ones), oldest first.
        attention: rolled-out attention of the recommending position on each history item (sums to 1).
        recommendations: (item_id, score) pairs, best first.
        drops: (K, T) how much each recommendation's score drops when each history item is removed.
        unknown_items: history ids the checkpoint never saw (skipped).
        catalog: titles and metadata of the items, when the recommender was loaded with `items=FILE`."""

    history: list[str]
    attention: list[float]
    recommendations: list[tuple[str, float]]
    drops: Tensor
    unknown_items: list[str]
    catalog: ItemCatalog | None = None

    def title(self, item_id: str) -> str:
        """The item's title from the items file; the raw id without a file or for an id it does not list."""
        return item_id if self.catalog is None else self.catalog.title(item_id)

    @property
    def because(self) -> list[tuple[str, str, float]]:
        """Per recommendation: the most attended history item, the one whose removal costs most, and that cost."""
        top_att = self.history[max(range(len(self.attention)), key=self.attention.__getitem__)]
        return [(top_att, self.history[int(d.argmax())], float(d.max())) for d in self.drops]


class Recommender:
    """A trained StreamRec model (in eval mode) with its item vocabulary, on one device; `catalog` gives
    explanations titles, `read_options` are how `read_log` reads new logs (the training log's)."""

    def __init__(self, model: StreamRecModel | Ensemble, vocab: ItemVocab, catalog: ItemCatalog | None = None,
                 read_options: ReadOptions | None = None):
        self.model, self.vocab, self.catalog = model.eval(), vocab, catalog
        self.read_options = (read_options or ReadOptions()).for_new_logs()

    @classmethod
    def load(cls, ckpt: str | Path | Sequence[str | Path], device: str | torch.device = "cpu",
             items: str | Path | None = None, mmap: bool = False) -> Recommender:
        """The recommender stored in a checkpoint written by `python -m streamrec fit`, or in an export folder.

        Args:
            ckpt: the .ckpt file, or a folder written by `python -m streamrec.export --format safetensors`; several
                (a list) make an `Ensemble` (the mean of their probabilities) of models of one catalogue.
            device: where to run the model ("cpu", "cuda", ...).
            items: an items file (CSV/TSV with `item_id`, `title`, ... or MovieLens' movies.dat) whose titles and
                metadata `explain` carries; ids it does not list show as themselves.
            mmap: a .ckpt's weights stay mapped from the file, read as used."""
        if not isinstance(ckpt, str | Path):
            return cls._ensemble([Path(p) for p in ckpt], device, items, mmap)
        catalog = None if items is None else read_items(items)  # first: a bad file fails before the model loads
        # The network alone (not the LightningModule that trained it): scoring never imports Lightning.
        if is_export_folder(ckpt):
            model, state = load_folder(StreamRecModel, ckpt, "streamrec", EXPORTED_BY)
            vocab = ItemVocab.from_dict(state)
        else:
            model, state = load_module(StreamRecModel, ckpt, WRITTEN_BY, "StreamRec", required=[VOCAB_KEY],
                                       mmap=mmap, prefix="model.")
            vocab = ItemVocab.from_dict(state[VOCAB_KEY])
        speed = upgrade_hparams(state["hyper_parameters"]).get("speed") or {}
        if speed.get("cpu_fastpath"):  # as trained: the module turns it on for its network
            enable_cpu_fastpath(model)
        return cls(model.to(device), vocab, catalog, read_options_from_checkpoint(state))

    @classmethod
    def _ensemble(cls, paths: list[Path], device: str | torch.device, items: str | Path | None,
                  mmap: bool) -> Recommender:
        if not paths:
            raise InputError("no checkpoint given: pass one path, or a list of several for an ensemble")
        first = cls.load(paths[0], device, items, mmap)
        if len(paths) == 1:
            return first
        members = [first.model]
        for path in paths[1:]:
            other = cls.load(path, device, mmap=mmap)
            if other.vocab.items != first.vocab.items:
                raise InputError(f"{path}: its item vocabulary differs from {paths[0]}'s; an ensemble needs models "
                                 "trained on one catalogue")
            if other.model.max_len != first.model.max_len:
                raise InputError(f"{path}: max_len {other.model.max_len}, {paths[0]}: {first.model.max_len}; an "
                                 "ensemble's members read one history length")
            members.append(other.model)
        return cls(Ensemble(members), first.vocab, first.catalog, first.read_options)

    def read_log(self, path: str | Path, **overrides: object) -> Interactions:
        """A log of histories to recommend for, read the way the training log was; `log.items[user]` is then the
        user's item ids, oldest first. `overrides` (`streamrec.reading.OVERRIDABLE`), e.g. `user_col="uid"`,
        `time_col=None`; the count filters of training never apply."""
        return read_interactions(path, options=with_overrides(self.read_options, overrides))

    @property
    def device(self) -> torch.device:
        return self.model.device

    def encode(self, history: Sequence[str | int]) -> tuple[list[int], list[str]]:
        """Model ids of the known items of `history` (order kept) and the unknown ids (skipped)."""
        return encode_history(as_item_ids(history, "history"), self.vocab)

    def recommend(self, histories: Sequence[Sequence[str | int]], top_k: int = 10, exclude_seen: bool = True,
                  items: Iterable[str | int] | None = None, batch_size: int = 256,
                  item_chunk: int | None = None, cold_slots: int = 0) -> Recommendations:
        """The `top_k` best items for each of many users.

        Args:
            histories: one history per user: original item ids (an integer is its string form), oldest first.
            items: an allow-list: recommend only among these ids; None: the whole catalogue.
            item_chunk: items scored at once (memory is about batch_size x item_chunk scores); None: the default.
            cold_slots: of the `top_k`, how many go to the best cold items (`RankingOptions.cold_slots`).

        `result[u]` is user u's (item_id, score) list; a user with no known history item is cold and gets []."""
        if isinstance(histories, str) or any(isinstance(h, str | int) for h in histories):
            raise InputError("`histories` takes one list of item ids per user; for one user pass [history]")
        options = RankingOptions(top_k, exclude_seen, item_chunk, batch_size=batch_size, cold_slots=cold_slots)
        histories = [as_item_ids(h, f"histories[{u}]") for u, h in enumerate(histories)]
        encoded, missing = encode_histories(histories, self.vocab)
        unknown = dict.fromkeys(i for m in missing for i in m)
        allowed = None if items is None else self._allow_list(items, unknown)
        ranked: list[list[tuple[str, float]]] = [[] for _ in encoded]
        warm = [i for i, ids in enumerate(encoded) if ids]
        for batch in length_batches([len(encoded[i]) for i in warm], batch_size):
            rows = [warm[j] for j in batch]
            _, top, scores = recommend(self.model, [encoded[i] for i in rows], options, allowed)
            for i, row_items, row_scores in zip(rows, top.tolist(), scores.tolist(), strict=True):
                ranked[i] = self._named(row_items, row_scores)
        return Recommendations(ranked, list(unknown), [i for i, ids in enumerate(encoded) if not ids])

    @torch.no_grad()
    def similar_items(self, item_ids: Sequence[str | int], top_k: int = 10,
                      item_chunk: int | None = None) -> Recommendations:
        """The `top_k` items whose vectors (those hidden states are scored against) are closest (cosine) to each
        given item's, the item itself left out; `item_chunk` at a time. An unknown query is cold and gets []."""
        item_ids = as_item_ids(item_ids, "item_ids")
        options = RankingOptions(top_k, item_chunk=item_chunk)
        found = self.vocab.lookup(item_ids)  # (B,) 0 for an unknown id
        ranked: list[list[tuple[str, float]]] = [[] for _ in item_ids]
        if found.any():
            vectors = self.model.item_vectors
            query = torch.tensor(found[found != 0].tolist(), device=self.device)
            unit = torch.nn.functional.normalize(vectors[query].float(), dim=-1)  # (B, D)
            top, scores = top_k_items(unit, vectors, options.top_k, exclude=query[:, None],
                                      item_chunk=options.item_chunk, normalize=True)  # cosines
            for pos, ids, values in zip(np.flatnonzero(found).tolist(), top.tolist(), scores.tolist(), strict=True):
                ranked[pos] = self._named(ids, values)
        cold = np.flatnonzero(found == 0).tolist()
        return Recommendations(ranked, list(dict.fromkeys(item_ids[i] for i in cold)), cold)

    @torch.no_grad()
    def explain(self, history: Sequence[str | int], top_k: int = 10, exclude_seen: bool = True,
                items: Iterable[str | int] | None = None) -> Explanation:
        """Why one history (oldest first) gets its top-k items: the two views of `streamrec.ranking.explain`;
        `items` is an allow-list, as in `recommend`."""
        options = RankingOptions(top_k, exclude_seen)
        ids, missing = self.encode(history)
        if not ids:
            raise InputError("no item of the history is known to the checkpoint; nothing to explain")
        unknown = dict.fromkeys(missing)
        allowed = None if items is None else self._allow_list(items, unknown)
        inputs, top, scores = recommend(self.model, [ids], options, allowed)
        keep = top[0] != PAD_ID
        top, scores = top[:, keep], scores[:, keep]
        real = inputs[0] != PAD_ID
        network = explaining(self.model)
        drops = occlusion_drops(network, inputs, top)[0][:, real]  # (K, T')
        return Explanation(self.vocab.decode(inputs[0][real]), attention_weights(network, inputs)[0][real].tolist(),
                           self._named(top[0].tolist(), scores[0].tolist()), drops.cpu(), list(unknown), self.catalog)

    def _allow_list(self, items: Iterable[str | int], unknown: dict[str, None]) -> Tensor:
        """(N+1,) bool mask of the known ids of `items`; the unknown ones are added to `unknown`."""
        known, missing = encode_history(as_item_ids(items, "items"), self.vocab)
        allowed = torch.zeros(self.vocab.num_items + 1, dtype=torch.bool)
        allowed[known] = True
        unknown.update(dict.fromkeys(missing))
        return allowed.to(self.device)

    def _named(self, items: list[int], scores: list[float]) -> list[tuple[str, float]]:
        """(item_id, score) pairs of the filled slots (item 0 marks a slot with no eligible item)."""
        return [(self.vocab.items[i - 1], s) for i, s in zip(items, scores, strict=True) if i != PAD_ID]


def as_item_ids(ids: Iterable[str | int], name: str) -> list[str]:
    """`ids` as the vocabulary's ids, strings: an integer (Amazon's, MovieLens') is its decimal form, 7 is "7"."""
    if isinstance(ids, str | bytes):
        raise InputError(f"`{name}` takes a list of item ids, not one string; pass [{ids!r}]")
    out = list(ids)
    for k, value in enumerate(out):
        if isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_):
            out[k] = str(int(value))
        elif not isinstance(value, str):
            raise InputError(f"`{name}[{k}]` must be an item id (a string or an integer), got "
                             f"{type(value).__name__} {value!r}")
    return out
