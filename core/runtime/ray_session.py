"""The Ray instance a program's `--engine ray` runs on: a user's own is reused, one it starts is shut down."""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType

from core.runtime.errors import InputError


@dataclass(frozen=True)
class RayCluster:
    """Model replicas, the CPUs each reserves (also its torch threads), a running cluster's address (None: start
    a local one with just the CPUs the workers reserve)."""

    workers: int = 2
    cpus_per_worker: float = 1.0
    address: str | None = None

    @property
    def threads(self) -> int:
        return max(1, math.floor(self.cpus_per_worker))


def add_ray_arguments(p: argparse.ArgumentParser, engine_help: str) -> None:
    """The same --engine, --workers, --cpus-per-worker and --ray-address in every program that scales out."""
    p.add_argument("--engine", choices=("local", "ray"), default="local", help=engine_help)
    p.add_argument("--workers", type=int, default=2, help="--engine ray: model replicas (default 2)")
    p.add_argument("--cpus-per-worker", type=float, default=1.0,
                   help="--engine ray: CPUs each replica reserves, also its torch threads (default 1)")
    p.add_argument("--ray-address", help="--engine ray: a running cluster (default: start a local one)")


def import_ray() -> ModuleType:
    try:
        import ray  # an optional extra
    except ImportError:
        raise InputError("--engine ray needs Ray: pip install -c constraints.txt -e '.[scale]'") from None
    return ray


@contextmanager
def ray_instance(ray: ModuleType, cluster: RayCluster) -> Iterator[None]:
    started = not ray.is_initialized()
    if started:
        cpus = math.ceil(cluster.workers * cluster.cpus_per_worker) + 1
        ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False, configure_logging=False,
                 **({} if cluster.address else {"num_cpus": cpus}))
    try:
        yield
    finally:
        if started:
            ray.shutdown()
