"""Categorical item features (genres, brand, ...) from an items file (`read_items`), as ids the model embeds.

A cell may hold several values separated by "|"; each (column, value) pair is one feature, so equal values of two
columns stay apart. Items absent from the log become cold items (`ItemVocab.extended`), scored by their features alone.
Legend: N items (ids 1..N, 0 = padding), F feature slots per item."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from core.runtime.errors import InputError
from streamrec.data.items import ID_COLUMN, ItemCatalog, read_items
from streamrec.data.vocab import ItemVocab

SEPARATOR = "|"  # between the values of a multi-valued cell, as in movies.dat's Genres


@dataclass(frozen=True)
class ItemFeatures:
    """The features as "column=value" (values[k] has feature id k + 1; 0 = padding) and the (N+1, F) int64
    `table` of each item's feature ids, padded with 0 (row 0 and the items the file does not list hold none)."""

    values: list[str]
    table: Tensor

    @property
    def num_features(self) -> int:
        return len(self.values)

    @property
    def features_per_item(self) -> int:
        return self.table.shape[1]


def read_item_features(path: str | Path, columns: Sequence[str]) -> dict[str, list[str]]:
    """Item id -> its features ("column=value", file order) in `columns` of an items file (`read_items`), for
    every item the file lists with at least one."""
    if not columns:
        raise InputError(f"{path}: `feature_columns` is empty; name the categorical columns to read, e.g. [genres]")
    catalog = read_items(path)
    if not len(catalog):
        raise InputError(f"{path}: the file lists no items; pass an items file with one row per item")
    for column in columns:
        if column not in catalog.columns:
            found = ", ".join(catalog.columns) or "none"
            why = " (the id is not a feature)" if column == ID_COLUMN else ""
            raise InputError(f"{path}: no column {column!r}{why} for `feature_columns` (columns: {found}); "
                             "name columns of the file")
    if len(set(columns)) != len(columns):
        raise InputError(f"{path}: `feature_columns` {list(columns)} names a column twice; name each once")
    features = {item: _features(catalog, row, columns) for item, row in catalog.rows.items()}
    features = {item: found for item, found in features.items() if found}
    if not features:
        raise InputError(f"{path}: no item has a value in {', '.join(columns)}; check `feature_columns`")
    return features


def _features(catalog: ItemCatalog, row: dict[str, str], columns: Sequence[str]) -> list[str]:
    found: list[str] = []
    for column in columns:
        values = row.get(column, "").split(catalog.separators.get(column, SEPARATOR))
        found += [f"{column}={v.strip()}" for v in values if v.strip()]
    return list(dict.fromkeys(found))  # a value repeated in a cell counts once (a mean over the item's features)


def feature_table(vocab: ItemVocab, features: dict[str, list[str]]) -> ItemFeatures:
    """The feature vocabulary (sorted) and the (N+1, F) table of `vocab`'s items; ids not in `vocab` are skipped."""
    values = sorted({f for found in features.values() for f in found})
    index = {f: k + 1 for k, f in enumerate(values)}
    items = list(features)
    ids = vocab.lookup(items).tolist()
    width = max(len(found) for found in features.values())
    table = torch.zeros(vocab.num_items + 1, width, dtype=torch.long)
    for item, model_id in zip(items, ids, strict=True):
        if model_id:
            found = features[item]
            table[model_id, : len(found)] = torch.tensor([index[f] for f in found])
    return ItemFeatures(values, table)
