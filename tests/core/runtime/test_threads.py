"""The one `threads` setting: its default counts the CPUs this process may use, not the host's cores."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from core.runtime.threads import available_cpus, cgroup_cpu_limit, set_threads


def _cgroup(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


@pytest.mark.parametrize(("files", "limit"), [
    ({"cpu.max": "max 100000\n"}, None),
    ({"cpu.max": "150000 100000\n"}, 1.5),
    ({"cpu.max": "50000 100000\n"}, 0.5),
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    ({"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 3.0),
    ({}, None),
])
def test_the_cgroup_quota_is_read_as_cpus(tmp_path, files, limit) -> None:
    assert cgroup_cpu_limit(_cgroup(tmp_path, files)) == limit


def test_the_default_is_the_affinity_capped_by_the_quota_rounded_up(tmp_path) -> None:
    affinity = len(os.sched_getaffinity(0))
    assert available_cpus(_cgroup(tmp_path, {"cpu.max": "max 100000"})) == affinity
    assert available_cpus(_cgroup(tmp_path, {"cpu.max": "50000 100000"})) == 1  # half a CPU still computes
    assert available_cpus(_cgroup(tmp_path, {"cpu.max": f"{100000 * (affinity + 4)} 100000"})) == affinity


def test_set_threads_sets_torch_and_refuses_less_than_one(monkeypatch) -> None:
    before = torch.get_num_threads()
    try:
        assert set_threads(1) == 1 and torch.get_num_threads() == 1
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        assert set_threads() == available_cpus() == torch.get_num_threads()
        monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the environment's count is the default where it is set
        assert set_threads() == 1 == torch.get_num_threads()
        for wrong in (0, -2, True, 1.5):
            with pytest.raises(ValueError, match="`--threads` must be a whole number >= 1"):
                set_threads(wrong)
    finally:
        torch.set_num_threads(before)
