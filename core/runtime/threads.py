"""How many CPU threads a program computes with: the CPUs this process may use, or what the user set.

torch starts with one thread per core of the host. Under a lower CPU quota, a pinned affinity or cores
another job keeps busy, every matmul then waits on its slowest thread. So the default counts the CPUs this
process may use (its affinity mask, capped by the cgroup's quota), and `OMP_NUM_THREADS`, where set, wins."""

from __future__ import annotations

import math
import os
from contextlib import suppress
from pathlib import Path

import torch

CGROUP = Path("/sys/fs/cgroup")


def cgroup_cpu_limit(root: Path = CGROUP) -> float | None:
    """The CPUs the cgroup's quota allows (quota / period), or None without a quota: cgroup v2's cpu.max holds
    "QUOTA PERIOD" (or "max PERIOD"), v1's cpu.cfs_quota_us (-1: none) and cpu.cfs_period_us."""
    with suppress(OSError, ValueError, IndexError):
        text = (root / "cpu.max").read_text().split()
        if text:
            return None if text[0] == "max" else int(text[0]) / int(text[1])
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def available_cpus(root: Path = CGROUP) -> int:
    """The CPUs this process may use: its affinity mask, capped by the cgroup quota (rounded up), at least 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cpus = os.cpu_count() or 1
    if (limit := cgroup_cpu_limit(root)) is not None:
        cpus = min(cpus, math.ceil(limit))
    return max(1, cpus)


def check_threads(threads: int | None, name: str = "--threads") -> None:
    """Refuse a thread count below 1 (None is the default: `available_cpus`)."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"`{name}` must be a whole number >= 1 (or unset: the CPUs this process may use), "
                         f"got {threads!r}")


def default_threads() -> int:
    """`OMP_NUM_THREADS` where the environment sets it (torch's rule, which schedulers use), else `available_cpus()`."""
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(env) if env.isdigit() and int(env) > 0 else available_cpus()


def set_threads(threads: int | None = None) -> int:
    """Compute with `threads` torch threads (None: `default_threads()`); returns the count. The pool is touched
    only when the count changes: a forked DDP worker inherits a pool it cannot use."""
    check_threads(threads)
    count = default_threads() if threads is None else threads
    if count != torch.get_num_threads():
        torch.set_num_threads(count)
    return count
