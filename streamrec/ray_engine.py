"""Batch scoring on Ray Data: `python -m streamrec.score --engine ray` (needs the `scale` extra).

    pip install -c constraints.txt -e '.[scale]'
    python -m streamrec.score --engine ray --workers 4 --ckpt CKPT --input LOG --output recs.parquet
    python -m streamrec.score --engine ray --ray-address ray://head:10001 ...   # a running cluster

The driver reads the log with the local engine's reader (`streamrec.data.readers.read_interactions`), so
every user gets the same history, and hands Ray Data blocks of `--chunk-users` (user_id, history)
rows. `map_batches` runs `UserScorer`, a callable class: each of `--workers` replicas loads the
checkpoint once and scores its blocks with the local engine's code (`streamrec.score._score_users`),
so the rows are the same. Ray writes Parquet parts into a hidden folder beside OUTPUT; the driver
streams them into OUTPUT in one atomic rename, with the provenance in the schema metadata, and
deletes the folder. On a remote cluster that folder must be on storage the workers share. A failed
or interrupted run starts over (Ray retries failed tasks itself); `--shard I/N` works as in the
local engine. Rows come in block order, not input order: compare outputs as sets of rows.
"""

from __future__ import annotations

import argparse
import logging
import math
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from core.runtime.errors import InputError
from streamrec.data.interactions import Interactions

log = logging.getLogger(__name__)
EXPLAIN_COLUMNS = ("because_attention", "attention_weight", "because_occlusion", "occlusion_drop")


class UserScorer:
    """Scores blocks of (user_id, history) rows; Ray builds one per replica, so the model loads once per worker.

    Args:
        args: `python -m streamrec.score`'s parsed arguments.
    """

    def __init__(self, args: argparse.Namespace):
        from streamrec.api import Recommender

        torch.set_num_threads(max(1, math.floor(args.cpus_per_worker)))
        self.args = args
        self.rec = Recommender.load(args.ckpt, "cpu", items=args.items)

    def __call__(self, batch: pa.Table) -> pa.Table:
        from streamrec.api import length_batches
        from streamrec.score import _in_input_order, _score_users

        users = batch.column("user_id").to_pylist()
        histories = dict(zip(users, batch.column("history").to_pylist(), strict=True))
        counts = {"unknown_items": 0, "no_history": 0}
        tables = []
        for rows in length_batches([len(histories[u]) for u in users], self.args.batch_size):
            table = _score_users([users[i] for i in rows], histories, self.rec, self.args, counts)
            if table is not None:
                tables.append(table)
        if counts["no_history"]:
            log.warning("skipped %d users with no item known to the checkpoint", counts["no_history"])
        return _in_input_order(pa.concat_tables(tables), users) if tables else self._empty()

    def _empty(self) -> pa.Table:
        """No row, the columns of a scored block: Ray writes blocks of one schema."""
        from streamrec.ranking.predict import recommendation_table
        from streamrec.score import _with_titles

        none = torch.zeros(0, self.args.top_k, dtype=torch.long)
        extra = dict.fromkeys(EXPLAIN_COLUMNS, none) if self.args.explain else {}
        table = recommendation_table([], self.rec.vocab, none, none.float(), extra)
        return table if self.rec.catalog is None else _with_titles(table, self.rec)


def score_with_ray(args: argparse.Namespace, users: list[str], interactions: Interactions, output: Path) -> int:
    """Score `users` on Ray Data into `output` (the caller holds its lock); returns the rows written."""
    try:
        import ray
    except ImportError:
        raise InputError("--engine ray needs Ray Data: pip install -c constraints.txt -e '.[scale]'") from None
    from streamrec.score import write_tables

    if not users:
        raise InputError(f"{output}: no user to score (none of the listed users is in {args.input}); nothing written")
    parts = output.resolve().with_name(f".{output.name}.ray")  # hidden; removed at the end, or at the next run
    shutil.rmtree(parts, ignore_errors=True)
    started = not ray.is_initialized()
    if started:
        ray.init(address=args.ray_address, include_dashboard=False, log_to_driver=False, configure_logging=False,
                 **({} if args.ray_address else {"num_cpus": math.ceil(args.workers * args.cpus_per_worker) + 1}))
    try:
        ray.data.DataContext.get_current().enable_progress_bars = False
        blocks = [pa.table({"user_id": chunk, "history": [interactions.items[u] for u in chunk]},
                           schema=pa.schema([("user_id", pa.string()), ("history", pa.list_(pa.string()))]))
                  for chunk in (users[i : i + args.chunk_users] for i in range(0, len(users), args.chunk_users))]
        scored = ray.data.from_arrow(blocks).map_batches(
            UserScorer, fn_constructor_kwargs={"args": args}, batch_size=None, batch_format="pyarrow",
            concurrency=args.workers, num_cpus=args.cpus_per_worker)
        scored.write_parquet(str(parts))
        files = sorted(parts.glob("*.parquet"))
        return write_tables((t for t in (pq.read_table(f) for f in files) if t.num_rows), output, args.provenance)
    finally:
        shutil.rmtree(parts, ignore_errors=True)
        if started:
            ray.shutdown()
