"""Batch translation on Ray: `python -m translate.infer --engine ray --workers N` (needs the `scale` extra).

The driver reads and checks the input with the local engine's reader (the same line checks, naming the same lines) and
hands its chunks to N actors, each loading the checkpoints once; it writes their translations itself, in input order. At
most two chunks per worker are in flight, so neither the driver's nor a worker's memory grows with the file. Ray Data's
text reader is not used: it would drop the line numbers the checks name, and its own line splitting is not the one every
other program of this package uses."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence

import torch

from core.runtime.ray_session import RayCluster, import_ray, ray_instance
from translate.api import Translator
from translate.search.options import SearchOptions


class ChunkTranslator:
    """One replica: loads the model once, then turns chunks of lines into their output text."""

    def __init__(self, ckpts: Sequence[str], device: str, dtype: str, threads: int, options: SearchOptions):
        torch.set_num_threads(threads)
        self.translator, self.options = Translator.load(list(ckpts), device, dtype), options

    def run(self, first: int, lines: list[str]) -> tuple[str, int]:
        """The output lines of `lines` and how many of them were truncated to the model's length."""
        warned = [0]
        return self.translator.translate_chunk(lines, self.options, first, warned)[0], warned[0]


def translate_on_ray(runs: Iterable[tuple[int, list[str]]], ckpts: Sequence[str], device: str, dtype: str,
                     options: SearchOptions, cluster: RayCluster, warned: list[int],
                     ) -> Iterator[tuple[int, list[str], str, None]]:
    """(first line, lines, their output text, None: no alignments) per run of `runs`, in order; `warned` counts
    the lines the workers truncated."""
    ray = import_ray()
    with ray_instance(ray, cluster):
        actor = ray.remote(num_cpus=cluster.cpus_per_worker)(ChunkTranslator)
        workers = [actor.remote(ckpts, device, dtype, cluster.threads, options) for _ in range(cluster.workers)]
        pending: deque = deque()
        for k, (first, lines) in enumerate(runs):
            pending.append((first, lines, workers[k % len(workers)].run.remote(first, lines)))
            if len(pending) >= 2 * len(workers):
                yield _collect(ray, *pending.popleft(), warned)
        while pending:
            yield _collect(ray, *pending.popleft(), warned)


def _collect(ray, first: int, lines: list[str], done, warned: list[int]) -> tuple[int, list[str], str, None]:
    text, truncated = ray.get(done)
    warned[0] += truncated
    return first, lines, text, None
