"""Top-K recommendations: the ranking every entry point shares, their table, and `predict`'s Parquet writer.

`top_items` ranks a score matrix (seen items and items outside an allow-list left out); the Python
API (`streamrec.api`), batch scoring (`streamrec.score`) and `StreamRecModule.predict_step` all rank
with it. `recommendation_table` is the one output schema: `user_id, rank, item_id, score` (rank 1 =
best), plus any explanation columns.

    python -m streamrec predict --config configs/streamrec/demo.yaml --config configs/streamrec/predict_demo.yaml \\
        --ckpt_path runs/streamrec_demo/checkpoints/best.ckpt

`RecommendationWriter` stores what `predict` returns. Under DDP each rank writes its own users to
`OUTPUT.rank{N}.parquet`; after a barrier rank 0 merges the parts, in the data module's user order,
into OUTPUT and deletes them (`merge: false` keeps the parts instead, for ranks on machines without a
shared folder: read them with `pyarrow.parquet.read_table` and sort by `row`, `rank`). Every file is
written atomically (`core.runtime.atomic`); one run at a time writes an output (`OUTPUT.lock`).

Legend: B users, K items per user, L seen-list length, N items.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from torch import Tensor

from core.runtime.atomic import atomic_path
from core.runtime.errors import InputError
from core.runtime.prediction import PartsWriter
from streamrec.data.vocab import ItemVocab
from streamrec.model.sasrec import PAD_ID


def top_items(scores: Tensor, k: int, exclude: Tensor | None = None,
              allowed: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The `k` best items of each row, best first.

    Args:
        scores: (B, N+1) float scores; column 0 (padding) is never returned.
        k: items per row (at most N are returned).
        exclude: (B, L) item ids to leave out of each row (0 = nothing), e.g. the items already seen.
        allowed: (N+1,) bool, True for the items that may be returned (an allow-list); None: every item.

    Returns:
        items (B, K) and their scores (B, K); a slot with no eligible item left holds item 0 and
        score -inf (when exclusions or the allow-list leave fewer than K items).
    """
    scores = scores.clone()  # the caller's scores stay as they were
    scores[:, PAD_ID] = float("-inf")
    if exclude is not None:
        scores.scatter_(1, exclude.to(scores.device), float("-inf"))  # padding 0 lands in column 0: already -inf
    if allowed is not None:
        scores.masked_fill_(~allowed.to(scores.device), float("-inf"))
    top_scores, top = scores.topk(min(k, scores.shape[1] - 1), dim=-1)
    return top.masked_fill(top_scores == float("-inf"), PAD_ID), top_scores


def recommendation_table(users: Sequence[str], vocab: ItemVocab, items: Tensor, scores: Tensor,
                         extra: dict[str, Tensor] | None = None) -> pa.Table:
    """One row per (user, rank), original ids; slots with no eligible item (item 0) are left out.

    Args:
        users: one id per row of `items`.
        vocab: the checkpoint's item vocabulary.
        items: (B, K) model item ids, best first.
        scores: (B, K) their scores.
        extra: more (B, K) columns; names starting with "because" hold item ids, the others floats.
    """
    k = items.shape[1]
    valid = (items != PAD_ID).flatten().tolist()
    cols: dict[str, list] = {
        "user_id": [u for u in users for _ in range(k)],
        "rank": list(range(1, k + 1)) * len(users),
        "item_id": [vocab.items[i - 1] if i else "" for i in items.flatten().tolist()],
        "score": scores.flatten().tolist(),
    }
    for name, values in (extra or {}).items():
        flat = values.flatten().tolist()
        cols[name] = [vocab.items[i - 1] if i else "" for i in flat] if name.startswith("because") else flat
    cols = {name: [v for v, ok in zip(col, valid, strict=True) if ok] for name, col in cols.items()}
    types = {"rank": pa.int32(), "score": pa.float32(), "attention_weight": pa.float32(),
             "occlusion_drop": pa.float32()}
    return pa.table({name: pa.array(col, type=types.get(name, pa.string())) for name, col in cols.items()})


class RankedBatch(NamedTuple):
    """What `StreamRecModule.predict_step` returns for a `PredictBatch`.

    Args:
        rows: (B,) position of each user in the data module's user order.
        users: the user ids.
        items: (B, K) recommended model item ids, best first (0: no eligible item left).
        scores: (B, K) their scores.
    """

    rows: Tensor
    users: list[str]
    items: Tensor
    scores: Tensor


class RecommendationWriter(PartsWriter):
    """Writes `predict`'s recommendations to one Parquet file: `user_id, rank, item_id, score`.

    Sets the model's `predict_top_k` and `predict_exclude_seen` from its own arguments when predict starts.

    Args:
        output: the .parquet file to write; its folder must exist.
        top_k: items per user.
        exclude_seen: leave out items already in the user's history.
        merge: rank 0 merges the ranks' `OUTPUT.rank{N}.parquet` parts into `output` and deletes them;
            false keeps the parts (each with a `row` column giving the user order), e.g. for ranks on
            machines that share no folder.
    """

    part_suffix, written_by = ".parquet", "streamrec predict"

    def __init__(self, output: str, top_k: int = 10, exclude_seen: bool = True, merge: bool = True):
        super().__init__(output, merge)
        if top_k < 1:
            raise InputError(f"RecommendationWriter: `top_k` must be >= 1, got {top_k}")
        self.top_k, self.exclude_seen = top_k, exclude_seen
        self._vocab: ItemVocab | None = None

    def check_output(self) -> None:
        if self.output.suffix != ".parquet" or self.output.is_dir():
            raise InputError(f"RecommendationWriter: output {self.output}: name a .parquet file")
        super().check_output()

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if stage == "predict":
            pl_module.predict_top_k, pl_module.predict_exclude_seen = self.top_k, self.exclude_seen
            self._vocab = pl_module.item_vocab

    def write_on_batch_end(self, trainer: Any, pl_module: Any, prediction: RankedBatch, batch_indices: Any,
                           batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        table = recommendation_table(prediction.users, pl_module.item_vocab, prediction.items.cpu(),
                                     prediction.scores.cpu())
        position = dict(zip(prediction.users, prediction.rows.tolist(), strict=True))
        rows = pa.array([position[u] for u in table.column("user_id").to_pylist()], type=pa.int64())
        self._rows.append(table.append_column("row", rows))

    def write_part(self, rows: list[pa.Table], path: Path) -> None:
        _write(self._concat(rows), path)

    def read_part(self, path: Path) -> list[pa.Table]:
        return [pq.read_table(path)]

    def write_output(self, rows: list[pa.Table]) -> None:
        _write(_in_user_order(self._concat(rows)), self.output)

    def _concat(self, tables: list[pa.Table]) -> pa.Table:
        if tables:
            return pa.concat_tables(tables)
        none = torch.zeros(0, self.top_k, dtype=torch.long)
        return recommendation_table([], self._vocab, none, none.float()).append_column("row", pa.array([], pa.int64()))


def _in_user_order(table: pa.Table) -> pa.Table:
    """Rows sorted by user position, then rank, without the `row` column."""
    order = pc.sort_indices(table, sort_keys=[("row", "ascending"), ("rank", "ascending")])
    return table.take(order).drop_columns(["row"])


def _write(table: pa.Table, path: Path) -> None:
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
