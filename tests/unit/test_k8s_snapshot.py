"""CSI VolumeSnapshot of a dataset's PVC: builder, names, schema, and the pipeline option."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainyard import k8s
from trainyard.config import parse_pipeline
from trainyard.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
PROFILE_PATH = ROOT / "deploy" / "cluster_profile.yaml"
SNAP = "88fa3acafa0854bd"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@pytest.fixture(scope="module")
def profile() -> k8s.ClusterProfile:
    return k8s.load_cluster_profile(PROFILE_PATH)


def _with_class(profile: k8s.ClusterProfile, cls: str | None) -> k8s.ClusterProfile:
    storage = profile.storage.model_copy(update={"volume_snapshot_class": cls})
    return profile.model_copy(update={"storage": storage})


# ----------------------------------------------------------------------------- builder


def test_volume_snapshot_of_a_dataset_pvc(profile: k8s.ClusterProfile) -> None:
    body = k8s.volume_snapshot(profile, "hand_digits", SNAP, "csi-snap")
    assert body == {
        "apiVersion": "snapshot.storage.k8s.io/v1",
        "kind": "VolumeSnapshot",
        "metadata": {
            "name": f"trainyard-data-hand-digits-{SNAP}",
            "namespace": "trainyard",
            "labels": {
                "app.kubernetes.io/name": "trainyard",
                "app.kubernetes.io/component": "dataset-snapshot",
                "trainyard.io/dataset": "hand-digits",
                "trainyard.io/snapshot": SNAP,
            },
        },
        "spec": {
            "volumeSnapshotClassName": "csi-snap",
            "source": {"persistentVolumeClaimName": "trainyard-data-hand-digits"},
        },
    }
    pvc = k8s.dataset_pvc(profile, "hand_digits")
    assert body["spec"]["source"]["persistentVolumeClaimName"] == pvc.metadata.name
    assert body["metadata"]["namespace"] == pvc.metadata.namespace
    assert body["metadata"]["labels"][k8s.DATASET_LABEL] == pvc.metadata.labels[k8s.DATASET_LABEL]
    assert k8s.validate_object(body) == []


def test_snapshot_class_from_the_pipeline_else_the_profile(profile: k8s.ClusterProfile) -> None:
    assert profile.storage.volume_snapshot_class is None
    with pytest.raises(ConfigError, match=r"staging\.volume_snapshot_class"):
        k8s.volume_snapshot(profile, "digits", SNAP)
    on = _with_class(profile, "profile-snap")
    assert k8s.volume_snapshot(on, "digits", SNAP)["spec"]["volumeSnapshotClassName"] == (
        "profile-snap"
    )
    body = k8s.volume_snapshot(on, "digits", SNAP, "pipeline-snap")
    assert body["spec"]["volumeSnapshotClassName"] == "pipeline-snap"


NAME_CASES = [
    # (case, dataset, snapshot id, the name or None when it must be cut and hashed)
    ("short", "digits", SNAP, f"trainyard-data-digits-{SNAP}"),
    ("underscores", "hand_digits", SNAP, f"trainyard-data-hand-digits-{SNAP}"),
    ("longest that fits", "d" * 31, SNAP, f"trainyard-data-{'d' * 31}-{SNAP}"),
    ("one too long", "d" * 32, SNAP, None),
    ("longest dataset name", "d" * 63, SNAP, None),
    ("long id", "digits", "f" * 80, None),
    ("id not a label", "digits", "Run:2026/11/01", None),
]


@pytest.mark.parametrize(
    ("dataset", "snapshot_id", "expected"),
    [c[1:] for c in NAME_CASES],
    ids=[c[0] for c in NAME_CASES],
)
def test_names_are_dns_labels_and_deterministic(
    profile: k8s.ClusterProfile, dataset: str, snapshot_id: str, expected: str | None
) -> None:
    name = k8s.volume_snapshot_name(dataset, snapshot_id)
    assert len(name) <= 63 and DNS_LABEL.match(name), name
    assert name == k8s.volume_snapshot_name(dataset, snapshot_id)
    if expected is not None:
        assert name == expected
    else:
        assert re.fullmatch(r"trainyard-data-[-a-z0-9]+-[0-9a-f]{8}", name), name
    body = k8s.volume_snapshot(profile, dataset, snapshot_id, "csi-snap")
    assert body["metadata"]["name"] == name
    for key, value in body["metadata"]["labels"].items():
        assert len(value) <= 63 and LABEL_VALUE.match(value), (key, value)
    assert k8s.validate_object(body) == []


def test_cut_names_stay_distinct() -> None:
    """Datasets or ids that share a long head still get different names."""
    datasets = ["x" * 60 + "_a", "x" * 60 + "_b"]
    ids = [SNAP, "f" * 79 + "0", "f" * 79 + "1"]
    names = {k8s.volume_snapshot_name(d, s) for d in datasets for s in ids}
    assert len(names) == len(datasets) * len(ids)


# ------------------------------------------------------------------------------ schema


def _pop(*path: str) -> Callable[[dict[str, Any]], None]:
    def mutate(body: dict[str, Any]) -> None:
        node = body
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]

    return mutate


def _set(value: Any, *path: str) -> Callable[[dict[str, Any]], None]:
    def mutate(body: dict[str, Any]) -> None:
        node = body
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return mutate


SCHEMA_ERRORS = [
    ("no spec", _pop("spec"), "<root>: 'spec' is a required property"),
    ("no source", _pop("spec", "source"), "spec: 'source' is a required property"),
    (
        "neither source",
        _pop("spec", "source", "persistentVolumeClaimName"),
        "spec.source: set exactly one of persistentVolumeClaimName, volumeSnapshotContentName",
    ),
    (
        "both sources",
        _set("snapcontent-1", "spec", "source", "volumeSnapshotContentName"),
        "spec.source: set exactly one of persistentVolumeClaimName, volumeSnapshotContentName",
    ),
    ("empty class", _set("", "spec", "volumeSnapshotClassName"), "spec.volumeSnapshotClassName"),
    ("unknown spec field", _set("Retain", "spec", "deletionPolicy"), "spec: Additional prop"),
    ("pvc name not a string", _set(7, "spec", "source", "persistentVolumeClaimName"), "not of"),
    ("wrong version", _set("snapshot.storage.k8s.io/v2", "apiVersion"), "no schema"),
    ("name not dns", _set("Digits_Snap", "metadata", "name"), "metadata.name"),
    (
        "label value too long",
        _set("a" * 64, "metadata", "labels", "trainyard.io/snapshot"),
        "metadata.labels.trainyard.io/snapshot",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [c[1:] for c in SCHEMA_ERRORS],
    ids=[c[0] for c in SCHEMA_ERRORS],
)
def test_broken_volume_snapshots_are_flagged(
    profile: k8s.ClusterProfile, mutate: Callable[[dict[str, Any]], None], needle: str
) -> None:
    body = k8s.volume_snapshot(profile, "digits", SNAP, "csi-snap")
    mutate(body)
    errors = k8s.validate_object(body)
    assert len(errors) == 1, errors
    assert errors[0].startswith("VolumeSnapshot/")
    assert needle in errors[0]


def test_volume_snapshot_schema_accepts_upstream_forms(profile: k8s.ClusterProfile) -> None:
    """A pre-provisioned snapshot (content source, default class) and one read back."""
    body = k8s.volume_snapshot(profile, "digits", SNAP, "csi-snap")
    static = copy.deepcopy(body)
    static["spec"] = {"source": {"volumeSnapshotContentName": "snapcontent-1"}}
    read_back = copy.deepcopy(body)
    read_back["status"] = {"readyToUse": True, "restoreSize": "10Gi"}
    assert k8s.validate_object(static) == []
    assert k8s.validate_object(read_back) == []
    assert k8s.schema_errors(body, k8s.VOLUME_SNAPSHOT_SCHEMA) == []


# ------------------------------------------------------------------- pipeline option


def test_the_option_is_off_by_default() -> None:
    for path in sorted((ROOT / "dags" / "pipelines").glob("*.yaml")):
        staging = parse_pipeline(path).staging
        assert staging.volume_snapshot_class is None, path
        assert staging.volume_snapshot_timeout_s == 1800


CLASS_CASES = [
    ("label", "csi-snap", None),
    ("subdomain", "csi-hostpath.snapshot.example.com", None),
    ("uppercase", "CSI-Snap", "not a DNS-1123 subdomain"),
    ("underscore", "csi_snap", "not a DNS-1123 subdomain"),
    ("leading dash", "-snap", "not a DNS-1123 subdomain"),
    ("trailing dot", "snap.", "not a DNS-1123 subdomain"),
    ("empty", "", "not a DNS-1123 subdomain"),
    ("too long", "a" * 254, "not a DNS-1123 subdomain"),
    ("not a string", 7, "string"),
]


@pytest.mark.parametrize(
    ("value", "error"), [c[1:] for c in CLASS_CASES], ids=[c[0] for c in CLASS_CASES]
)
def test_pipeline_snapshot_class_is_a_dns_subdomain(
    tmp_path: Path, value: Any, error: str | None
) -> None:
    raw = yaml.safe_load((ROOT / "dags" / "pipelines" / "digits.yaml").read_text())
    raw["staging"]["volume_snapshot_class"] = value
    f = tmp_path / "digits.yaml"
    f.write_text(yaml.safe_dump(raw))
    if error is None:
        assert parse_pipeline(f).staging.volume_snapshot_class == value
        return
    with pytest.raises(ConfigError) as e:
        parse_pipeline(f)
    message = str(e.value)
    assert str(f) in message
    assert "staging.volume_snapshot_class" in message
    assert error in message


def test_snapshot_timeout_must_be_positive(tmp_path: Path) -> None:
    raw = yaml.safe_load((ROOT / "dags" / "pipelines" / "digits.yaml").read_text())
    raw["staging"].update(volume_snapshot_class="csi-snap", volume_snapshot_timeout_s=0)
    f = tmp_path / "digits.yaml"
    f.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"staging\.volume_snapshot_timeout_s"):
        parse_pipeline(f)
