"""trainyard.k8s: profile, placement, builders, Pod Security, schema, snapshots, CLI.

Regenerate the YAML snapshots after an intended change with
``TRAINYARD_UPDATE_SNAPSHOTS=1 pytest tests/unit/test_k8s.py -k snapshot`` and review the diff.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k

from trainyard import k8s
from trainyard.config import PipelineConfig
from trainyard.errors import ConfigError
from trainyard.training.spec import IMAGE_CONTRACTS_DIR

ROOT = Path(__file__).resolve().parents[2]
PROFILE_PATH = ROOT / "deploy" / "cluster_profile.yaml"
SNAPSHOTS = ROOT / "tests" / "fixtures" / "k8s_snapshots"
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


@pytest.fixture(scope="module")
def profile() -> k8s.ClusterProfile:
    return k8s.load_cluster_profile(PROFILE_PATH)


@pytest.fixture(scope="module")
def raw_profile() -> dict[str, Any]:
    return yaml.safe_load(PROFILE_PATH.read_text())


def pipeline(**training: Any) -> PipelineConfig:
    """A fixed pipeline (not dags/pipelines/digits.yaml, so snapshots only move with k8s)."""
    return PipelineConfig.model_validate(
        {
            "name": "digits",
            "dataset": "digits",
            "start_date": "2026-11-01",
            "source": {"url": ".trainyard/raw/digits", "format": "image_folder"},
            "training": {"model": "small_cnn", "workers": 2, "epochs": 4, **training},
            "serving": {"model_name": "digits", "replicas": 2},
        }
    )


# ----------------------------------------------------------------------------- profile


def _mutate(raw: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(raw)
    node: Any = out
    keys = path.split(".")
    for key in keys[:-1]:
        node = node[int(key)] if isinstance(node, list) else node[key]
    last = keys[-1]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return out


PROFILE_ERRORS = [
    ("unknown pool in tier", "tiers.high.pools", ["h100", "b200"], "tiers.high.pools"),
    ("pools not newest first", "gpu_pools.0.generation", 1, "newest generation first"),
    ("latest image tag", "images.trainer", "repo/trainer:latest", "images.trainer"),
    ("untagged image", "images.steps", "repo/steps", "images.steps"),
    ("bad quantity", "resources.steps.requests", {"cpu": "lots"}, "resources.steps.requests"),
    ("bad storage size", "storage.dataset_size", "10 GB", "storage.dataset_size"),
    ("unknown field", "storage.bogus", 1, "storage.bogus"),
    ("pool name not dns", "gpu_pools.1.name", "A100", "gpu_pools.1.name"),
    ("root uid", "security.run_as_user", 0, "security.run_as_user"),
    ("kueue without queue", "tiers.low.kueue_queue", None, "kueue_queue"),
    ("snapshot class", "storage.volume_snapshot_class", "CSI_Snap", "volume_snapshot_class"),
    ("storage class", "storage.storage_class", "Fast RWX", "storage.storage_class"),
    (
        "cpu label key",
        "cpu_pool.node_labels",
        {"bad key!": "cpu"},
        "cpu_pool.node_labels: 'bad key!' is not a label key",
    ),
    (
        "gpu label value",
        "gpu_pools.0.node_labels",
        {"nvidia.com/gpu.product": "NVIDIA H100 80GB"},
        "gpu_pools.0.node_labels: 'NVIDIA H100 80GB' is not a label value",
    ),
    (
        "taint key",
        "gpu_pools.0.taints",
        [{"key": "bad key!", "effect": "NoSchedule"}],
        "gpu_pools.0.taints.0.key: 'bad key!' is not a label key",
    ),
    (
        "taint value",
        "cpu_pool.taints",
        [{"key": "dedicated", "value": "x" * 64}],
        "cpu_pool.taints.0.value",
    ),
    (
        "request above limit",
        "resources.trainer",
        {"requests": {"cpu": "16", "memory": "1Gi"}, "limits": {"cpu": "8"}},
        "resources.trainer: requests.cpu 16 is above limits.cpu 8",
    ),
    (
        "request above limit, other units",
        "resources.ps.limits",
        {"memory": "1000Mi"},
        "resources.ps: requests.memory 8Gi is above limits.memory 1000Mi",
    ),
]


@pytest.mark.parametrize(
    ("path", "value", "needle"),
    [c[1:] for c in PROFILE_ERRORS],
    ids=[c[0] for c in PROFILE_ERRORS],
)
def test_profile_errors_name_file_and_field(
    tmp_path: Path, raw_profile: dict[str, Any], path: str, value: Any, needle: str
) -> None:
    raw = _mutate(raw_profile, path, value)
    if needle == "kueue_queue":
        raw["kueue"] = {"enabled": True}
    f = tmp_path / "profile.yaml"
    f.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as e:
        k8s.load_cluster_profile(f)
    assert str(f) in str(e.value)
    assert needle in str(e.value)


@pytest.mark.parametrize(
    ("text", "needle"),
    [(None, "not found"), ("a: [", "not valid YAML"), ("- 1\n", "mapping")],
    ids=["missing", "not yaml", "not a mapping"],
)
def test_profile_unreadable(tmp_path: Path, text: str | None, needle: str) -> None:
    f = tmp_path / "p.yaml"
    if text is not None:
        f.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        k8s.load_cluster_profile(f)


def test_profile_default_path_from_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINYARD_CLUSTER_PROFILE", str(PROFILE_PATH))
    assert k8s.load_cluster_profile().namespace == "trainyard"


def test_import_is_cheap() -> None:
    code = (
        "import sys; import trainyard.k8s; "
        "heavy = [m for m in ('kubernetes', 'tensorflow', 'pandas', 'great_expectations', "
        "'airflow', 'kubernetes_validate') if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(ROOT / "plugins")},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "[]"


# ----------------------------------------------------------------------------- placement


def _terms(labels: list[dict[str, str]]) -> list[k.V1NodeSelectorTerm]:
    return [
        k.V1NodeSelectorTerm(
            match_expressions=[
                k.V1NodeSelectorRequirement(key=key, operator="In", values=[v])
                for key, v in sorted(lab.items())
            ]
        )
        for lab in labels
    ]


H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
A100 = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
T4 = {"nvidia.com/gpu.product": "Tesla-T4"}
V100 = {"nvidia.com/gpu.product": "Tesla-V100-SXM2-32GB"}
GPU_TOL = [
    k.V1Toleration(key="nvidia.com/gpu", operator="Equal", value="present", effect="NoSchedule")
]

PLACEMENT_CASES = [
    ("high newest first", "high", [H100, A100], [100, 50], "trainyard-high", ["h100", "a100"]),
    (
        "low oldest first",
        "low",
        [T4, V100, A100],
        [100, 50, 25],
        "trainyard-low",
        ["t4", "v100", "a100"],
    ),
]


@pytest.mark.parametrize(
    ("tier", "labels", "weights", "priority", "order"),
    [c[1:] for c in PLACEMENT_CASES],
    ids=[c[0] for c in PLACEMENT_CASES],
)
def test_placement_for_tier(
    profile: k8s.ClusterProfile,
    tier: str,
    labels: list[dict[str, str]],
    weights: list[int],
    priority: str,
    order: list[str],
) -> None:
    p = k8s.placement_for_tier(profile, tier, kueue=False)
    expected = k.V1Affinity(
        node_affinity=k.V1NodeAffinity(
            required_during_scheduling_ignored_during_execution=k.V1NodeSelector(
                node_selector_terms=_terms(labels)
            ),
            preferred_during_scheduling_ignored_during_execution=[
                k.V1PreferredSchedulingTerm(weight=w, preference=t)
                for w, t in zip(weights, _terms(labels), strict=True)
            ],
        )
    )
    assert p.affinity == expected
    assert p.tolerations == GPU_TOL  # the same taint on every pool, tolerated once
    assert p.priority_class_name == priority
    assert p.labels == {} and p.kueue_queue is None and p.node_selector is None
    ranked = [next(i for i, line in enumerate(p.plan) if f". {name} (" in line) for name in order]
    assert ranked == sorted(ranked), p.plan
    assert any("required node affinity" in line for line in p.plan)


@pytest.mark.parametrize(
    ("tier", "queue", "flavors"),
    [
        ("high", "trainyard-high", ["h100", "a100"]),
        ("low", "trainyard-low", ["t4", "v100", "a100"]),
    ],
    ids=["high", "low"],
)
def test_placement_kueue(
    profile: k8s.ClusterProfile, tier: str, queue: str, flavors: list[str]
) -> None:
    p = k8s.placement_for_tier(profile, tier, kueue=True)
    assert p.affinity is None and p.tolerations == [] and p.node_selector is None
    assert p.labels == {k8s.KUEUE_QUEUE_LABEL: queue, k8s.KUEUE_PRIORITY_LABEL: f"trainyard-{tier}"}
    assert p.kueue_queue == queue
    listed = [
        line.split(". ", 1)[1].split(" ")[0] for line in p.plan if re.match(r"\s+\d+\. ", line)
    ]
    assert listed == flavors


def test_unknown_tier(profile: k8s.ClusterProfile) -> None:
    with pytest.raises(ConfigError, match=r"unknown priority tier 'urgent'.*high, low"):
        k8s.placement_for_tier(profile, "urgent")


@pytest.mark.parametrize(("rank", "weight"), [(0, 100), (1, 50), (2, 25), (6, 1), (30, 1)])
def test_preference_weight(rank: int, weight: int) -> None:
    assert k8s.preference_weight(rank) == weight


def test_cpu_placement(profile: k8s.ClusterProfile) -> None:
    p = k8s.cpu_placement(profile)
    assert p.node_selector == {"trainyard.io/pool": "cpu"}
    assert p.affinity is None and p.priority_class_name is None


# ----------------------------------------------------------------------------- builders


def _env(container: k.V1Container) -> dict[str, str]:
    return {e.name: e.value for e in container.env}


@pytest.mark.parametrize(
    ("step", "read_only"),
    [("stage", False), ("validate", False), ("train", True), ("evaluate", True), ("deploy", True)],
    ids=["stage", "validate", "train", "evaluate", "deploy"],
)
def test_step_pod(profile: k8s.ClusterProfile, step: str, read_only: bool) -> None:
    pod = k8s.step_pod(
        profile,
        step,
        ["--pipeline", "digits"],
        "digits",
        pipeline="digits",
        writes_dataset=not read_only,
    )
    c = pod.spec.containers[0]
    assert c.name == k8s.BASE_CONTAINER
    assert c.image == profile.images.steps
    assert c.command == ["python", "-m", "trainyard", step]
    assert c.args == ["--pipeline", "digits"]
    assert _env(c)["TRAINYARD_VOLUME_ROOT"] == "/volumes"
    mounts = {m.mount_path: m for m in c.volume_mounts}
    assert mounts["/volumes/digits"].read_only is read_only
    assert mounts["/volumes/_models"].sub_path == "_models"
    vols = {v.name: v for v in pod.spec.volumes}
    assert vols["data"].persistent_volume_claim.claim_name == "trainyard-data-digits"
    assert vols["data"].persistent_volume_claim.read_only is read_only
    assert pod.spec.node_selector == {"trainyard.io/pool": "cpu"}
    assert pod.spec.restart_policy == "Never"
    assert pod.spec.security_context == k8s.restricted_pod_security_context(profile)
    assert c.security_context == k8s.restricted_security_context(read_only_root=True)
    assert _env(c)["TRAINYARD_XCOM_PATH"] == k8s.XCOM_PATH
    assert k8s.validate_object(pod) == []


def test_step_pod_of_the_table_and_unknown(profile: k8s.ClusterProfile) -> None:
    from trainyard.pods import step_pod

    pod = step_pod(profile, pipeline(), "validate", {"snapshot_id": "s1"})
    assert pod.spec.containers[0].args == ["--pipeline", "digits", "--snapshot-id", "s1"]
    assert pod.spec.volumes[0].persistent_volume_claim.read_only is False
    pod = step_pod(profile, pipeline(), "evaluate", {"version": 2})
    assert pod.spec.volumes[0].persistent_volume_claim.read_only is True
    with pytest.raises(ConfigError, match="unknown step 'fit'"):
        step_pod(profile, pipeline(), "fit", {})
    with pytest.raises(ConfigError, match="validate: --snapshot-id is required"):
        step_pod(profile, pipeline(), "validate", {})
    with pytest.raises(ConfigError, match="unknown argument"):
        step_pod(profile, pipeline(), "validate", {"snapshot_id": "s", "output_dir": "/x"})


def test_long_dataset_names_get_distinct_pvcs() -> None:
    head = "d" * 48
    names = {k8s.dataset_pvc_name(head + tail) for tail in ("_one", "_two", "")}
    assert len(names) == 3
    assert all(len(n) <= 63 and re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", n) for n in names)
    assert k8s.dataset_pvc_name(head) == f"trainyard-data-{head}"  # fits: unchanged


def test_pvcs(profile: k8s.ClusterProfile) -> None:
    pvc = k8s.dataset_pvc(profile, "hand_digits", "5Gi", "fast", "ReadWriteOnce")
    assert pvc == k.V1PersistentVolumeClaim(
        api_version="v1",
        kind="PersistentVolumeClaim",
        metadata=k.V1ObjectMeta(
            name="trainyard-data-hand-digits",
            namespace="trainyard",
            labels={
                "app.kubernetes.io/name": "trainyard",
                "app.kubernetes.io/component": "dataset-volume",
                "trainyard.io/dataset": "hand-digits",
            },
        ),
        spec=k.V1PersistentVolumeClaimSpec(
            access_modes=["ReadWriteOnce"],
            storage_class_name="fast",
            resources=k.V1VolumeResourceRequirements(requests={"storage": "5Gi"}),
        ),
    )
    models = k8s.models_pvc(profile)
    assert models.metadata.name == "trainyard-models"
    assert models.spec.access_modes == ["ReadWriteMany"]
    assert k8s.validate_object(pvc) == [] and k8s.validate_object(models) == []


TRAINING_CASES = [
    ("mirrored 2 workers", "multi_worker_mirrored", 2, 0, {"worker": 2}),
    ("mirrored 8 workers", "multi_worker_mirrored", 8, 0, {"worker": 8}),
    ("parameter server", "parameter_server", 3, 2, {"ps": 2, "chief": 1, "worker": 3}),
]


@pytest.mark.parametrize(
    ("strategy", "workers", "ps", "roles"),
    [c[1:] for c in TRAINING_CASES],
    ids=[c[0] for c in TRAINING_CASES],
)
def test_training_objects_env_contract(
    profile: k8s.ClusterProfile, strategy: str, workers: int, ps: int, roles: dict[str, int]
) -> None:
    tr = k8s.training_objects(
        profile,
        "digits",
        "scheduled__2026-11-22T02:00:00+00:00",
        strategy=strategy,
        workers=workers,
        parameter_servers=ps,
        tier="high",
        gpus_per_worker=2,
        args=["--epochs", "1"],
        dataset="digits",
        deadline_s=600,
    )
    svc = tr.service
    assert svc.spec.cluster_ip == "None" and svc.spec.publish_not_ready_addresses is True
    assert svc.spec.selector == {"trainyard.io/run": tr.name}
    assert [j.metadata.labels["trainyard.io/role"] for j in tr.jobs] == list(roles)
    for job in tr.jobs:
        role = job.metadata.labels["trainyard.io/role"]
        spec, pod = job.spec, job.spec.template.spec
        c = pod.containers[0]
        env = _env(c)
        jobs = json.loads(env["TRAINYARD_TF_JOBS"])
        assert {r: v["replicas"] for r, v in jobs.items()} == roles
        assert jobs[role]["job"] == job.metadata.name
        assert env["TRAINYARD_TF_TASK_TYPE"] == role
        assert env["TRAINYARD_TF_SERVICE"] == svc.metadata.name == pod.subdomain
        assert env["TRAINYARD_TF_PORT"] == "2222" and c.ports[0].container_port == 2222
        assert (spec.completion_mode, spec.completions, spec.parallelism) == (
            "Indexed",
            roles[role],
            roles[role],
        )
        assert spec.backoff_limit == 0 and spec.active_deadline_seconds == 600
        assert c.command == ["python", "-m", "trainyard", "worker"] and c.args == [
            "--epochs",
            "1",
        ]
        assert job.spec.template.metadata.labels["trainyard.io/run"] == tr.name
        mounts = {m.mount_path: m for m in c.volume_mounts}
        assert mounts["/volumes/digits"].read_only is True
        assert mounts["/volumes/_checkpoints"].read_only is False
        if role == "ps":
            assert "nvidia.com/gpu" not in c.resources.limits
            assert pod.node_selector == {"trainyard.io/pool": "cpu"} and pod.affinity is None
        else:
            assert c.resources.limits["nvidia.com/gpu"] == "2"
            assert pod.affinity == tr.placement.affinity
        assert pod.priority_class_name == "trainyard-high"
        for i in range(roles[role]):
            host = f"{job.metadata.name}-{i}"
            assert DNS_LABEL.match(host), host
        assert k8s.validate_object(job) == []
    assert k8s.validate_object(svc) == []
    assert any("required node affinity" in line for line in tr.plan)
    assert tr.teardown[-1].endswith(f"-l trainyard.io/run={tr.name} --ignore-not-found")
    assert sum("delete job" in t for t in tr.teardown) == len(roles)


@pytest.mark.parametrize("strategy", ["multi_worker_mirrored", "parameter_server"])
def test_cpu_training_goes_to_the_cpu_pool(profile: k8s.ClusterProfile, strategy: str) -> None:
    # gpus_per_worker: 0 is CPU training: a pod on a GPU node would hold it unused
    tr = k8s.training_objects(
        profile,
        "digits",
        "r",
        strategy=strategy,
        workers=2,
        parameter_servers=1,
        tier="high",
        gpus_per_worker=0,
        args=[],
        dataset="digits",
    )
    for job in tr.jobs:
        role = job.metadata.labels["trainyard.io/role"]
        pod = job.spec.template.spec
        limits = pod.containers[0].resources.limits
        assert "nvidia.com/gpu" not in limits, role
        assert pod.node_selector == {"trainyard.io/pool": "cpu"} and pod.affinity is None
        assert not any(t.key == "nvidia.com/gpu" for t in pod.tolerations or [])
        assert pod.priority_class_name == "trainyard-high"
        expected = profile.resources.ps if role == "ps" else profile.resources.trainer
        assert limits == expected.limits
        assert k8s.validate_object(job) == []
    assert not any("GPU(s)" in line for line in tr.plan[1 : 1 + len(tr.jobs)])


def test_cpu_training_under_kueue_is_refused(profile: k8s.ClusterProfile) -> None:
    from trainyard.k8s.profile import training_problems

    cpu = pipeline(gpus_per_worker=0).training
    assert training_problems(profile, cpu, kueue=False) == []
    ((keys, why),) = training_problems(profile, cpu, kueue=True)
    assert keys == ("gpus_per_worker",) and "GPU flavors" in why


def test_training_names_stay_valid_for_long_pipelines() -> None:
    base = k8s.training_base_name("a_very_long_pipeline_name_" * 3, "manual__x", attempt=12)
    assert len(base) <= 40 and DNS_LABEL.match(base)
    assert DNS_LABEL.match(f"{k8s.job_name(base, 'worker')}-63")
    assert k8s.training_base_name("p", "r", 1) != k8s.training_base_name("p", "r", 2)
    assert k8s.training_base_name("p", "r1") != k8s.training_base_name("p", "r2")


RUN = "scheduled__2026-11-27T01:30:00+00:00"


def _copy(name: str, **fields: Any) -> PipelineConfig:
    """``dags/pipelines/transactions.yaml`` copied under another name (and other fields)."""
    raw = yaml.safe_load((ROOT / "dags" / "pipelines" / "transactions.yaml").read_text())
    raw["name"] = name
    for dotted, value in fields.items():
        raw = _mutate(raw, dotted.replace("__", "."), value)
    return PipelineConfig.model_validate(raw)


def _rendered(profile: k8s.ClusterProfile, cfg: PipelineConfig) -> list[dict[str, Any]]:
    from trainyard.pods import render_objects

    objs = render_objects(profile, cfg, "all", snapshot="0123456789abcdef", version=3, run_id=RUN)
    return [k8s.to_dict(o) for o in objs]


def _labels_of(d: dict[str, Any]) -> list[dict[str, str]]:
    spec = d.get("spec", {})
    return [
        d["metadata"].get("labels", {}),
        spec.get("template", {}).get("metadata", {}).get("labels", {}),
    ]


def test_two_pipelines_sharing_a_head_share_no_object(profile: k8s.ClusterProfile) -> None:
    # fraud_detection_transactions_eu / _us (a copy of transactions.yaml each) rendered for
    # one run id both made Service ty-fraud-detection-transacti-b939a9b2-a1, its Jobs and
    # run label: a retry reattached to, or a teardown deleted, the other's training
    eu, us = (
        _rendered(profile, _copy(f"fraud_detection_transactions_{r}", serving__model_name=r))
        for r in ("eu", "us")
    )
    shared = {("PersistentVolumeClaim", "trainyard-data-transactions")}
    shared.add(("PersistentVolumeClaim", profile.storage.models_pvc))

    def names(objs: list[dict[str, Any]]) -> set[tuple[str, str]]:
        return {(d["kind"], d["metadata"]["name"]) for d in objs} - shared

    def runs(objs: list[dict[str, Any]]) -> set[str]:
        return {ls[k8s.RUN_LABEL] for d in objs for ls in _labels_of(d) if k8s.RUN_LABEL in ls}

    assert names(eu) and names(eu).isdisjoint(names(us))
    assert runs(eu) and runs(eu).isdisjoint(runs(us))
    for cfg, objs in (
        ("fraud_detection_transactions_eu", eu),
        ("fraud_detection_transactions_us", us),
    ):
        base = k8s.training_base_name(cfg, RUN)
        assert base.startswith("ty-fraud-detection-") and len(base) <= 40
        assert ("Service", base) in names(objs)
        assert {n for kind, n in names(objs) if kind == "Job"} == {f"job-{base}-worker"}
        job = next(d for d in objs if d["kind"] == "Job")
        pod = job["spec"]["template"]["spec"]
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert pod["subdomain"] == env["TRAINYARD_TF_SERVICE"] == base
        assert json.loads(env["TRAINYARD_TF_JOBS"])["worker"]["job"] == f"job-{base}-worker"
        # every pod, Job and Service says whose it is
        for d in objs:
            if d["kind"] in ("Pod", "Job", "Service") and d["metadata"]["labels"].get(
                k8s.COMPONENT_LABEL
            ) in ("step", "training"):
                assert d["metadata"]["labels"][k8s.PIPELINE_LABEL] == cfg.replace("_", "-")
                assert d["metadata"]["labels"][k8s.RUN_LABEL].startswith(k8s.run_name(cfg, RUN))


@pytest.mark.parametrize(
    ("pipeline_name", "run_id", "attempt"),
    [
        ("digits", "manual__2026-11-22", 1),
        ("fraud_detection_transactions_eu", RUN, 1),
        ("a_very_long_pipeline_name_" * 2 + "x", "r" * 300, 99),
        ("p", "", 1234),
    ],
    ids=["short", "shared head", "long", "many attempts"],
)
def test_run_and_training_names(pipeline_name: str, run_id: str, attempt: int) -> None:
    run = k8s.run_name(pipeline_name, run_id)
    base = k8s.training_base_name(pipeline_name, run_id, attempt)
    assert DNS_LABEL.match(run) and DNS_LABEL.match(base) and len(base) <= 40
    assert run.startswith(k8s.training_prefix(pipeline_name))
    if attempt < 100:  # a step pod's run label begins its training attempts' names
        assert base == f"{run}-a{attempt}"
    assert DNS_LABEL.match(f"{k8s.job_name(base, 'worker')}-9999")
    # the hash covers the whole pipeline name and the run id
    assert base != k8s.training_base_name(pipeline_name + "x", run_id, attempt)
    assert base != k8s.training_base_name(pipeline_name, run_id + "x", attempt)


LONG_MODEL = "Model-For-The-Fraud-Detection-Team-In-Europe-Region-Version-"


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("fraud.model", "fraud_model"),
        (LONG_MODEL + "a", LONG_MODEL + "b"),
        ("fraud.model", "fraud-model"),
        ("x" * 55 + "a", "x" * 55 + "b"),
    ],
    ids=["replaced characters", "cut", "sanitised vs valid", "valid but too long"],
)
def test_distinct_model_names_get_distinct_serving_objects(
    profile: k8s.ClusterProfile, a: str, b: str
) -> None:
    # both rendered serving-fraud-model, selector trainyard.io/model: fraud-model (or both
    # serving-model-for-the-fraud-detection-team-in-europe-region-ver): one pipeline's
    # deploy rolled the other's Deployment, and each Service selected both's pods
    def rendered(model: str) -> tuple[str, str, dict[str, str], dict[str, str]]:
        dep = k8s.serving_deployment(profile, model, 1, 1)
        svc = k8s.serving_service(profile, model)
        assert dep.metadata.name == svc.metadata.name
        assert dep.spec.selector.match_labels == svc.spec.selector
        assert DNS_LABEL.match(dep.metadata.name)
        assert k8s.validate_object(dep) == [] and k8s.validate_object(svc) == []
        # the model's own name stays where TF Serving and the deploy step use it
        assert dep.spec.template.spec.containers[0].readiness_probe.http_get.path == (
            f"/v1/models/{model}"
        )
        return dep.metadata.name, svc.metadata.name, svc.spec.selector, dep.metadata.labels

    ra, rb = rendered(a), rendered(b)
    assert ra[0] != rb[0] and ra[1] != rb[1]
    assert ra[2][k8s.MODEL_LABEL] != rb[2][k8s.MODEL_LABEL]
    for model in (a, b):
        cfg = _copy("transactions", serving__model_name=model)
        assert k8s.serving_name(model) in [n for _, _, n in k8s.pipeline_object_names(cfg)]


@pytest.mark.parametrize("model", ["digits", "transactions", "9lives", "m" * 55])
def test_a_model_name_that_is_a_dns_label_keeps_its_serving_names(model: str) -> None:
    # the names shipped Deployments already have must not change
    assert k8s.serving_name(model) == f"serving-{model}"
    assert k8s.model_key(model) == model


def test_step_pods_are_named_and_labelled_after_their_pipeline(
    profile: k8s.ClusterProfile,
) -> None:
    # vision_ps on dataset digits rendered trainyard-stage-digits, labelled with the step
    # only: two pipelines on one dataset could not be told apart
    from trainyard.pods import step_pod

    vision = pipeline().model_copy(update={"name": "vision_ps"})
    pod = step_pod(profile, vision, "stage", SAMPLE_STAGE, run_id="manual__1")
    assert pod.metadata.name == "trainyard-stage-vision-ps"
    assert pod.metadata.labels[k8s.PIPELINE_LABEL] == "vision-ps"
    assert pod.metadata.labels[k8s.RUN_LABEL] == k8s.run_name("vision_ps", "manual__1")
    assert pod.metadata.labels["trainyard.io/step"] == "stage"
    assert pod.spec.volumes[0].persistent_volume_claim.claim_name == "trainyard-data-digits"
    other = step_pod(profile, pipeline(), "stage", SAMPLE_STAGE, run_id="manual__1")
    assert other.metadata.name == "trainyard-stage-digits"
    assert other.metadata.labels[k8s.RUN_LABEL] != pod.metadata.labels[k8s.RUN_LABEL]
    # a step pod is no training pod: teardown (by the attempt's run label) spares it
    base = k8s.training_base_name("vision_ps", "manual__1")
    assert pod.metadata.labels[k8s.RUN_LABEL] != base
    # long names: cut to what KubernetesPodOperator keeps, distinct by a hash
    longs = ["p" * 62 + "a", "p" * 62 + "b"]
    names = {k8s.step_pod_name(step, n) for n in longs for step in ("evaluate", "stage")}
    assert len(names) == 4
    assert all(len(n) <= k8s.STEP_POD_NAME_MAX and DNS_LABEL.match(n) for n in names)


SAMPLE_STAGE = {"interval_start": "2026-11-01", "interval_end": "2026-11-02"}


def test_training_kueue(profile: k8s.ClusterProfile) -> None:
    tr = k8s.training_objects(
        profile,
        "digits",
        "r",
        strategy="parameter_server",
        workers=2,
        parameter_servers=1,
        tier="low",
        gpus_per_worker=1,
        args=[],
        dataset="digits",
        kueue=True,
    )
    for job in tr.jobs:
        assert job.spec.suspend is True
        assert job.metadata.labels[k8s.KUEUE_QUEUE_LABEL] == "trainyard-low"
        assert job.metadata.labels[k8s.KUEUE_PRIORITY_LABEL] == "trainyard-low"
        pod = job.spec.template.spec
        # the admitted flavor injects node labels; our own selector would conflict
        assert pod.affinity is None and pod.node_selector is None
        assert k8s.validate_object(job) == []


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"strategy": "horovod"}, "unknown training strategy"),
        ({"strategy": "parameter_server", "parameter_servers": 0}, "parameter_servers >= 1"),
        ({"workers": 0}, "replicas must be >= 1"),
        ({"tier": "urgent"}, "unknown priority tier"),
    ],
    ids=["strategy", "no ps", "no workers", "tier"],
)
def test_training_errors(profile: k8s.ClusterProfile, kwargs: dict[str, Any], needle: str) -> None:
    base = {
        "strategy": "multi_worker_mirrored",
        "workers": 2,
        "parameter_servers": 1,
        "tier": "high",
        "gpus_per_worker": 1,
        "args": [],
        "dataset": "digits",
    }
    with pytest.raises(ConfigError, match=needle):
        k8s.training_objects(profile, "digits", "r", **{**base, **kwargs})


def test_serving(profile: k8s.ClusterProfile) -> None:
    dep = k8s.serving_deployment(profile, "digits", 7, 3)
    svc = k8s.serving_service(profile, "digits")
    pod = dep.spec.template.spec
    c = pod.containers[0]
    assert dep.spec.replicas == 3
    assert dep.spec.strategy.rolling_update.max_unavailable == 0
    assert dep.spec.progress_deadline_seconds == 300
    config = "/volumes/_serving/digits/model.config"
    assert f"--model_config_file={config}" in c.args and "--rest_api_port=8501" in c.args
    assert "--model_config_file_poll_wait_seconds=5" in c.args
    assert c.command[-1] == config  # the wrapper waits for the deploy step's config
    assert c.readiness_probe.http_get.path == "/v1/models/digits"
    assert c.lifecycle.pre_stop._exec.command == ["sleep", "10"]
    mount = next(m for m in c.volume_mounts if m.name == "models")
    # where the deploy step's pod writes the serving root
    assert (mount.mount_path, mount.sub_path, mount.read_only) == (
        "/volumes/_serving",
        "_serving",
        True,
    )
    assert pod.security_context.run_as_user == 50000 and pod.security_context.run_as_non_root
    assert c.security_context.read_only_root_filesystem is True
    assert dep.spec.template.metadata.annotations["trainyard.io/model-version"] == "7"
    assert pod.node_selector == {"trainyard.io/pool": "cpu"}
    assert svc.spec.selector == dep.spec.selector.match_labels
    assert k8s.validate_object(dep) == [] and k8s.validate_object(svc) == []


def test_serving_container_waits_for_its_model_config_then_runs_the_server(
    profile: k8s.ClusterProfile, tmp_path
) -> None:
    import os
    import subprocess
    import time

    c = k8s.serving_deployment(profile, "digits", 7, 1).spec.template.spec.containers[0]
    fake = tmp_path / "bin" / "tensorflow_model_server"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$(dirname "$0")/../ran"\n')
    fake.chmod(0o755)
    config = tmp_path / "model.config"  # stands for the PVC path
    command = [*c.command[:-1], str(config)]
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"}
    proc = subprocess.Popen([*command, *c.args], env=env)
    time.sleep(2.5)
    assert proc.poll() is None and not (tmp_path / "ran").exists()  # still waiting
    config.write_text("model_config_list {\n}\n")
    assert proc.wait(timeout=10) == 0
    assert (tmp_path / "ran").read_text().split() == c.args


# ----------------------------------------------------------------------------- PSS + schema


def _pod_dict(profile: k8s.ClusterProfile) -> dict[str, Any]:
    return k8s.to_dict(
        k8s.step_pod(
            profile,
            "stage",
            ["--pipeline", "digits"],
            "digits",
            pipeline="digits",
            writes_dataset=True,
        )
    )


def _c(d: dict[str, Any]) -> dict[str, Any]:
    return d["spec"]["containers"][0]


PSS_CASES: list[tuple[str, Any, str]] = [
    ("privileged", lambda d: _c(d)["securityContext"].update(privileged=True), "privileged"),
    (
        "privilege escalation",
        lambda d: _c(d)["securityContext"].pop("allowPrivilegeEscalation"),
        "allowPrivilegeEscalation",
    ),
    (
        "added capability",
        lambda d: _c(d)["securityContext"]["capabilities"].update(add=["SYS_ADMIN"]),
        "NET_BIND_SERVICE",
    ),
    (
        "no drop ALL",
        lambda d: _c(d)["securityContext"].pop("capabilities"),
        "drop must include ALL",
    ),
    ("root allowed", lambda d: _c(d)["securityContext"].update(runAsNonRoot=False), "runAsNonRoot"),
    ("uid 0", lambda d: _c(d)["securityContext"].update(runAsUser=0), "runAsUser must not be 0"),
    (
        "seccomp unconfined",
        lambda d: _c(d)["securityContext"].update(seccompProfile={"type": "Unconfined"}),
        "seccompProfile",
    ),
    (
        "no seccomp anywhere",
        lambda d: (
            d["spec"]["securityContext"].pop("seccompProfile"),
            _c(d)["securityContext"].pop("seccompProfile"),
        ),
        "seccompProfile.type must be",
    ),
    ("host network", lambda d: d["spec"].update(hostNetwork=True), "hostNetwork"),
    ("host pid", lambda d: d["spec"].update(hostPID=True), "hostPID"),
    ("host ipc", lambda d: d["spec"].update(hostIPC=True), "hostIPC"),
    (
        "hostPath volume",
        lambda d: d["spec"]["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
        "hostPath is not allowed",
    ),
    (
        "host port",
        lambda d: _c(d).update(ports=[{"containerPort": 80, "hostPort": 80}]),
        "hostPort 80",
    ),
    (
        "bare init container",
        lambda d: d["spec"].update(initContainers=[{"name": "init", "image": "busybox:1.36"}]),
        "initContainers[init]",
    ),
    (
        "bare ephemeral container",
        lambda d: d["spec"].update(ephemeralContainers=[{"name": "dbg", "image": "busybox:1.36"}]),
        "ephemeralContainers[dbg]",
    ),
    (
        "unsafe sysctl",
        lambda d: d["spec"]["securityContext"].update(
            sysctls=[{"name": "kernel.msgmax", "value": "1"}]
        ),
        "safe sysctl",
    ),
    ("proc mount", lambda d: _c(d)["securityContext"].update(procMount="Unmasked"), "procMount"),
    (
        "selinux user",
        lambda d: _c(d)["securityContext"].update(seLinuxOptions={"user": "root"}),
        "seLinuxOptions.user",
    ),
    (
        "apparmor unconfined",
        lambda d: _c(d)["securityContext"].update(appArmorProfile={"type": "Unconfined"}),
        "appArmorProfile",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "needle"), [c[1:] for c in PSS_CASES], ids=[c[0] for c in PSS_CASES]
)
def test_pss_flags_violations(profile: k8s.ClusterProfile, mutate: Any, needle: str) -> None:
    d = _pod_dict(profile)
    assert k8s.pss_violations(d["spec"]) == []
    mutate(d)
    errors = k8s.validate_object(d)
    assert any(needle in e for e in errors), errors
    assert all(e.startswith("Pod/trainyard-stage-digits") for e in errors)


def test_pss_on_workload_templates(profile: k8s.ClusterProfile) -> None:
    dep = k8s.to_dict(k8s.serving_deployment(profile, "digits", 1, 1))
    dep["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privileged"] = True
    errors = k8s.validate_object(dep)
    assert any("spec.template.spec.containers[serving]: privileged" in e for e in errors), errors


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: _c(d).pop("name"), "'name' is a required property"),
        (lambda d: _c(d).update(imagePullPolicy=3), "imagePullPolicy"),
        (lambda d: d["spec"].update(bogusField=True), "bogusField"),
        (lambda d: d.pop("kind"), "apiVersion and kind"),
    ],
    ids=["missing required", "wrong type", "unknown field (strict)", "no kind"],
)
def test_schema_flags_errors(profile: k8s.ClusterProfile, mutate: Any, needle: str) -> None:
    d = _pod_dict(profile)
    mutate(d)
    errors = k8s.validate_object(d)
    assert any(needle in e for e in errors), errors


def test_unknown_kind_is_an_error() -> None:
    obj = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    assert k8s.validate_object(obj) == ["Widget/w: no schema for example.com/v1 Widget"]


# ----------------------------------------------------------------------------- snapshots


def _snapshot_cases(profile: k8s.ClusterProfile) -> dict[str, list[Any]]:
    from trainyard.pods import render_objects

    p = pipeline()
    ps = pipeline(strategy="parameter_server", workers=2, parameter_servers=1, priority="low")
    opts = {"snapshot": "0123456789abcdef", "version": 3, "run_id": "manual__2026-11-22"}
    return {
        "storage": render_objects(profile, p, "storage", **opts),
        "stage": render_objects(profile, p, "stage", **opts),
        "validate": render_objects(profile, p, "validate", **opts),
        "train_mirrored_high": render_objects(profile, p, "train", **opts),
        "train_ps_low": render_objects(profile, ps, "train", **opts),
        "train_ps_low_kueue": render_objects(profile, ps, "train", kueue=True, **opts),
        "evaluate": render_objects(profile, p, "evaluate", **opts),
        "deploy": render_objects(profile, p, "deploy", **opts),
    }


SNAPSHOT_NAMES = [
    "storage",
    "stage",
    "validate",
    "train_mirrored_high",
    "train_ps_low",
    "train_ps_low_kueue",
    "evaluate",
    "deploy",
]


def update_snapshots() -> list[Path]:
    """Rewrite every snapshot fixture from the current builders (review the git diff)."""
    profile = k8s.load_cluster_profile(PROFILE_PATH)
    SNAPSHOTS.mkdir(parents=True, exist_ok=True)
    written = []
    for name, objs in _snapshot_cases(profile).items():
        path = SNAPSHOTS / f"{name}.yaml"
        path.write_text(k8s.render_yaml(objs))
        written.append(path)
    return written


@pytest.mark.parametrize("name", SNAPSHOT_NAMES)
def test_snapshot(profile: k8s.ClusterProfile, name: str) -> None:
    if os.environ.get("TRAINYARD_UPDATE_SNAPSHOTS") == "1":
        update_snapshots()
    objs = _snapshot_cases(profile)[name]
    for obj in objs:
        assert k8s.validate_object(obj) == []
    path = SNAPSHOTS / f"{name}.yaml"
    assert path.exists(), f"missing {path}: run with TRAINYARD_UPDATE_SNAPSHOTS=1"
    assert k8s.render_yaml(objs) == path.read_text(), (
        f"{path} differs from the rendered objects; "
        "if intended, rerun with TRAINYARD_UPDATE_SNAPSHOTS=1"
    )
    # the fixture is itself a valid manifest set
    for doc in k8s.load_manifests(path.read_text(), str(path)):
        assert k8s.validate_object(doc) == []


def test_snapshot_set_is_complete(profile: k8s.ClusterProfile) -> None:
    assert sorted(_snapshot_cases(profile)) == sorted(SNAPSHOT_NAMES)
    assert sorted(p.stem for p in SNAPSHOTS.glob("*.yaml")) == sorted(SNAPSHOT_NAMES)


# ----------------------------------------------------------------------------- CLI


def test_cli_render(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINYARD_CLUSTER_PROFILE", str(PROFILE_PATH))
    from trainyard.cli import main

    assert main(["render", "digits", "--step", "deploy", "--version", "4"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in docs] == ["Deployment", "Service", "Pod"]
    assert docs[2]["spec"]["containers"][0]["args"] == [
        "--pipeline", "digits", "--version", "4", "--actor", "render"
    ]  # fmt: skip

    # a config error no retry fixes: 3, as for the steps
    assert main(["render", "digits", "--step", "train"]) == 3
    assert "render train: --snapshot is required" in capsys.readouterr().err

    assert main(["render", "digits", "--snapshot", "s1", "--version", "1"]) == 0
    kinds = [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)]
    # stage, validate, plan, register, evaluate, deploy, summary
    assert kinds.count("Job") >= 1 and kinds.count("Pod") == 7 and "Deployment" in kinds


@pytest.mark.parametrize("version", ["0", "-1"])
def test_cli_render_refuses_a_version_below_1(
    capsys: pytest.CaptureFixture[str], version: str
) -> None:
    from trainyard.cli import main

    with pytest.raises(SystemExit) as e:  # a usage error, as argparse reports it
        main(["render", "digits", "--step", "deploy", f"--version={version}"])
    assert e.value.code == 2
    assert f"version {version}: versions start at 1" in capsys.readouterr().err


def test_cli_render_rejects_bad_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], raw_profile: dict[str, Any]
) -> None:
    from trainyard.cli import main

    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(_mutate(raw_profile, "images.serving", "tf/serving:latest")))
    assert main(["render", "digits", "--step", "storage", "--profile", str(f)]) == 3
    err = capsys.readouterr().err
    assert str(f) in err and "images.serving" in err


if __name__ == "__main__":
    for written in update_snapshots():
        print(written)


# ----------------------------------------------------------------------------- trainer seam


@pytest.mark.parametrize(
    ("strategy", "workers", "ps"),
    [("multi_worker_mirrored", 3, 0), ("parameter_server", 2, 1)],
    ids=["mirrored", "parameter server"],
)
def test_job_env_derives_tf_config(
    profile: k8s.ClusterProfile, strategy: str, workers: int, ps: int
) -> None:
    """Every pod's env (as rendered + JOB_COMPLETION_INDEX) yields the right TF_CONFIG."""
    from trainyard.training.worker.tf_config import derive_tf_config

    tr = k8s.training_objects(
        profile,
        "digits",
        "r",
        strategy=strategy,
        workers=workers,
        parameter_servers=ps,
        tier="high",
        gpus_per_worker=1,
        args=[],
        dataset="digits",
    )
    seen = 0
    for job in tr.jobs:
        env = _env(job.spec.template.spec.containers[0])
        role = env["TRAINYARD_TF_TASK_TYPE"]
        for i in range(job.spec.completions):
            cfg = derive_tf_config({**env, "JOB_COMPLETION_INDEX": str(i)})
            assert cfg["task"] == {"type": role, "index": i}
            me = cfg["cluster"][role][i]
            # <job>-<index>.<subdomain>:<port>: the DNS name Kubernetes gives this pod
            assert me == f"{job.metadata.name}-{i}.{job.spec.template.spec.subdomain}:2222"
            seen += 1
    assert seen == workers + ps + (1 if strategy == "parameter_server" else 0)


def test_trainer_args_parse_with_the_worker_cli() -> None:
    from trainyard.training.worker.main import parse_args

    p = pipeline(strategy="parameter_server", epochs=7, steps_per_execution=4)
    objs = k8s.run_training_objects(
        k8s.load_cluster_profile(PROFILE_PATH), p, p.training, "0123abcd", "r"
    )
    a = parse_args(objs.jobs[0].spec.template.spec.containers[0].args)
    assert [str(d) for d in a.snapshot_dirs] == ["/volumes/digits/snapshots/0123abcd"]
    assert str(a.contract) == f"{IMAGE_CONTRACTS_DIR}/digits.yaml"
    assert (a.model, a.strategy, a.epochs, a.steps_per_execution) == (
        "small_cnn",
        "parameter_server",
        7,
        4,
    )
    assert str(a.output_dir).startswith("/volumes/_checkpoints/digits/r-")


def test_a_training_window_is_every_snapshot_dir_of_the_worker_command() -> None:
    """Each snapshot of the window is a --snapshot-dir, the run's own last, no repeats."""
    from trainyard.training.worker.main import parse_args

    p = pipeline()
    window = ["00000000000000a1", "00000000000000b2", "0123abcd00000000"]
    objs = k8s.run_training_objects(
        k8s.load_cluster_profile(PROFILE_PATH),
        p,
        p.training,
        "0123abcd00000000",
        "r",
        window=window,
    )
    for job in objs.jobs:
        a = parse_args(job.spec.template.spec.containers[0].args)
        assert [str(d) for d in a.snapshot_dirs] == [
            f"/volumes/digits/snapshots/{sid}" for sid in window
        ]
