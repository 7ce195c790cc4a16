"""Cores a process may use: affinity capped by the cgroup CPU quota (v2 and v1 files)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainyard.cpus import cgroup_cpu_quota, usable_cores
from trainyard.serving import server

AFFINITY = len(os.sched_getaffinity(0))


def _v2(root: Path, text: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cpu.max").write_text(text)
    return root


def _v1(root: Path, quota: str, period: str) -> Path:
    (root / "cpu").mkdir(parents=True, exist_ok=True)
    (root / "cpu" / "cpu.cfs_quota_us").write_text(quota)
    (root / "cpu" / "cpu.cfs_period_us").write_text(period)
    return root


@pytest.mark.parametrize(
    ("text", "quota"),
    [("max 100000\n", None), ("150000 100000\n", 1.5), ("50000 100000\n", 0.5), ("junk", None)],
)
def test_cgroup_v2_quota(tmp_path: Path, text: str, quota: float | None) -> None:
    assert cgroup_cpu_quota(_v2(tmp_path, text)) == quota


@pytest.mark.parametrize(
    ("quota_us", "period_us", "quota"),
    [("-1", "100000", None), ("250000", "100000", 2.5), ("100000", "0", None)],
)
def test_cgroup_v1_quota(tmp_path: Path, quota_us: str, period_us: str, quota: float | None):
    assert cgroup_cpu_quota(_v1(tmp_path, quota_us, period_us)) == quota


def test_no_cgroup_files_means_the_affinity_mask(tmp_path: Path) -> None:
    assert cgroup_cpu_quota(tmp_path) is None
    assert usable_cores(tmp_path) == AFFINITY


def test_a_quota_caps_the_affinity_mask_rounded_up(tmp_path: Path) -> None:
    assert usable_cores(_v2(tmp_path / "half", "50000 100000")) == 1
    assert usable_cores(_v2(tmp_path / "a-lot", "6400000 100000")) == AFFINITY
    if AFFINITY >= 2:
        assert usable_cores(_v1(tmp_path / "v1", "150000", "100000")) == 2


def test_serve_sizes_its_pools_by_the_usable_cores() -> None:
    """Defaults: 1 model call and 1 op thread per usable core; given values win."""
    assert server.pool_sizes(None, None, 3) == (3, 3)
    assert server.pool_sizes(1, 0, 3) == (1, 0)
