"""`python -m streamrec predict`: what `StreamRecModule.predict_step` returns, and the Parquet writer that stores it.

    python -m streamrec predict --config configs/streamrec/demo.yaml --config configs/streamrec/predict_demo.yaml \\
        --ckpt_path runs/streamrec_demo/checkpoints/best.ckpt

`predict_step` ranks with `streamrec.ranking.batch.rank` and the rows are `recommendation_table`'s, as
`python -m streamrec.score` writes them; a part kept with `merge: false` (`core.runtime.prediction`) is read with
`pyarrow.parquet.read_table` and sorted by `row`, `rank`.

Legend: B users, K items per user."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from torch import Tensor

from core.runtime.errors import InputError
from core.runtime.prediction import PartsWriter
from streamrec.data.vocab import ItemVocab
from streamrec.ranking.batch import RankingOptions, recommendation_table, write_tables


class RankedBatch(NamedTuple):
    """What `StreamRecModule.predict_step` returns for a `PredictBatch`: each user's (B,) position in the data
    module's user order, and the (B, K) model item ids (best first; 0: no eligible item left) and scores."""

    rows: Tensor
    users: list[str]
    items: Tensor
    scores: Tensor


class RecommendationWriter(PartsWriter):
    """Writes `predict`'s recommendations to one Parquet file: `user_id, rank, item_id, score`. Sets the model's
    `predict_options` from its own arguments when predict starts.

    Args:
        output: the .parquet file to write; its folder must exist.
        top_k: items per user.
        exclude_seen: leave out items already in the user's history.
        merge: rank 0 merges the ranks' `OUTPUT.rank{N}.parquet` parts into `output` and deletes them; false keeps the
            parts (each with a `row` column giving the user order), e.g. for ranks on machines that share no folder.
        item_chunk: items ranked at once (`streamrec.ranking.topk.top_k_items`); None: the ranker's default."""

    part_suffix, written_by = ".parquet", "streamrec predict"

    def __init__(self, output: str, top_k: int = 10, exclude_seen: bool = True, merge: bool = True,
                 item_chunk: int | None = None):
        super().__init__(output, merge)
        try:
            self.options = RankingOptions(top_k=top_k, exclude_seen=exclude_seen, item_chunk=item_chunk)
        except InputError as err:
            raise InputError(f"RecommendationWriter: {err}") from None
        self._vocab: ItemVocab | None = None

    def check_output(self) -> None:
        if self.output.suffix != ".parquet" or self.output.is_dir():
            raise InputError(f"RecommendationWriter: output {self.output}: name a .parquet file")
        super().check_output()

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if stage == "predict":
            pl_module.predict_options = self.options
            self._vocab = pl_module.item_vocab

    def write_on_batch_end(self, trainer: Any, pl_module: Any, prediction: RankedBatch, batch_indices: Any,
                           batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        table = recommendation_table(prediction.users, pl_module.item_vocab, prediction.items.cpu(),
                                     prediction.scores.cpu())
        position = dict(zip(prediction.users, prediction.rows.tolist(), strict=True))
        rows = pa.array([position[u] for u in table.column("user_id").to_pylist()], type=pa.int64())
        self._rows.append(table.append_column("row", rows))

    def write_part(self, rows: list[pa.Table], path: Path) -> None:
        write_tables([self._concat(rows)], path)

    def read_part(self, path: Path) -> list[pa.Table]:
        return [pq.read_table(path)]

    def write_output(self, rows: list[pa.Table]) -> None:
        table = self._concat(rows)  # sorted back by user position, then rank, without the `row` column
        order = pc.sort_indices(table, sort_keys=[("row", "ascending"), ("rank", "ascending")])
        write_tables([table.take(order).drop_columns(["row"])], self.output)

    def _concat(self, tables: list[pa.Table]) -> pa.Table:
        if tables:
            return pa.concat_tables(tables)
        none = torch.zeros(0, self.options.top_k, dtype=torch.long)
        return recommendation_table([], self._vocab, none, none.float()).append_column("row", pa.array([], pa.int64()))

