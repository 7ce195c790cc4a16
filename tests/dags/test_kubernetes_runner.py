"""The same DAGs on the kubernetes runner: every task's pod or Job renders and is valid.

No cluster here: the operators build their real request objects (what they would send),
which are checked against the Kubernetes schema and Pod Security "restricted", XCom
sidecar included.
"""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dag(tmp_path_factory: pytest.TempPathFactory):
    mp = pytest.MonkeyPatch()
    mp.setenv("TRAINYARD_RUNNER", "kubernetes")
    mp.setenv("TRAINYARD_VOLUME_ROOT", str(tmp_path_factory.mktemp("volumes")))
    try:
        namespace = runpy.run_path(str(ROOT / "dags" / "trainyard_pipelines.py"))
    finally:
        mp.undo()
    return namespace["trainyard_digits"]


def test_steps_are_pods_and_training_is_a_job(dag) -> None:
    kinds = {t.task_id: type(t).__name__ for t in dag.tasks}
    for step in ("stage", "validate", "register", "evaluate", "deploy"):
        assert kinds[step] == "KubernetesPodOperator"
    assert kinds["train_worker"] == "KubernetesJobOperator"
    assert dag.get_task("ensure_volumes").downstream_task_ids == {"stage"}
    assert dag.get_task("ensure_serving").downstream_task_ids == {"deploy"}
    assert "gate" in dag.get_task("ensure_serving").upstream_task_ids
    teardown = dag.get_task("delete_training_objects")
    assert teardown.is_teardown
    assert "train_worker" in teardown.upstream_task_ids


def test_step_pods_are_valid_and_restricted(dag) -> None:
    from trainyard.k8s import validate_object

    for step in ("stage", "validate", "register", "evaluate", "deploy"):
        op = dag.get_task(step)
        pod = op.build_pod_request_obj(dry_run=True)
        names = [c.name for c in pod.spec.containers]
        assert "airflow-xcom-sidecar" in names, names
        errors = validate_object(pod)
        assert errors == [], f"{step}: {errors}"


KUBECONFIG = """
apiVersion: v1
kind: Config
clusters: [{name: offline, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: offline, user: {token: unused}}]
contexts: [{name: offline, context: {cluster: offline, user: offline}}]
current-context: offline
"""


def test_training_job_is_indexed_and_restricted(dag, tmp_path: Path) -> None:
    from trainyard.k8s import validate_object

    # KubernetesJobOperator has no dry_run(): building its request loads a kube config (to
    # label the pod in-cluster or not) but sends nothing; this one names no real server.
    (tmp_path / "kubeconfig").write_text(KUBECONFIG)
    op = dag.get_task("train_worker")
    op.config_file = str(tmp_path / "kubeconfig")
    job = op.build_job_request_obj()
    assert job.spec.completion_mode == "Indexed"
    assert job.spec.completions == job.spec.parallelism == 2
    container = job.spec.template.spec.containers[0]
    env = {e.name: e.value for e in container.env or []}
    assert "TRAINYARD_TF_JOBS" in env and env["TRAINYARD_TF_TASK_TYPE"] == "worker"
    assert container.resources.limits["nvidia.com/gpu"] in (1, "1")
    assert "{{ params.epochs }}" in op.arguments
    assert validate_object(job) == []


def test_a_privileged_pod_is_rejected() -> None:
    from kubernetes.client import V1Container, V1Pod, V1PodSpec, V1SecurityContext

    from trainyard.k8s import validate_object

    pod = V1Pod(
        api_version="v1",
        kind="Pod",
        metadata={"name": "bad"},
        spec=V1PodSpec(
            containers=[
                V1Container(
                    name="c", image="x:1", security_context=V1SecurityContext(privileged=True)
                )
            ]
        ),
    )
    assert any("privileged" in e for e in validate_object(pod))
