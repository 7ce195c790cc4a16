"""The same DAGs on the kubernetes runner: every task's pod or Job renders and is valid.

No cluster here: the operators build their real request objects (what they would send),
which are checked against the Kubernetes schema and Pod Security "restricted", XCom
sidecar included.
"""

from __future__ import annotations

import copy
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DAG_FILE = ROOT / "dags" / "trainyard_pipelines.py"


@pytest.fixture(scope="module")
def dag(tmp_path_factory: pytest.TempPathFactory):
    mp = pytest.MonkeyPatch()
    mp.setenv("TRAINYARD_RUNNER", "kubernetes")
    mp.setenv("TRAINYARD_VOLUME_ROOT", str(tmp_path_factory.mktemp("volumes")))
    try:
        namespace = runpy.run_path(str(DAG_FILE))
    finally:
        mp.undo()
    return namespace["trainyard_digits"]


def test_steps_are_pods_and_training_is_a_job_per_role(dag) -> None:
    from airflow.providers.cncf.kubernetes.operators.job import KubernetesJobOperator

    kinds = {t.task_id: type(t).__name__ for t in dag.tasks}
    for step in ("stage", "validate", "register", "evaluate", "deploy"):
        assert kinds[step] == "KubernetesPodOperator"
    roles = [f"train_{role}" for role in ("ps", "chief", "worker")]
    for task_id in roles:
        assert isinstance(dag.get_task(task_id), KubernetesJobOperator), kinds[task_id]
    assert dag.get_task("ensure_volumes").downstream_task_ids == {"stage"}
    assert dag.get_task("ensure_serving").downstream_task_ids == {"deploy"}
    assert "gate" in dag.get_task("ensure_serving").upstream_task_ids
    assert dag.get_task("create_training_service").downstream_task_ids >= set(roles)
    # ps and chief skip under multi_worker_mirrored: register still runs after the worker
    register = dag.get_task("register")
    assert register.upstream_task_ids == set(roles)
    assert register.trigger_rule == "none_failed_min_one_success"
    teardown = dag.get_task("delete_training_objects")
    assert teardown.is_teardown
    assert set(roles) <= teardown.upstream_task_ids


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


SNAPSHOT = "20240601-3f2a9c01"
ROLES = ("ps", "chief", "worker")
RUN_CASES = [
    # (trigger-form conf, replicas per started role, tier, epochs)
    ({}, {"worker": 2}, "high", 4),
    (
        {"workers": 3, "strategy": "parameter_server", "priority": "low", "epochs": 7},
        {"ps": 1, "chief": 1, "worker": 3},
        "low",
        7,
    ),
    ({"workers": 4, "priority": "low"}, {"worker": 4}, "low", 4),
    ({"strategy": "parameter_server", "workers": 1}, {"ps": 1, "chief": 1, "worker": 1}, "high", 4),
]
RUN_IDS = ["pipeline defaults", "ps 3 workers low", "mwms 4 workers low", "ps 1 worker high"]


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> str:
    # KubernetesJobOperator has no dry_run(): building its request loads a kube config (to
    # label the pod in-cluster or not) but sends nothing; this one names no real server.
    path = tmp_path_factory.mktemp("kube") / "config"
    path.write_text(KUBECONFIG)
    return str(path)


@pytest.fixture(scope="module")
def cluster_profile() -> dict:
    return yaml.safe_load((ROOT / "deploy" / "cluster_profile.yaml").read_text())


def _run_params(dag, conf: dict) -> dict:
    """The params a run triggered with ``conf`` gets: the form's defaults, validated."""
    params = copy.deepcopy(dag.params)
    params.update(conf)
    return params.validate()


def _role_task(dag, role: str, kubeconfig: str):
    """The role's task as it runs: its templated snapshot id rendered from stage's XCom."""
    op = copy.deepcopy(dag.get_task(f"train_{role}"))
    op.snapshot_id = SNAPSHOT
    op.config_file = kubeconfig
    return op


def _value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


@pytest.mark.parametrize(("conf", "replicas", "tier", "epochs"), RUN_CASES, ids=RUN_IDS)
def test_each_run_renders_its_jobs_from_the_trigger_form(
    dag, kubeconfig: str, cluster_profile: dict, conf, replicas, tier, epochs
) -> None:
    from trainyard import k8s
    from trainyard.airflow_k8s import ATTEMPT_RUN_ID

    params = _run_params(dag, conf)
    strategy = params["strategy"]
    base = k8s.training_base_name("digits", ATTEMPT_RUN_ID)
    pools = {p["name"]: p for p in cluster_profile["gpu_pools"]}
    tier_spec = cluster_profile["tiers"][tier]
    gpu_nodes = [pools[name]["node_labels"] for name in tier_spec["pools"]]
    tf_jobs = {r: {"job": k8s.job_name(base, r), "replicas": n} for r, n in replicas.items()}
    for role in replicas:
        op = _role_task(dag, role, kubeconfig)
        ours = op.render_job(params)
        job = op.build_job_request_obj()  # what the provider would create
        n = replicas[role]
        assert job.metadata.name == ours.metadata.name == k8s.job_name(base, role)
        spec = job.spec
        assert (spec.completion_mode, spec.completions, spec.parallelism) == ("Indexed", n, n)
        assert op.parallelism == n  # the provider waits for this many pods
        # under parameter_server only the chief finishes; ps and workers serve until teardown
        assert op.wait_until_job_complete is (
            strategy == "multi_worker_mirrored" or role == "chief"
        )
        pod = spec.template.spec
        assert pod.subdomain == base
        assert spec.template.metadata.labels[k8s.RUN_LABEL] == base
        container = pod.containers[0]
        env = {e.name: e.value for e in container.env}
        assert env["TRAINYARD_TF_TASK_TYPE"] == role
        assert json.loads(env["TRAINYARD_TF_JOBS"]) == tf_jobs
        args = container.args
        assert _value(args, "--strategy") == strategy
        assert _value(args, "--epochs") == str(epochs)
        assert _value(args, "--snapshot-dir").endswith(f"/snapshots/{SNAPSHOT}")
        assert pod.priority_class_name == tier_spec["priority_class"]
        if role == "ps":
            assert pod.node_selector == cluster_profile["cpu_pool"]["node_labels"]
            assert not pod.affinity
            assert "nvidia.com/gpu" not in (container.resources.limits or {})
        else:
            node = pod.affinity.node_affinity
            required = node.required_during_scheduling_ignored_during_execution
            assert [
                {e.key: e.values[0] for e in term.match_expressions}
                for term in required.node_selector_terms
            ] == gpu_nodes
            preferred = node.preferred_during_scheduling_ignored_during_execution
            assert [
                (p.weight, {e.key: e.values[0] for e in p.preference.match_expressions})
                for p in preferred
            ] == list(zip([100, 50, 25], gpu_nodes, strict=False))
            assert str(container.resources.limits["nvidia.com/gpu"]) == "1"
        assert k8s.validate_object(job) == [], f"{role}: {k8s.validate_object(job)}"


@pytest.mark.parametrize(
    "conf",
    [{}, {"workers": 5, "priority": "low"}],
    ids=["pipeline defaults", "5 workers low"],
)
def test_multi_worker_mirrored_runs_skip_chief_and_ps(dag, kubeconfig: str, conf) -> None:
    from airflow.sdk.exceptions import AirflowSkipException

    params = _run_params(dag, conf)
    assert params["strategy"] == "multi_worker_mirrored"
    for role in ("ps", "chief"):
        op = _role_task(dag, role, kubeconfig)
        with pytest.raises(AirflowSkipException, match=f"no {role} Job"):
            op.render_job(params)
        # execute() renders first, so the skip comes before any API call
        with pytest.raises(AirflowSkipException):
            op.execute({"params": params})


def test_parameter_server_without_parameter_servers_fails_without_retry() -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from trainyard import k8s
    from trainyard.airflow_k8s import run_training_objects
    from trainyard.config import parse_pipeline

    cfg = parse_pipeline(ROOT / "dags" / "pipelines" / "digits.yaml")
    profile = k8s.load_cluster_profile(ROOT / "deploy" / "cluster_profile.yaml")
    training = cfg.training.model_copy(
        update={"strategy": "parameter_server", "parameter_servers": 0}
    )
    with pytest.raises(AirflowFailException, match="parameter_servers"):
        run_training_objects(profile, cfg, training, SNAPSHOT)


@pytest.mark.parametrize(("conf", "replicas", "tier", "epochs"), RUN_CASES, ids=RUN_IDS)
def test_setup_teardown_and_register_follow_the_same_run_config(
    dag, kubeconfig: str, conf, replicas, tier, epochs
) -> None:
    """The Service, plan, teardown and registered params come from the run's config too."""
    from trainyard import k8s
    from trainyard.airflow import run_training_params
    from trainyard.airflow_k8s import ATTEMPT_RUN_ID, TRAINING_ROLES, run_training_objects
    from trainyard.config import parse_pipeline
    from trainyard.steps import training_params

    cfg = parse_pipeline(ROOT / "dags" / "pipelines" / "digits.yaml")
    profile = k8s.load_cluster_profile(ROOT / "deploy" / "cluster_profile.yaml")
    params = _run_params(dag, conf)
    training = run_training_params(cfg, params)
    attempt = run_training_objects(profile, cfg, training, SNAPSHOT)
    # the setup task's Service is the subdomain of every pod the role tasks create
    for role in replicas:
        job = _role_task(dag, role, kubeconfig).render_job(params)
        assert job.spec.template.spec.subdomain == attempt.service.metadata.name
    assert f"strategy {params['strategy']}" in attempt.plan[0]
    assert any(line.startswith(f"tier {tier!r}") for line in attempt.plan)
    assert k8s.validate_object(attempt.service) == []
    # the teardown deletes every role's Job, whatever the strategy, and this Service
    base = k8s.training_base_name("digits", ATTEMPT_RUN_ID)
    assert attempt.name == base
    assert {j.metadata.name for j in attempt.jobs} <= {
        k8s.job_name(base, r) for r in TRAINING_ROLES
    }
    assert (training.workers, training.strategy, training.priority, training.epochs) == (
        replicas["worker"],
        params["strategy"],
        tier,
        epochs,
    )
    # register records the run's config: the setup task's XCom, rendered into the register
    # pod's --overrides and read back by the register CLI
    setup_xcom = {"create_training_service": training.model_dump()}

    class XComs:  # the run's XCom store, as templates see it through ``ti``
        def xcom_pull(self, task_ids: str) -> object:
            return setup_xcom[task_ids]

    args = dag.get_task("register").arguments
    template = args[args.index("--overrides") + 1]
    rendered = dag.get_template_env().from_string(template).render(ti=XComs())
    assert training_params(cfg, json.loads(rendered)) == training


def test_kubernetes_dag_serializes(dag) -> None:
    """The scheduler can store and load the DAG, role tasks and their snapshot template."""
    from airflow.serialization.serialized_objects import DagSerialization

    loaded = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    for role in ROLES:
        task = loaded.get_task(f"train_{role}")
        assert task.task_type == "TrainingJobOperator"
        assert "snapshot_id" in task.template_fields
        assert task.snapshot_id == "{{ ti.xcom_pull(task_ids='stage')['snapshot_id'] }}"


def test_kubernetes_dag_parse_is_free(tmp_path: Path) -> None:
    """Parsing with the kubernetes runner issues no SQL and imports no heavy library."""
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join([str(ROOT / "plugins"), str(ROOT)]),
        AIRFLOW__SECRETS__BACKEND="tests.dags.raising_secrets.RaisingSecretsBackend",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="sqlite:////nonexistent/dir/airflow.db",
        TRAINYARD_PROJECT_DIR=str(ROOT),
        TRAINYARD_RUNNER="kubernetes",
        TRAINYARD_VOLUME_ROOT=str(tmp_path),
    )
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("parse_probe.py")), str(DAG_FILE)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    probe = json.loads(proc.stdout.strip().splitlines()[-1])
    assert probe["sql_statements"] == []
    assert probe["heavy_modules"] == []
    for task_ids in probe["dags"].values():
        assert {"train_ps", "train_chief", "train_worker"} <= set(task_ids)


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
