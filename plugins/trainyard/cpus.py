"""How many cores this process may use: its CPU affinity, capped by its cgroup's CPU quota.

A container limited to two CPUs by Kubernetes still sees every core of its node in its
affinity mask; sizing thread pools by the mask alone would run dozens of threads on a
budget of two.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_cpu_quota(root: Path = CGROUP_ROOT) -> float | None:
    """The CPUs the cgroup quota allows (cgroup v2 ``cpu.max``, else v1 CFS), or None.

    None when there is no quota (``max``, ``-1``) or no readable cgroup file.
    """
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        if quota == "max":
            return None
        return int(quota) / int(period) if int(period) > 0 else None
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def usable_cores(root: Path = CGROUP_ROOT) -> int:
    """Cores in the affinity mask, at most the cgroup quota rounded up; at least 1."""
    if hasattr(os, "sched_getaffinity"):
        cores = len(os.sched_getaffinity(0))
    else:
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_quota(root)
    if quota is not None:
        cores = min(cores, math.ceil(quota))
    return max(1, cores)
