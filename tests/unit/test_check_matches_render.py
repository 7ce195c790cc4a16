"""``pipelines check`` refuses what ``render`` refuses, with the file, line and field.

A new user's pipeline passed the check (exit 0) and then failed to render (exit 3): an
unknown priority tier, a parameter-server strategy without parameter servers, more GPUs
than any node of the tier has.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainyard.cli import main

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "deploy" / "cluster_profile.yaml"
DIGITS = yaml.safe_load((ROOT / "dags" / "pipelines" / "digits.yaml").read_text())


def _profile(tmp_path: Path, gpus_per_node: int | None = None, tier: str | None = None) -> Path:
    raw = yaml.safe_load(PROFILE.read_text())
    if gpus_per_node is not None:
        for pool in raw["gpu_pools"]:
            pool["gpus_per_node"] = gpus_per_node
    if tier is not None:
        raw["tiers"][tier] = copy.deepcopy(raw["tiers"]["high"])
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _pipeline(tmp_path: Path, **training: Any) -> Path:
    raw = copy.deepcopy(DIGITS)
    raw["training"] = {**raw["training"], **training}
    folder = tmp_path / "pipelines"
    folder.mkdir(exist_ok=True)
    path = folder / "digits.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


CASES = [
    ("unknown tier", {"priority": "urgent"}, None,
     "training.priority: unknown priority tier 'urgent' (known: high, low)"),
    ("tier names are case-sensitive", {"priority": "High"}, None,
     "training.priority: unknown priority tier 'High' (known: high, low)"),
    ("a tier the profile lacks", {"priority": "medium"}, None,
     "training.priority: unknown priority tier 'medium'"),
    ("no parameter server", {"strategy": "parameter_server", "parameter_servers": 0}, None,
     "training.parameter_servers: 0: the parameter_server strategy needs at least 1"),
    ("GPUs beyond any pod", {"gpus_per_worker": 1000}, None,
     "training.gpus_per_worker: Input should be less than or equal to 16"),
    ("GPUs beyond the tier's nodes", {"gpus_per_worker": 12}, 8,
     "training.gpus_per_worker: 12 GPUs per pod, but the largest node of tier 'high' "
     "(pools h100, a100) has 8"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("training", "gpus_per_node", "needle"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_check_refuses_what_render_refuses(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    training: dict[str, Any],
    gpus_per_node: int | None,
    needle: str,
) -> None:
    path = _pipeline(tmp_path, **training)
    profile = _profile(tmp_path, gpus_per_node)
    monkeypatch.setenv("TRAINYARD_PIPELINES_DIR", str(path.parent))

    assert main(["pipelines", "check", "--profile", str(profile), str(path)]) == 1
    err = capsys.readouterr().err
    assert needle in err, err
    assert f"{path}:" in err and err.count("FAIL") == 1

    argv = ["render", "digits", "--step", "train", "--snapshot", "s1", "--profile", str(profile)]
    assert main(argv) == 3
    assert needle.split(": ", 1)[1].split(" (")[0] in capsys.readouterr().err


def test_check_uses_the_profile_render_uses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _pipeline(tmp_path, priority="urgent")
    monkeypatch.setenv("TRAINYARD_PIPELINES_DIR", str(path.parent))
    monkeypatch.setenv("TRAINYARD_CLUSTER_PROFILE", str(_profile(tmp_path, tier="urgent")))
    assert main(["pipelines", "check", str(path)]) == 0
    assert main(["render", "digits", "--step", "train", "--snapshot", "s1"]) == 0
    capsys.readouterr()
    # --profile wins over the environment, as for render
    assert main(["pipelines", "check", "--profile", str(PROFILE), str(path)]) == 1
    assert "unknown priority tier 'urgent'" in capsys.readouterr().err


def test_check_reports_a_profile_that_does_not_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "profile.yaml"
    bad.write_text("namespace: trainyard\n")
    assert main(["pipelines", "check", "--profile", str(bad), str(_pipeline(tmp_path))]) == 1
    assert f"{bad}: invalid cluster profile" in capsys.readouterr().err
