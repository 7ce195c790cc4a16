"""``python -m trainyard check-manifests``: the cluster's manifests against schemas and profile."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainyard.cli import main as cli

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "deploy" / "k8s"
PROFILE = ROOT / "deploy" / "cluster_profile.yaml"


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    """A copy of deploy/k8s's YAML files to break."""
    folder = tmp_path / "k8s"
    folder.mkdir()
    for path in MANIFESTS.glob("*.yaml"):
        shutil.copy(path, folder / path.name)
    return folder


def _edit(path: Path, change: Callable[[list[dict[str, Any]]], None]) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    change(docs)
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))


def _one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def test_the_shipped_manifests_agree_with_the_shipped_profile(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli(["check-manifests", "--profile", str(PROFILE), str(MANIFESTS)]) == 0
    assert capsys.readouterr().out.startswith("ok: 20 object(s) in 5 file(s) are valid")


def _swap_flavors(docs: list[dict[str, Any]]) -> None:
    flavors = _one(docs, "ClusterQueue", "trainyard-high")["spec"]["resourceGroups"][0]["flavors"]
    flavors.reverse()


def _namespace_baseline(docs: list[dict[str, Any]]) -> None:
    labels = docs[0]["metadata"]["labels"]
    labels["pod-security.kubernetes.io/enforce"] = "baseline"


@pytest.mark.parametrize(
    ("file", "change", "needle"),
    [
        (
            "priorityclasses.yaml",
            lambda docs: docs.pop(0),
            "profile: PriorityClass trainyard-high: missing (tier high)",
        ),
        (
            "kueue.yaml",
            _swap_flavors,
            "profile: ClusterQueue trainyard-high: flavors ['a100', 'h100'] are not tier "
            "high's pools in order ['h100', 'a100']",
        ),
        (
            "kueue.yaml",
            lambda docs: _one(docs, "LocalQueue", "trainyard-low")["metadata"].update(
                namespace="default"
            ),
            "profile: LocalQueue trainyard-low: namespace 'default' is not the profile's "
            "'trainyard'",
        ),
        (
            "kueue.yaml",
            lambda docs: _one(docs, "ResourceFlavor", "t4")["spec"].update(
                nodeLabels={"nvidia.com/gpu.product": "Tesla-T4-16GB"}
            ),
            "profile: ResourceFlavor t4: nodeLabels",
        ),
        (
            "namespace.yaml",
            _namespace_baseline,
            "label pod-security.kubernetes.io/enforce is not 'restricted'",
        ),
        (
            "rbac.yaml",
            lambda docs: next(d for d in docs if d["kind"] == "Role")["rules"][0].update(
                verbs="get"
            ),
            "rbac.yaml: Role/",
        ),
    ],
    ids=["priority class", "flavor order", "queue namespace", "flavor labels", "pss", "schema"],
)
def test_each_disagreement_is_named(
    manifests: Path,
    capsys: pytest.CaptureFixture[str],
    file: str,
    change: Callable[[list[dict[str, Any]]], None],
    needle: str,
) -> None:
    _edit(manifests / file, change)
    assert cli(["check-manifests", "--profile", str(PROFILE), str(manifests)]) == 3
    out = capsys.readouterr()
    assert needle in out.out, out.out
    assert "check-manifests: 1 error(s)" in out.err


def test_a_profile_of_ones_own_lists_what_to_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = yaml.safe_load(PROFILE.read_text())
    profile["namespace"] = "ml-train"
    profile["tiers"]["high"]["priority_class"] = "ml-urgent"
    mine = tmp_path / "profile.yaml"
    mine.write_text(yaml.safe_dump(profile))
    assert cli(["check-manifests", "--profile", str(mine), str(MANIFESTS)]) == 3
    out = capsys.readouterr().out
    assert "profile: Namespace ml-train: missing (the profile's namespace)" in out
    assert "profile: PriorityClass ml-urgent: missing (tier high)" in out
    assert "profile: LocalQueue trainyard-high: namespace 'trainyard' is not the profile's" in out


def test_paths_that_hold_no_manifest_are_one_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(["check-manifests", str(tmp_path / "nope")]) == 3
    assert f"{tmp_path / 'nope'}: no such file or folder" in capsys.readouterr().err
    assert cli(["check-manifests", str(tmp_path)]) == 3
    assert "no *.yaml or *.yml file in this folder" in capsys.readouterr().err
    (tmp_path / "bad.yaml").write_text("kind: [unclosed\n")
    assert cli(["check-manifests", str(tmp_path / "bad.yaml")]) == 3
    assert "bad.yaml: not valid YAML" in capsys.readouterr().err
