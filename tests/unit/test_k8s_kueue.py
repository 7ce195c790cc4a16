"""Kueue objects: deploy/k8s/kueue.yaml against our kueue.x-k8s.io/v1beta2 JSON schema.

The schema (deploy/k8s/schemas/kueue-v1beta2.json) was written from Kueue's v1beta2 Go
types and CRDs; tests/fixtures/kueue/ holds objects it must reject, each with the errors
expected. With KUEUE_CRD_DIR set to a Kueue checkout's config/components/crd/bases, the
schema's field names are also compared with the CRDs' (for a Kueue upgrade).
"""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from trainyard import k8s
from trainyard.k8s import checks

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUEUE_YAML = DEPLOY / "k8s" / "kueue.yaml"
FIXTURES = ROOT / "tests" / "fixtures" / "kueue"
PROFILE = k8s.load_cluster_profile(DEPLOY / "cluster_profile.yaml")
SCHEMA = checks.kueue_schema()
KINDS = sorted(k for k in SCHEMA["$defs"] if k[:1].isupper())
KUEUE_DOCS = k8s.load_manifests(KUEUE_YAML.read_text(), str(KUEUE_YAML))


def _doc(kind: str, name: str | None = None) -> dict[str, Any]:
    for d in KUEUE_DOCS:
        if d["kind"] == kind and name in (None, d["metadata"]["name"]):
            return copy.deepcopy(d)
    raise AssertionError(f"no {kind}/{name} in {KUEUE_YAML}")


def test_schema_is_a_valid_json_schema_citing_its_source() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert checks.KUEUE_SCHEMA_PATH.is_file()
    assert SCHEMA["x-api-version"] == checks.KUEUE_API_VERSION == "kueue.x-k8s.io/v1beta2"
    assert re.fullmatch(r"v\d+\.\d+\.\d+", SCHEMA["x-kueue-version"])
    comment = SCHEMA["$comment"]
    assert SCHEMA["x-kueue-version"] in comment and "kubernetes-sigs/kueue" in comment
    assert "apis/kueue/v1beta2/" in comment and "config/components/crd/bases/" in comment
    assert {"ResourceFlavor", "ClusterQueue", "LocalQueue", "WorkloadPriorityClass"} <= set(KINDS)
    for kind in KINDS:
        props = SCHEMA["$defs"][kind]["properties"]
        assert props["apiVersion"] == {"const": checks.KUEUE_API_VERSION}, kind
        assert props["kind"] == {"const": kind}
        assert SCHEMA["$defs"][kind]["additionalProperties"] is False, kind


@pytest.mark.parametrize(
    "doc", KUEUE_DOCS, ids=[f"{d['kind']}/{d['metadata']['name']}" for d in KUEUE_DOCS]
)
def test_kueue_yaml_object_passes_schema(doc: dict[str, Any]) -> None:
    assert doc["apiVersion"] == checks.KUEUE_API_VERSION
    assert doc["kind"] in KINDS
    assert checks.kueue_errors(doc) == []
    assert k8s.validate_object(doc) == []


def test_kueue_yaml_has_every_kind_trainyard_needs() -> None:
    kinds = {d["kind"] for d in KUEUE_DOCS}
    assert kinds == {"ResourceFlavor", "ClusterQueue", "LocalQueue", "WorkloadPriorityClass"}
    for cq in (d for d in KUEUE_DOCS if d["kind"] == "ClusterQueue"):
        assert "cohort" not in cq["spec"] and cq["spec"]["cohortName"] == "trainyard"


def test_no_kueue_object_under_deploy_uses_another_version() -> None:
    """`grep -r v1beta1 deploy/` finds no Kueue object: every Kueue document is v1beta2."""
    found = []
    for path in sorted(DEPLOY.rglob("*.y*ml")):
        text = path.read_text()
        found += [
            f"{path.relative_to(ROOT)}: {m.group(0)}"
            for m in re.finditer(r"kueue\.x-k8s\.io/v1\w*", text)
            if m.group(0) != checks.KUEUE_API_VERSION
        ]
        for d in yaml.safe_load_all(text):
            if isinstance(d, dict) and str(d.get("apiVersion", "")).startswith("kueue.x-k8s.io"):
                assert d["apiVersion"] == checks.KUEUE_API_VERSION, path
    assert found == []


def _fixtures() -> list[Path]:
    return sorted(FIXTURES.glob("*.yaml"))


def test_fixtures_cover_the_required_negative_cases() -> None:
    names = {p.stem for p in _fixtures()}
    assert {
        "v1beta1-apiversion",
        "cohort-field",
        "missing-nominal-quota",
        "missing-wpc-value",
        "wrong-type-wpc-value",
        "wrong-type-node-labels",
        "wrong-type-quota",
        "bad-node-label-syntax",
    } <= names


@pytest.mark.parametrize("path", _fixtures(), ids=lambda p: p.stem)
def test_negative_fixture_fails_with_expected_errors(path: Path) -> None:
    text = path.read_text()
    expected = re.findall(r"^# expect: (.+)$", text, flags=re.MULTILINE)
    assert expected, f"{path.name}: no '# expect:' line"
    docs = k8s.load_manifests(text, str(path))
    assert len(docs) == 1
    errors = k8s.validate_object(docs[0])
    for needle in expected:
        assert any(needle in e for e in errors), f"{needle!r} not in {errors}"


@pytest.mark.parametrize(
    ("kind", "where"),
    [
        ("ClusterQueue", ()),
        ("ClusterQueue", ("metadata",)),
        ("ClusterQueue", ("spec",)),
        ("ClusterQueue", ("spec", "namespaceSelector")),
        ("ClusterQueue", ("spec", "preemption")),
        ("ClusterQueue", ("spec", "resourceGroups", 0)),
        ("ClusterQueue", ("spec", "resourceGroups", 0, "flavors", 0)),
        ("ClusterQueue", ("spec", "resourceGroups", 0, "flavors", 0, "resources", 0)),
        ("ResourceFlavor", ("spec",)),
        ("ResourceFlavor", ("spec", "tolerations", 0)),
        ("LocalQueue", ("spec",)),
        ("WorkloadPriorityClass", ()),
    ],
    ids=lambda v: ".".join(map(str, v)) if isinstance(v, tuple) else v,
)
def test_unknown_field_is_rejected(kind: str, where: tuple[str | int, ...]) -> None:
    doc = _doc(kind)
    target: Any = doc
    for key in where:
        target = target[key]
    target["bogusField"] = "x"
    errors = k8s.validate_object(doc)
    assert any("'bogusField' was unexpected" in e for e in errors), errors


def test_cohort_object_is_validated() -> None:
    cohort = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Cohort",
        "metadata": {"name": "trainyard"},
        "spec": {"parentName": "org", "fairSharing": {"weight": 2}},
    }
    assert k8s.validate_object(cohort) == []
    cohort["spec"]["parent"] = "org"
    assert any("'parent' was unexpected" in e for e in k8s.validate_object(cohort))


def test_other_kueue_versions_are_errors() -> None:
    for version in ("v1beta1", "v1alpha1", "v1"):
        doc = _doc("LocalQueue")
        doc["apiVersion"] = f"kueue.x-k8s.io/{version}"
        [error] = k8s.validate_object(doc)
        assert f"apiVersion 'kueue.x-k8s.io/{version}' is not supported" in error


def test_job_kueue_labels_are_current_and_name_objects_in_kueue_yaml() -> None:
    # pkg/controller/constants/constants.go (Kueue v0.19.2): QueueLabel,
    # WorkloadPriorityClassLabel; the queue-name *annotation* is the deprecated form.
    assert k8s.KUEUE_QUEUE_LABEL == "kueue.x-k8s.io/queue-name"
    assert k8s.KUEUE_PRIORITY_LABEL == "kueue.x-k8s.io/priority-class"
    queues = {
        (d["metadata"]["namespace"], d["metadata"]["name"])
        for d in KUEUE_DOCS
        if d["kind"] == "LocalQueue"
    }
    wpcs = {d["metadata"]["name"] for d in KUEUE_DOCS if d["kind"] == "WorkloadPriorityClass"}
    for tier in PROFILE.tiers:
        labels = k8s.placement_for_tier(PROFILE, tier, kueue=True).labels
        assert set(labels) == {k8s.KUEUE_QUEUE_LABEL, k8s.KUEUE_PRIORITY_LABEL}
        assert (PROFILE.namespace, labels[k8s.KUEUE_QUEUE_LABEL]) in queues
        assert labels[k8s.KUEUE_PRIORITY_LABEL] in wpcs


def _crd_fields(schema: dict[str, Any], path: str = "") -> dict[str, set[str]]:
    """Property names at each object level of an openAPIV3Schema (or of our schema)."""
    out: dict[str, set[str]] = {}
    if "$ref" in schema:
        name = schema["$ref"].removeprefix("#/$defs/")
        schema = {**SCHEMA["$defs"][name], **{k: v for k, v in schema.items() if k != "$ref"}}
    props = schema.get("properties")
    if isinstance(props, dict):
        out[path] = set(props)
        for key, sub in props.items():
            if isinstance(sub, dict):
                out.update(_crd_fields(sub, f"{path}.{key}"))
    items = schema.get("items")
    if isinstance(items, dict):
        out.update(_crd_fields(items, f"{path}[]"))
    return out


@pytest.mark.skipif(
    not os.environ.get("KUEUE_CRD_DIR"),
    reason="set KUEUE_CRD_DIR to Kueue's config/components/crd/bases to compare field names",
)
@pytest.mark.parametrize("kind", KINDS)
def test_schema_field_names_match_kueue_crd(kind: str) -> None:
    crd_dir = Path(os.environ["KUEUE_CRD_DIR"])
    for path in crd_dir.glob("kueue.x-k8s.io_*.yaml"):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["kind"] == kind:
            break
    else:
        pytest.fail(f"no CRD for {kind} in {crd_dir}")
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1beta2"]
    theirs = _crd_fields(version["schema"]["openAPIV3Schema"])
    ours = _crd_fields(SCHEMA["$defs"][kind])
    for level, names in ours.items():
        if level.startswith(".metadata") or level not in theirs:
            continue
        assert names == theirs[level], f"{kind}{level}: ours {names}, Kueue's {theirs[level]}"
    missing = {lvl for lvl in theirs if not lvl.startswith(".status")} - set(ours)
    assert not {lvl for lvl in missing if not lvl.startswith(".metadata")}, json.dumps(
        sorted(missing)
    )
