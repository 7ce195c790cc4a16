"""Training waits in one pool per GPU tier on a cluster, in one pool on a laptop."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "deploy" / "cluster_profile.yaml"


def _train_pool(runner: str, priority: str, tmp_path: Path) -> str:
    from trainyard.config import parse_pipeline
    from trainyard.orchestration.graph import build_dag
    from trainyard.settings import get_settings

    cfg = parse_pipeline(ROOT / "dags" / "pipelines" / "digits.yaml")
    cfg = cfg.model_copy(
        update={"training": cfg.training.model_copy(update={"priority": priority})}
    )
    settings = dataclasses.replace(get_settings(), runner=runner, volume_root=tmp_path)
    return build_dag(cfg, settings).get_task("train").pool


@pytest.mark.parametrize(
    ("runner", "priority", "pool"),
    [
        ("local", "high", "trainyard_training"),
        ("local", "low", "trainyard_training"),
        ("kubernetes", "high", "trainyard_training_high"),
        ("kubernetes", "low", "trainyard_training_low"),
    ],
)
def test_training_pool_per_tier_on_a_cluster(runner, priority, pool, tmp_path: Path) -> None:
    assert _train_pool(runner, priority, tmp_path) == pool


def _pools(*args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "trainyard", "pools", *args],
        capture_output=True,
        text=True,
        check=True,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT / "plugins")},
    )
    return json.loads(out.stdout)


def test_pools_file_sizes_each_tier_from_the_profile() -> None:
    from trainyard.k8s import load_cluster_profile

    profile = load_cluster_profile(PROFILE)
    pools = _pools("--runner", "kubernetes", "--profile", str(PROFILE))
    assert pools == {
        f"trainyard_training_{name}": {
            "slots": tier.training_slots,
            "description": f"trainings of tier {name} on GPU pools {', '.join(tier.pools)}",
            "include_deferred": False,
        }
        for name, tier in profile.tiers.items()
    }
    assert {p["slots"] for p in pools.values()} == {2, 4}  # as deploy/cluster_profile.yaml says
    assert _pools("--runner", "local") == {
        "trainyard_training": {
            "slots": 1,
            "description": "one distributed training at a time on this machine",
            "include_deferred": False,
        }
    }


def test_training_slots_must_be_positive() -> None:
    import yaml

    from trainyard.errors import ConfigError
    from trainyard.k8s.profile import parse_cluster_profile

    raw = yaml.safe_load(PROFILE.read_text())
    raw["tiers"]["low"]["training_slots"] = 0
    with pytest.raises((ConfigError, ValueError), match="training_slots"):
        parse_cluster_profile(raw, "profile.yaml")
