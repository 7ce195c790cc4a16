"""Our objects through the real cncf-kubernetes 10.25 operators (no cluster needed).

The operators rebuild pods/Jobs from their own parameters and merge ours underneath; these
tests run that real merge (``build_pod_request_obj`` / ``build_job_request_obj``) with an
offline kubeconfig (the API server address is never contacted) and check that what would
be created is still ours, schema-valid and Pod Security "restricted".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainyard import k8s

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def profile() -> k8s.ClusterProfile:
    return k8s.load_cluster_profile(ROOT / "deploy" / "cluster_profile.yaml")


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("kube") / "config"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "offline", "cluster": {"server": "https://127.0.0.1:9"}}],
                "users": [{"name": "u", "user": {"token": "offline"}}],
                "contexts": [{"name": "offline", "context": {"cluster": "offline", "user": "u"}}],
                "current-context": "offline",
            }
        )
    )
    return {"config_file": str(path), "in_cluster": False}


def _training(profile: k8s.ClusterProfile, kueue: bool) -> k8s.TrainingObjects:
    return k8s.training_objects(
        profile,
        "digits",
        "manual__1",
        strategy="parameter_server",
        workers=2,
        parameter_servers=1,
        tier="high",
        gpus_per_worker=1,
        args=["--epochs", "1"],
        dataset="digits",
        deadline_s=900,
        kueue=kueue,
    )


@pytest.mark.parametrize("kueue", [False, True], ids=["job operator", "kueue job operator"])
def test_job_operator_creates_our_job(
    profile: k8s.ClusterProfile, kubeconfig: dict[str, Any], kueue: bool
) -> None:
    from airflow.providers.cncf.kubernetes.operators.job import KubernetesJobOperator
    from airflow.providers.cncf.kubernetes.operators.kueue import KubernetesStartKueueJobOperator

    tr = _training(profile, kueue)
    for ours in tr.jobs:
        role = ours.metadata.labels["trainyard.io/role"]
        kwargs = k8s.job_operator_kwargs(ours, kueue_queue=tr.placement.kueue_queue)
        cls = KubernetesStartKueueJobOperator if kueue else KubernetesJobOperator
        op = cls(task_id=f"train_{role}", **kubeconfig, **kwargs)
        built = op.build_job_request_obj(context=None)
        # same name: pod hostnames <job>-<i> match TRAINYARD_TF_JOBS
        assert built.metadata.name == ours.metadata.name
        env = {e.name: e.value for e in built.spec.template.spec.containers[0].env}
        assert json.loads(env["TRAINYARD_TF_JOBS"])[role]["job"] == built.metadata.name
        spec = built.spec
        assert (spec.completion_mode, spec.completions, spec.parallelism, spec.backoff_limit) == (
            "Indexed",
            ours.spec.completions,
            ours.spec.parallelism,
            0,
        )
        assert spec.active_deadline_seconds == 900
        pod = spec.template.spec
        assert pod.subdomain == tr.service.metadata.name
        assert [c.name for c in pod.containers] == [k8s.BASE_CONTAINER]
        assert pod.containers[0].image == profile.images.trainer
        assert spec.template.metadata.labels["trainyard.io/run"] == tr.name
        if kueue:
            assert spec.suspend is True
            assert built.metadata.labels[k8s.KUEUE_QUEUE_LABEL] == tr.placement.kueue_queue
            assert built.metadata.labels[k8s.KUEUE_PRIORITY_LABEL] == "trainyard-high"
        assert k8s.validate_object(built) == []


@pytest.mark.parametrize(
    ("sidecar_context", "restricted"),
    [(True, True), (False, False)],
    ids=["sidecar restricted", "provider default sidecar is flagged"],
)
def test_pod_operator_xcom_sidecar(
    profile: k8s.ClusterProfile, kubeconfig: dict[str, Any], sidecar_context: bool, restricted: bool
) -> None:
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    pod = k8s.step_pod(
        profile, "stage", ["--pipeline", "digits"], "digits", pipeline="digits", writes_dataset=True
    )
    extra = (
        {"xcom_sidecar_container_security_context": k8s.xcom_sidecar_security_context()}
        if sidecar_context
        else {}
    )
    stage = KubernetesPodOperator(
        task_id="stage",
        namespace=profile.namespace,
        full_pod_spec=pod,
        do_xcom_push=True,
        **kubeconfig,
        **extra,
    )
    built = stage.build_pod_request_obj(context=None)
    names = [c.name for c in built.spec.containers]
    assert names == [k8s.BASE_CONTAINER, "airflow-xcom-sidecar"]
    assert built.spec.containers[0].command == ["python", "-m", "trainyard", "stage"]
    errors = k8s.validate_object(built)
    if restricted:
        assert errors == []
    else:
        assert any("containers[airflow-xcom-sidecar]" in e for e in errors), errors


def test_pod_operator_keeps_the_step_pods_pipeline_name_and_labels(
    profile: k8s.ClusterProfile, kubeconfig: dict[str, Any]
) -> None:
    # the operator cuts a name to 54 characters before its random suffix: the part that
    # tells two long pipeline names apart must survive, and so must our labels
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    built = []
    for pipeline in ("fraud_detection_transactions_for_the_europe_region_" + s for s in "ab"):
        pod = k8s.step_pod(
            profile,
            "evaluate",
            ["--pipeline", pipeline],
            "transactions",
            pipeline=pipeline,
            run_id="manual__1",
            writes_dataset=False,
        )
        evaluate = KubernetesPodOperator(
            task_id="evaluate",
            name=pod.metadata.name,
            namespace=profile.namespace,
            full_pod_spec=pod,
            do_xcom_push=True,
            xcom_sidecar_container_security_context=k8s.xcom_sidecar_security_context(),
            **kubeconfig,
        )
        b = evaluate.build_pod_request_obj(context=None)
        assert b.metadata.name.startswith(f"{k8s.step_pod_name('evaluate', pipeline)}-")
        assert b.metadata.labels[k8s.PIPELINE_LABEL] == pipeline.replace("_", "-")
        assert b.metadata.labels[k8s.RUN_LABEL] == k8s.run_name(pipeline, "manual__1")
        assert k8s.validate_object(b) == []
        built.append(b.metadata.name[: -len("-12345678")])
    assert built[0] != built[1]
