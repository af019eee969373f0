"""Batch scoring on Ray Data: `python -m streamrec.score --engine ray` (needs the `scale` extra).

    pip install -c constraints.txt -e '.[scale]'
    python -m streamrec.score --engine ray --workers 4 --ckpt CKPT --input LOG --output recs.parquet
    python -m streamrec.score --engine ray --ray-address ray://head:10001 ...   # a running cluster

The driver reads the log with the local engine's reader (`streamrec.data.readers.read_interactions`), so every user gets
the same history, and hands Ray Data blocks of `--chunk-users` (user_id, history) rows. `map_batches` runs `UserScorer`,
a callable class: each of `--workers` replicas loads the checkpoint once and scores its blocks with the local engine's
`streamrec.ranking.batch.BatchScorer`, so the rows are the same. Ray writes Parquet parts into a hidden folder beside
OUTPUT; the driver streams them into OUTPUT in one atomic rename, with the provenance in the schema metadata, and
deletes the folder. On a remote cluster that folder must be on storage the workers share. A failed or interrupted run
starts over (Ray retries failed tasks itself); `--shard I/N` works as in the local engine. Rows come in block order, not
input order: compare outputs as sets of rows."""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from core.runtime.ray_session import RayCluster, import_ray, ray_instance
from streamrec.api import Recommender
from streamrec.data.interactions import Interactions
from streamrec.ranking.batch import BatchScorer, RankingOptions, write_tables

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RayOptions(RayCluster):
    """`RayCluster` and the users per Ray Data block."""

    block_users: int = 20_000


class UserScorer:
    """Scores blocks of (user_id, history) rows; Ray builds one per replica, so the model loads once per worker."""

    def __init__(self, ckpt: Path | list[Path], items: str | None, options: RankingOptions, threads: int):
        torch.set_num_threads(threads)
        rec = Recommender.load(ckpt, "cpu", items=items)
        self.scorer = BatchScorer(rec.model, rec.vocab, options, rec.catalog)

    def __call__(self, batch: pa.Table) -> pa.Table:
        users = batch.column("user_id").to_pylist()
        skipped = self.scorer.no_history
        table = self.scorer.rows(users, dict(zip(users, batch.column("history").to_pylist(), strict=True)))
        if self.scorer.no_history > skipped:
            log.warning("skipped %d users with no item known to the checkpoint", self.scorer.no_history - skipped)
        return table


def score_with_ray(ckpt: Path | list[Path], items: str | None, options: RankingOptions, ray_options: RayOptions,
                   users: list[str], interactions: Interactions, output: Path,
                   metadata: dict[bytes, bytes] | None = None) -> int:
    """Score `users` (each with a history in `interactions`) on Ray Data into `output`, whose lock the caller
    holds; returns the rows written."""
    ray = import_ray()
    parts = output.resolve().with_name(f".{output.name}.ray")  # hidden; removed at the end, or at the next run
    shutil.rmtree(parts, ignore_errors=True)
    try:
        with ray_instance(ray, ray_options):
            ray.data.DataContext.get_current().enable_progress_bars = False
            step = ray_options.block_users
            blocks = [pa.table({"user_id": chunk, "history": [interactions.items[u] for u in chunk]},
                               schema=pa.schema([("user_id", pa.string()), ("history", pa.list_(pa.string()))]))
                      for chunk in (users[i : i + step] for i in range(0, len(users), step))]
            kwargs = {"ckpt": ckpt, "items": items, "options": options, "threads": ray_options.threads}
            scored = ray.data.from_arrow(blocks).map_batches(
                UserScorer, fn_constructor_kwargs=kwargs, batch_size=None, batch_format="pyarrow",
                concurrency=ray_options.workers, num_cpus=ray_options.cpus_per_worker)
            scored.write_parquet(str(parts))
            files = sorted(parts.glob("*.parquet"))
            return write_tables((t for t in (pq.read_table(f) for f in files) if t.num_rows), output, metadata)
    finally:
        shutil.rmtree(parts, ignore_errors=True)
