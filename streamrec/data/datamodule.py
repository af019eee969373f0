"""The DataModule chains the steps of streamrec.data (`readers`, `vocab`, `features`, `splits`, `datasets`); the
reading options go into every checkpoint. Skips (short users, cold-start targets) are logged."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from core.runtime.distributed import process_group_running
from core.runtime.errors import InputError
from core.runtime.resume import EpochRandomSampler
from streamrec.data.datasets import (
    EvalDataset,
    LengthGroupedBatchSampler,
    TrainDataset,
    collate_eval,
    collate_predict,
    collate_train,
    item_counts,
    user_sequences,
)
from streamrec.data.encoded import EncodedLog, cache_key
from streamrec.data.features import ItemFeatures, feature_table, read_item_features
from streamrec.data.ingest.options import READ_OPTIONS_KEY, DuplicatePolicy
from streamrec.data.readers import Format, ReadOptions, existing_path, read_interactions
from streamrec.data.splits import Split, SplitName, leave_one_out_split, temporal_split, time_quantiles
from streamrec.data.vectors import read_item_vectors
from streamrec.data.vocab import ItemVocab

log = logging.getLogger(__name__)


class StreamRecDataModule(L.LightningDataModule):
    """Reads a log, builds the item vocabulary and split, and serves causal batches. The file is read on first use of
    `num_items`, `vocab`, `splits` or `setup()`, so linking `data.num_items` to `model.num_items` at instantiation works
    right after construction.

    Args:
        path: interaction log (CSV/TSV/Parquet; MovieLens ratings.dat; SASRec "user item" lines; or one line
            per user "user item item ..."), or a folder of them.
        format: auto (by content, then extension), csv, tsv, parquet, movielens, sasrec or lines.
        max_len: model context length: the last max_len items are the input.
        batch_size: examples per batch (training and evaluation).
        split: leave_one_out (last item test, second-to-last validation) or temporal (global
            time cutoffs; needs timestamps).
        min_interactions: users with fewer events are dropped, after the reading filters.
        user_col: user column name (in a file without header, its position: 0, 1, ...).
        item_col: item column name.
        time_col: timestamp column name; None means the file order is chronological.
        delimiter: the field separator of a CSV-like file: ',', ';', '|' or tab; None: ',' for csv,
            tab for tsv, and for auto what the content shows (a file split by ';' or '|' needs it).
        header: whether the file's first line names its columns; false: `columns` names them, or
            `user_col`/`item_col`/`time_col` give positions (0, 1, 2).
        columns: the column names of a file without header, in file order, e.g. [user_id, item_id, timestamp].
        time_format: auto (numbers, or ISO-8601 such as 2024-05-01 or 2024-05-01T12:00:00+02:00), unix, iso,
            or a strptime pattern such as %d/%m/%Y %H:%M. A time without a zone is taken as UTC.
        filter: keep only the events whose value in one column passes, e.g. "rating >= 4", "event_type == buy"
            or "event_type in [view, buy]" (==, !=, >, >=, <, <=, in, not in). None: every event.
        duplicates: exact duplicate events (same user, item and time; without a time column the same item
            twice in a row): keep, drop (all but the first) or error. Their count is logged either way.
        min_item_count: items with fewer events (after `filter` and `duplicates`) are dropped, once.
        k_core: keep only the part of the log where every user and every item has at least k_core events,
            dropping and recounting until nothing changes (e.g. 5 for the usual 5-core); None: no k-core.
        sliding_window: train on every max_len-window of long histories, not only the last.
        prefixes: train on every prefix of each history, predicting only its last item (as FMLP-Rec, BSARec and
            RecBole do); an epoch encodes about (mean history length) / 2 times more positions.
        temporal_cutoffs: (valid, test) timestamps for split=temporal; None uses `temporal_quantiles`.
        temporal_quantiles: (valid, test) quantiles of all timestamps used when no cutoffs are given.
        num_workers: DataLoader worker processes.
        cache_dir: a folder for the encoded log (.npy), which later loads, ranks and workers memory-map instead
            of parsing the log. None: no cache.
        group_by_length: training batches of windows of similar length, each with the same number of targets,
            which compute less padding; false: random batches. Not used under DDP.
        item_features: an items file (CSV/TSV with `item_id`, or movies.dat) whose `feature_columns` the model
            embeds beside the item id; its items absent from the log become cold items. None: ids only.
        feature_columns: the categorical columns of `item_features`, e.g. [genres]; a cell may hold several
            values separated by "|".
        item_vectors: a `.npz` of item ids and dense vectors (`streamrec.data.vectors`; title embeddings from
            data/prepare_title_vectors.py) whose principal components start the item id table in `fit`. None:
            a random start."""

    def __init__(self, path: str, format: Format = "auto", max_len: int = 50, batch_size: int = 128,
                 split: SplitName = "leave_one_out", min_interactions: int = 2, user_col: str = "user_id",
                 item_col: str = "item_id", time_col: str | None = "timestamp", sliding_window: bool = False,
                 prefixes: bool = False, temporal_cutoffs: tuple[float, float] | None = None,
                 temporal_quantiles: tuple[float, float] = (0.8, 0.9), num_workers: int = 0,
                 cache_dir: str | None = None, group_by_length: bool = True, item_features: str | None = None,
                 feature_columns: list[str] | None = None, delimiter: str | None = None, header: bool = True,
                 columns: list[str] | None = None, time_format: str = "auto", filter: str | None = None,
                 duplicates: DuplicatePolicy = "keep", min_item_count: int = 1, k_core: int | None = None,
                 item_vectors: str | None = None):
        super().__init__()
        for name, value, low in (("max_len", max_len, 1), ("batch_size", batch_size, 1),
                                 ("min_interactions", min_interactions, 1), ("num_workers", num_workers, 0)):
            if value < low:
                raise InputError(f"`{name}` must be at least {low}, got {value}")
        if split not in ("leave_one_out", "temporal"):
            raise InputError(f"`split` must be leave_one_out or temporal, got {split!r}")
        existing_path(path)  # fail at construction, not at the first batch
        self.read_options = ReadOptions(
            format=format, delimiter=delimiter, header=header, columns=None if columns is None else tuple(columns),
            user_col=user_col, item_col=item_col, time_col=time_col, time_format=time_format, filter=filter,
            duplicates=duplicates, min_item_count=min_item_count, k_core=k_core)
        if item_features is None and feature_columns:
            raise InputError(f"`feature_columns` {feature_columns} needs `item_features`, the file holding them")
        if item_features is not None and not feature_columns:
            raise InputError(f"`item_features` {item_features!r} needs `feature_columns`, the categorical columns to "
                             "read, e.g. [genres]")
        if item_features is not None and not Path(item_features).is_file():
            raise FileNotFoundError(f"item features file {item_features!r} does not exist; check `item_features`")
        if item_vectors is not None and not Path(item_vectors).is_file():
            raise FileNotFoundError(f"item vectors file {item_vectors!r} does not exist; check `item_vectors`")
        self.save_hyperparameters()
        self.path, self.format, self.max_len, self.batch_size = path, format, max_len, batch_size
        self.split_name, self.min_interactions = split, min_interactions
        self.sliding_window, self.prefixes, self.num_workers = sliding_window, prefixes, num_workers
        self.temporal_cutoffs, self.temporal_quantiles = temporal_cutoffs, temporal_quantiles
        self.cache_dir, self.group_by_length = cache_dir, group_by_length
        self.item_features_path, self.feature_columns = item_features, feature_columns
        self.item_vectors_path = item_vectors
        self._log: EncodedLog | None = None
        self._vocab: ItemVocab | None = None
        self._features: ItemFeatures | None = None
        self._split: Split | None = None

    def _load(self) -> None:
        if self._split is not None:
            return
        self._log = self._encoded_log()
        log.info("%s: %d interactions, %d users, %d items", self.path, len(self._log.items), len(self._log.users),
                 len(self._log.vocab))
        self._vocab, self._split = self._log.vocab, self._make_split(self._log)
        if self.item_features_path is not None:
            self._vocab, self._features = self._read_features(self._log.vocab)

    def _read_features(self, log_vocab: ItemVocab) -> tuple[ItemVocab, ItemFeatures]:
        features = read_item_features(self.item_features_path, self.feature_columns)
        in_log = int(np.count_nonzero(log_vocab.lookup(list(features))))
        if not in_log:
            raise InputError(f"{self.item_features_path}: none of its {len(features)} items is in the log "
                             f"{self.path}; its item_id column must hold the log's item ids")
        vocab = log_vocab.extended(features)
        table = feature_table(vocab, features)
        log.info("%s: %d features; %d of the log's %d items have some, %d cold items added", self.item_features_path,
                 table.num_features, in_log, len(log_vocab), len(vocab) - len(log_vocab))
        return vocab, table

    def _encoded_log(self) -> EncodedLog:
        key = None
        if self.cache_dir is not None:
            key = cache_key(self.path, min_interactions=self.min_interactions, **self.read_options.to_dict())
            if (cached := EncodedLog.load(self.cache_dir, key)) is not None:
                log.info("%s: mapped the encoded log cached in %s", self.path, self.cache_dir)
                return cached
        kept = read_interactions(self.path, options=self.read_options).drop_short_users(self.min_interactions)
        if not kept.users:
            raise InputError(f"{self.path}: no user has {self.min_interactions} or more interactions; "
                             "lower `min_interactions`")
        encoded = EncodedLog.from_interactions(kept)
        if key is None:
            return encoded
        encoded.save(self.cache_dir, key)
        return EncodedLog.load(self.cache_dir, key)  # the mapped copy, shared with other processes

    def _make_split(self, encoded: EncodedLog) -> Split:
        if self.split_name == "leave_one_out":
            return leave_one_out_split(encoded.sequences())
        if encoded.times is None:
            raise InputError(f"{self.path}: split='temporal' needs timestamps, but this file has none; "
                             "use split='leave_one_out' or a CSV/TSV/Parquet file with a time column")
        cutoffs = self.temporal_cutoffs or tuple(time_quantiles(np.asarray(encoded.times), self.temporal_quantiles))
        log.info("temporal split: train <= %s < valid <= %s < test", *cutoffs)
        return temporal_split(encoded.sequences(), encoded.timestamps(), *cutoffs)

    @property
    def vocab(self) -> ItemVocab:
        self._load()
        return self._vocab

    @property
    def num_items(self) -> int:
        """N, the number of items; the model's item table has N + 1 rows (0 = padding)."""
        return self.vocab.num_items

    def _feature(self, name: str, none: object) -> Any:
        self._load()
        return none if self._features is None else getattr(self._features, name)

    # `ItemFeatures.table`, None without a file; the distinct features and F, the slots per item (0 without
    # `item_features`), linked into the model.
    item_features = property(lambda self: self._feature("table", None))
    num_features = property(lambda self: self._feature("num_features", 0))
    features_per_item = property(lambda self: self._feature("features_per_item", 0))

    @property
    def item_vectors(self) -> Tensor | None:
        """(N + 1, E) vectors from `item_vectors`, NaN rows for the items it lacks; None without the file. Read on
        each call: only `fit`'s start reads it."""
        return None if self.item_vectors_path is None else read_item_vectors(self.item_vectors_path, self.vocab)

    @property
    def splits(self) -> Split:
        self._load()
        return self._split

    def train_item_counts(self) -> Tensor:
        """(N + 1,) occurrences of each item in the training histories (for a popularity baseline)."""
        return item_counts(self.splits.train.values(), self.num_items)

    def setup(self, stage: str | None = None) -> None:
        self._load()
        self.train_set = self._train_set()
        self.valid_set = EvalDataset(self.splits.valid)
        self.test_set = EvalDataset(self.splits.test)
        log.info("%d training windows, %d validation and %d test cases", len(self.train_set), len(self.valid_set),
                 len(self.test_set))

    def _train_set(self) -> TrainDataset:
        # Training histories are prefixes of the users' sequences, so they are spans of the (mapped) log.
        index = {u: k for k, u in enumerate(self._log.users)}
        starts = np.asarray(self._log.offsets)[:-1][[index[u] for u in self.splits.train]]
        ends = starts + np.array([len(h) for h in self.splits.train.values()], dtype=np.int64)
        return TrainDataset.from_spans(self._log.items, starts, ends, self.max_len, self.sliding_window, self.prefixes)

    def state_dict(self) -> dict[str, dict]:
        """Saved in every checkpoint, so that `read_options_from_checkpoint` reads new logs the same way."""
        return {"vocab": self.vocab.to_dict(), READ_OPTIONS_KEY: self.read_options.to_dict()}

    def load_state_dict(self, state_dict: dict[str, dict]) -> None:
        """Refuse to resume on data whose item ids map differently from the checkpoint's."""
        saved = ItemVocab.from_dict(state_dict["vocab"])
        if saved.items != self.vocab.items:
            raise InputError(f"{self.path}: its {len(self.vocab)} items map to different ids than the checkpoint's "
                             f"{len(saved)}; resume with the data file the checkpoint was trained on")

    def train_dataloader(self) -> DataLoader:
        # Shuffled from (seed, epoch), and a generator of the loader's own: fetching data draws nothing from
        # the global generator, so a run resumed from a checkpoint replays the same batches (core.runtime.resume).
        seed = torch.initial_seed() % 2**31  # seed_everything's seed
        collate = partial(collate_train, max_len=self.max_len, last_only=self.prefixes)
        loader = {"num_workers": self.num_workers, "collate_fn": collate, "persistent_workers": self.num_workers > 0,
                  "generator": torch.Generator().manual_seed(seed)}
        if self.group_by_length and not process_group_running():
            sampler = LengthGroupedBatchSampler(self.train_set.lengths, self.batch_size, seed,
                                                targets=self.train_set.targets)
            return DataLoader(self.train_set, batch_sampler=sampler, **loader)
        if self.group_by_length:
            log.info("training batches are random under DDP: Lightning's DistributedSampler shards them "
                     "(data.group_by_length applies to one process)")
        return DataLoader(self.train_set, batch_size=self.batch_size, sampler=EpochRandomSampler(self.train_set, seed),
                          **loader)

    def _eval_loader(self, dataset: Dataset) -> DataLoader:
        # Lightning's DDP sampler pads ranks with repeated cases, counting some users twice; this one does not
        # (metric states are summed across ranks, so uneven shares are fine).
        sampler = UnrepeatedDistributedSampler(dataset, shuffle=False) if process_group_running() else None
        return DataLoader(dataset, batch_size=self.batch_size, sampler=sampler, num_workers=self.num_workers,
                          collate_fn=partial(collate_eval, max_len=self.max_len),
                          persistent_workers=self.num_workers > 0)

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader(self.valid_set)

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader(self.test_set)

    def predict_dataloader(self) -> DataLoader:
        """Every user's whole sequence, in input order (Lightning shards them under DDP)."""
        rows = list(enumerate(user_sequences(self.splits).items()))
        return DataLoader(rows, batch_size=self.batch_size, num_workers=self.num_workers,
                          collate_fn=partial(collate_predict, max_len=self.max_len),
                          persistent_workers=self.num_workers > 0)
