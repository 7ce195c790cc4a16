"""deploy/k8s/*.yaml: schema (Kubernetes 1.33), Pod Security, and agreement with the profile."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from trainyard import k8s

ROOT = Path(__file__).resolve().parents[2]
MANIFEST_DIR = ROOT / "deploy" / "k8s"
PROFILE = k8s.load_cluster_profile(ROOT / "deploy" / "cluster_profile.yaml")


def _docs() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(MANIFEST_DIR.glob("*.yaml")):
        for doc in k8s.load_manifests(path.read_text(), str(path)):
            out.append((f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return out


DOCS = _docs()


def _by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for _, d in DOCS if d["kind"] == kind}


def test_manifest_files_present() -> None:
    names = {p.name for p in MANIFEST_DIR.glob("*.yaml")}
    assert {
        "namespace.yaml",
        "rbac.yaml",
        "priorityclasses.yaml",
        "storage.yaml",
        "kueue.yaml",
    } <= names
    assert (MANIFEST_DIR / "README.md").exists()


@pytest.mark.parametrize("doc", [d for _, d in DOCS], ids=[i for i, _ in DOCS])
def test_manifest_is_valid(doc: dict[str, Any]) -> None:
    assert k8s.validate_object(doc) == []


def test_namespace_enforces_restricted() -> None:
    ns = _by_kind("Namespace")[PROFILE.namespace]
    labels = ns["metadata"]["labels"]
    for mode in ("enforce", "audit", "warn"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "restricted"
        assert labels[f"pod-security.kubernetes.io/{mode}-version"] == "v1.33"


def test_rbac_least_privilege() -> None:
    sas = _by_kind("ServiceAccount")
    assert PROFILE.service_account in sas
    assert sas[PROFILE.service_account].get("automountServiceAccountToken") is False
    roles = _by_kind("Role")
    assert not _by_kind("ClusterRole") and not _by_kind("ClusterRoleBinding")
    granted: dict[str, set[str]] = {}
    for role in roles.values():
        assert role["metadata"]["namespace"] == PROFILE.namespace
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"]
            assert "*" not in rule["apiGroups"]
            for res in rule["resources"]:
                granted.setdefault(res, set()).update(rule["verbs"])
    assert set(granted) == {
        "pods",
        "pods/log",
        "pods/exec",
        "services",
        "persistentvolumeclaims",
        "volumesnapshots",
        "events",
        "jobs",
        "jobs/status",
        "deployments",
        "deployments/status",
    }
    assert "secrets" not in granted and "escalate" not in set().union(*granted.values())
    assert granted["pods/log"] == {"get", "list"}
    assert granted["events"] <= {"get", "list", "watch"}
    assert granted["volumesnapshots"] == {"create", "get"}
    for binding in _by_kind("RoleBinding").values():
        assert binding["roleRef"]["name"] in roles
        for subject in binding["subjects"]:
            assert subject["name"] in sas and subject["name"] != PROFILE.service_account


def test_priority_classes_cover_tiers() -> None:
    pcs = _by_kind("PriorityClass")
    values = {name: pcs[t.priority_class]["value"] for name, t in PROFILE.tiers.items()}
    assert values["high"] > values["low"]
    assert pcs[PROFILE.tiers["low"].priority_class]["preemptionPolicy"] == "Never"
    assert not any(pc.get("globalDefault") for pc in pcs.values())


def test_storage_examples_match_profile() -> None:
    sc = _by_kind("StorageClass")
    assert PROFILE.storage.storage_class in sc
    pvcs = _by_kind("PersistentVolumeClaim")
    rendered = k8s.to_dict(k8s.models_pvc(PROFILE))
    assert pvcs[PROFILE.storage.models_pvc]["spec"] == rendered["spec"]
    data = k8s.to_dict(k8s.dataset_pvc(PROFILE, "digits"))
    assert pvcs["trainyard-data-digits"]["spec"] == data["spec"]


def test_cluster_queues_share_one_cohort() -> None:
    # a tier borrows the other's idle quota; the rest of Kueue's agreement with the
    # profile is check-manifests' (tests/unit/test_check_manifests.py)
    cohorts = {cq["spec"]["cohortName"] for cq in _by_kind("ClusterQueue").values()}
    assert len(cohorts) == 1


@pytest.mark.parametrize(
    ("kind", "mutate", "needle"),
    [
        (
            "ClusterQueue",
            lambda d: d["spec"]["resourceGroups"][0]["flavors"][0]["resources"].pop(),
            "must list coveredResources",
        ),
        ("ClusterQueue", lambda d: d["spec"].update(resourceGroups=[]), "non-empty list"),
        ("LocalQueue", lambda d: d["metadata"].pop("namespace"), "'namespace' is a required"),
        ("LocalQueue", lambda d: d["spec"].pop("clusterQueue"), "'clusterQueue' is a required"),
        ("WorkloadPriorityClass", lambda d: d.update(value="high"), "not of type 'integer'"),
        ("ResourceFlavor", lambda d: d["metadata"].update(name="H100"), "DNS-1123"),
    ],
    ids=["cq resources", "cq empty", "lq namespace", "lq target", "wpc value", "flavor name"],
)
def test_kueue_checks_fail(kind: str, mutate: Any, needle: str) -> None:
    doc = copy.deepcopy(next(iter(_by_kind(kind).values())))
    mutate(doc)
    errors = k8s.validate_object(doc)
    assert any(needle in e for e in errors), errors


def test_broken_core_manifest_is_flagged() -> None:
    role = copy.deepcopy(next(iter(_by_kind("Role").values())))
    role["rules"][0]["verbs"] = "get"  # must be a list
    assert any("verbs" in e for e in k8s.validate_object(role))
