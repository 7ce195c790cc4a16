"""The same DAGs on the kubernetes runner: every task's pod or Job renders and is valid.

No cluster here: the operators build their real request objects (what they would send),
which are checked against the Kubernetes schema and Pod Security "restricted", XCom
sidecar included.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import logging
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DAG_FILE = ROOT / "dags" / "trainyard_pipelines.py"


def _build_dags(runner: str, volume_root: Path) -> dict:
    mp = pytest.MonkeyPatch()
    mp.setenv("TRAINYARD_RUNNER", runner)
    mp.setenv("TRAINYARD_VOLUME_ROOT", str(volume_root))
    try:
        namespace = runpy.run_path(str(DAG_FILE))
    finally:
        mp.undo()
    return {k: v for k, v in namespace.items() if k.startswith("trainyard_")}


@pytest.fixture(scope="module")
def k8s_dags(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _build_dags("kubernetes", tmp_path_factory.mktemp("volumes"))


@pytest.fixture(scope="module")
def local_dags(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _build_dags("local", tmp_path_factory.mktemp("volumes"))


@pytest.fixture(scope="module")
def dag(k8s_dags: dict):
    return k8s_dags["trainyard_digits"]


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


# ------------------------------------------------------------ whether a run trains at all

TRAINING_TASKS = (
    "train_ps",
    "train_chief",
    "train_worker",
    "register",
    "evaluate",
    "gate",
    "ensure_serving",
    "deploy",
    "delete_training_objects",
)


def test_a_skipped_training_setup_skips_training_and_deploy(k8s_dags: dict) -> None:
    """When the setup skips, every task after it skips by its trigger rule: nothing runs."""
    for dag in k8s_dags.values():
        setup = dag.get_task("create_training_service")
        after = setup.get_flat_relative_ids(upstream=False)
        assert set(TRAINING_TASKS) <= after
        teardown = dag.get_task("delete_training_objects")
        assert [t for t in teardown.upstream_list if t.is_setup] == [setup]
        state = {setup.task_id: "skipped"}
        for task in dag.topological_sort():
            if task.task_id not in after:
                continue
            ups = [state.get(u, "success") for u in task.upstream_task_ids]
            rule = str(task.trigger_rule.value)
            if rule == "all_success":
                skips = "skipped" in ups
            elif rule == "none_failed_min_one_success":
                skips = "success" not in ups
            elif rule == "all_done_setup_success":  # a teardown: skips when its setups did
                skips = all(
                    state.get(s.task_id) == "skipped" for s in task.upstream_list if s.is_setup
                )
            else:
                raise AssertionError(f"{task.task_id}: unexpected trigger rule {rule}")
            state[task.task_id] = "skipped" if skips else "success"
        assert {t: state[t] for t in TRAINING_TASKS} == dict.fromkeys(TRAINING_TASKS, "skipped")


class DagRunCounts:
    """What the training decision asks ``ti``: how many runs of a DAG are queued."""

    def __init__(self, queued: int) -> None:
        self.queued = queued
        self.asked: list[tuple[str, list[str] | None]] = []

    def get_dr_count(self, dag_id: str, states: list[str] | None = None, **_: object) -> int:
        self.asked.append((dag_id, states))
        return self.queued


def _context(dag, conf: dict, run_type: str, queued: int) -> dict:
    """A task's context in a run of ``dag``: the form's params, the DagRun, ``ti``."""
    from airflow.sdk.api.datamodels._generated import DagRun, DagRunState, DagRunType

    end = dt.datetime(2026, 11, 20, tzinfo=dt.UTC)
    dag_run = DagRun(
        dag_id=dag.dag_id,
        run_id=f"{run_type}__{end.isoformat()}",
        logical_date=end,
        data_interval_start=end - dt.timedelta(days=1),
        data_interval_end=end,
        run_after=end,
        start_date=end,
        end_date=None,
        run_type=DagRunType(run_type),
        state=DagRunState.RUNNING,
        consumed_asset_events=[],
        partition_key=None,
    )
    params = _run_params(dag, conf)
    return {
        "params": params,
        "dag_run": dag_run,
        "ti": DagRunCounts(queued),
        "run_id": dag_run.run_id,
    }


STAGED = {"snapshot_id": SNAPSHOT, "reused": False}
SKIP_CASES = [
    # (pipeline, trigger-form conf, run type, runs still queued, the skip's reason)
    ("digits", {"dry_run": True}, "manual", 0, "dry run: stopping before training"),
    ("transactions", {"dry_run": True, "workers": 4}, "scheduled", 0, "dry run: stopping"),
    ("transactions", {}, "backfill", 2, "backfill run with 2 later interval(s) still queued"),
    ("digits", {"dry_run": True}, "backfill", 1, "backfill run with 1 later interval(s)"),
    ("transactions", {"dry_run": True}, "backfill", 0, "dry run: stopping before training"),
]
SKIP_IDS = [
    "dry run manual",
    "dry run scheduled",
    "backfill not last",
    "backfill not last and dry run",
    "backfill last but dry run",
]


@pytest.mark.parametrize(
    ("pipeline", "conf", "run_type", "queued", "reason"), SKIP_CASES, ids=SKIP_IDS
)
def test_runs_that_do_not_train_skip_alike_on_both_runners(
    k8s_dags: dict, local_dags: dict, pipeline, conf, run_type, queued, reason
) -> None:
    """The cluster's setup task skips (before any API call) exactly as the local train task."""
    from airflow.sdk.exceptions import AirflowSkipException

    dag_id = f"trainyard_{pipeline}"
    k8s_dag, local_dag = k8s_dags[dag_id], local_dags[dag_id]
    k8s_context = _context(k8s_dag, conf, run_type, queued)
    setup = k8s_dag.get_task("create_training_service").python_callable
    with pytest.raises(AirflowSkipException, match=re.escape(reason)) as on_k8s:
        setup(STAGED, **k8s_context)
    local_context = _context(local_dag, conf, run_type, queued)
    train = local_dag.get_task("train").python_callable
    with pytest.raises(AirflowSkipException) as on_local:
        train(STAGED, {"success": True}, **local_context)
    assert str(on_k8s.value) == str(on_local.value)
    asked = [(dag_id, ["queued"])] if run_type == "backfill" else []
    assert k8s_context["ti"].asked == local_context["ti"].asked == asked


def test_a_dry_run_on_the_cluster_logs_the_runs_plan(dag, caplog: pytest.LogCaptureFixture) -> None:
    from airflow.sdk.exceptions import AirflowSkipException

    from trainyard import k8s
    from trainyard.airflow_k8s import ATTEMPT_RUN_ID

    conf = {"dry_run": True, "strategy": "parameter_server", "workers": 3, "priority": "low"}
    context = _context(dag, conf, "manual", 0)
    setup = dag.get_task("create_training_service").python_callable
    with (
        caplog.at_level(logging.INFO, logger="trainyard.airflow"),
        pytest.raises(AirflowSkipException),
    ):
        setup(STAGED, **context)
    base = k8s.training_base_name("digits", ATTEMPT_RUN_ID)
    logged = caplog.text
    assert '"strategy":"parameter_server","workers":3' in logged
    assert f"training attempt {base}: strategy parameter_server" in logged
    assert "worker: 3 pod(s)" in logged
    assert "tier 'low'" in logged


@pytest.mark.parametrize(
    ("policy", "run_type", "queued", "trains", "asks"),
    [
        ("last", "scheduled", 0, True, False),
        ("last", "manual", 0, True, False),
        ("last", "asset_triggered", 0, True, False),
        ("last", "backfill", 0, True, True),
        ("last", "backfill", 3, False, True),
        ("each", "backfill", 3, True, False),
        ("none", "backfill", 0, False, False),
        ("none", "scheduled", 0, True, False),
    ],
)
def test_training_decision_follows_the_backfill_policy(
    dag, policy: str, run_type: str, queued: int, trains: bool, asks: bool
) -> None:
    """The decision both runners take: the run's training config, or a skip with the reason."""
    from airflow.sdk.exceptions import AirflowSkipException

    from trainyard.airflow import run_training_or_skip, run_training_params, should_train
    from trainyard.config import parse_pipeline

    base = parse_pipeline(ROOT / "dags" / "pipelines" / "digits.yaml")
    cfg = base.model_copy(update={"backfill_training": policy})
    context = _context(dag, {"workers": 3}, run_type, queued)
    if trains:
        training = run_training_or_skip(cfg, context)
        assert training == run_training_params(cfg, context["params"])
        assert training.workers == 3
    else:
        with pytest.raises(AirflowSkipException) as skip:
            run_training_or_skip(cfg, context)
        assert str(skip.value) == should_train(policy, run_type, queued)[1]
    assert bool(context["ti"].asked) is asks


# ------------------------------------------------- objects an earlier run left behind


class Cluster:
    """The API calls of the training setup and role tasks, on objects held in memory.

    It serves as the core and batch API clients and as the ``KubernetesHook`` the provider
    creates Jobs through; deletions finish at once.
    """

    def __init__(self, *objects) -> None:
        self.objects = {(o.kind, o.metadata.namespace, o.metadata.name): o for o in objects}
        self.deleted: list[tuple[str, str, str | None]] = []

    @property
    def batch_v1_client(self) -> Cluster:
        return self

    def _create(self, kind: str, namespace: str, body):
        from kubernetes.client.exceptions import ApiException

        key = (kind, namespace, body.metadata.name)
        if key in self.objects:
            raise ApiException(status=409, reason="AlreadyExists")
        self.objects[key] = body
        return body

    def _read(self, kind: str, namespace: str, name: str):
        from kubernetes.client.exceptions import ApiException

        if (kind, namespace, name) not in self.objects:
            raise ApiException(status=404, reason="NotFound")
        return self.objects[(kind, namespace, name)]

    def _delete(self, kind: str, namespace: str, name: str, body=None) -> None:
        self._read(kind, namespace, name)
        del self.objects[(kind, namespace, name)]
        self.deleted.append((kind, name, body.propagation_policy if body else None))

    def create_namespaced_service(self, namespace: str, body):
        return self._create("Service", namespace, body)

    def read_namespaced_service(self, name: str, namespace: str):
        return self._read("Service", namespace, name)

    def delete_namespaced_service(self, name: str, namespace: str) -> None:
        self._delete("Service", namespace, name)

    def create_job(self, job):
        return self._create("Job", job.metadata.namespace, job)

    def read_namespaced_job(self, name: str, namespace: str):
        return self._read("Job", namespace, name)

    def delete_namespaced_job(self, name: str, namespace: str, body=None) -> None:
        self._delete("Job", namespace, name, body)


def test_a_service_left_behind_is_replaced_by_this_runs(dag) -> None:
    from trainyard import k8s
    from trainyard.airflow import run_training_params
    from trainyard.airflow_k8s import replace_training_service, run_training_objects
    from trainyard.config import parse_pipeline

    cfg = parse_pipeline(ROOT / "dags" / "pipelines" / "digits.yaml")
    profile = k8s.load_cluster_profile(ROOT / "deploy" / "cluster_profile.yaml")
    service = run_training_objects(
        profile, cfg, run_training_params(cfg, _run_params(dag, {})), SNAPSHOT
    ).service
    key = ("Service", service.metadata.namespace, service.metadata.name)
    leftover = copy.deepcopy(service)
    leftover.metadata.labels = {"left": "behind"}

    cluster = Cluster(leftover)
    assert replace_training_service(cluster, service) is True
    assert cluster.objects[key] is service
    assert cluster.deleted == [("Service", service.metadata.name, None)]

    cluster = Cluster()
    assert replace_training_service(cluster, service) is False
    assert cluster.objects == {key: service}
    assert cluster.deleted == []


def test_a_job_left_behind_is_deleted_foreground_then_this_runs_created(
    dag, kubeconfig: str
) -> None:
    earlier = _role_task(dag, "worker", kubeconfig)
    earlier.render_job(_run_params(dag, {}))
    leftover = earlier.build_job_request_obj()
    op = _role_task(dag, "worker", kubeconfig)
    op.render_job(_run_params(dag, {"workers": 4}))
    job = op.build_job_request_obj()
    name, ns = job.metadata.name, job.metadata.namespace
    assert (name, ns) == (leftover.metadata.name, leftover.metadata.namespace)

    for cluster, deleted in [
        (Cluster(leftover), [("Job", name, "Foreground")]),
        (Cluster(), []),
    ]:
        # the provider creates Jobs through its hook and deletes them through its client
        op.__dict__.update(hook=cluster, job_client=cluster)
        assert op.create_job(job) is job
        assert cluster.objects == {("Job", ns, name): job}
        assert cluster.objects[("Job", ns, name)].spec.parallelism == 4
        assert cluster.deleted == deleted


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


# ------------------------------------------------------- VolumeSnapshot of the dataset PVC

SNAPSHOT_CLASS = "csi-snap"


def _dag_with(
    tmp_path: Path,
    volume_snapshot_class: str | None = None,
    profile_class: str | None = None,
    runner: str = "kubernetes",
):
    """digits on a runner, a snapshot class in its staging or in the cluster profile."""
    import dataclasses

    from trainyard.airflow import build_dag
    from trainyard.config import parse_pipeline
    from trainyard.settings import get_settings

    cfg = parse_pipeline(ROOT / "dags" / "pipelines" / "digits.yaml")
    staging = cfg.staging.model_copy(update={"volume_snapshot_class": volume_snapshot_class})
    profile = yaml.safe_load((ROOT / "deploy" / "cluster_profile.yaml").read_text())
    profile["storage"]["volume_snapshot_class"] = profile_class
    profile_path = tmp_path / "cluster_profile.yaml"
    profile_path.write_text(yaml.safe_dump(profile))
    settings = dataclasses.replace(
        get_settings(),
        runner=runner,
        volume_root=tmp_path / "volumes",
        cluster_profile=profile_path,
    )
    return build_dag(cfg.model_copy(update={"staging": staging}), settings)


def test_no_volume_snapshot_unless_a_class_is_set(
    k8s_dags: dict, local_dags: dict, tmp_path: Path
) -> None:
    """Off by default; the local runner's dataset volume is a directory: never one there."""
    for dag in [*k8s_dags.values(), *local_dags.values()]:
        assert "volume_snapshot" not in dag.task_ids
    assert "volume_snapshot" not in _dag_with(tmp_path).task_ids
    local = _dag_with(tmp_path, SNAPSHOT_CLASS, SNAPSHOT_CLASS, runner="local")
    assert "volume_snapshot" not in local.task_ids


@pytest.mark.parametrize(
    ("pipeline_class", "profile_class"),
    [(SNAPSHOT_CLASS, None), (None, SNAPSHOT_CLASS), (SNAPSHOT_CLASS, "profile-snap")],
    ids=["pipeline", "profile default", "pipeline over profile"],
)
def test_a_snapshot_class_adds_the_task_after_publish(
    tmp_path: Path, pipeline_class, profile_class
) -> None:
    from airflow.serialization.serialized_objects import DagSerialization

    dag = _dag_with(tmp_path, pipeline_class, profile_class)
    snap = dag.get_task("volume_snapshot")
    # after publish_snapshot, which skips for a reused snapshot: this task skips with it
    assert snap.upstream_task_ids == {"stage", "publish_snapshot"}
    assert str(snap.trigger_rule.value) == "all_success"
    assert snap.downstream_task_ids == set()
    assert snap.execution_timeout == dt.timedelta(seconds=1800 + 300)
    loaded = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    assert loaded.get_task("volume_snapshot").upstream_task_ids == snap.upstream_task_ids


def test_a_reused_snapshot_takes_no_volume_snapshot(tmp_path: Path) -> None:
    """The skip comes before any API call (no hook, no cluster here)."""
    from airflow.sdk.exceptions import AirflowSkipException

    snap = _dag_with(tmp_path, SNAPSHOT_CLASS).get_task("volume_snapshot")
    for staged in (
        {"snapshot_id": SNAPSHOT, "reused": True, "given": False},
        {"snapshot_id": SNAPSHOT, "reused": True, "given": True},
    ):
        with pytest.raises(AirflowSkipException, match="was reused: no volume snapshot"):
            snap.python_callable(staged)


class VolumeSnapshots:
    """``CustomObjectsApi``'s VolumeSnapshot calls on objects held in memory.

    After creation each read serves the next of ``statuses`` (the snapshot controller's
    progress), the last one from then on. ``race``: another creator wins the create (409).
    """

    def __init__(self, *statuses: dict, existing: dict | None = None, race: bool = False):
        self.statuses = statuses or ({"readyToUse": True},)
        self.objects: dict[tuple[str, str], dict] = {}
        self.race = race
        self.created: list[str] = []
        self.reads = 0
        if existing is not None:
            self._store(existing)

    def _store(self, body: dict) -> None:
        meta = body["metadata"]
        self.objects[(meta["namespace"], meta["name"])] = copy.deepcopy(body)

    def create_namespaced_custom_object(self, group, version, namespace, plural, body):
        from kubernetes.client.exceptions import ApiException

        assert (group, version, plural) == ("snapshot.storage.k8s.io", "v1", "volumesnapshots")
        assert body["metadata"]["namespace"] == namespace
        if self.race:
            self._store(body)
        if (namespace, body["metadata"]["name"]) in self.objects:
            raise ApiException(status=409, reason="AlreadyExists")
        self._store(body)
        self.created.append(body["metadata"]["name"])
        return body

    def get_namespaced_custom_object(self, group, version, namespace, plural, name):
        from kubernetes.client.exceptions import ApiException

        assert (group, version, plural) == ("snapshot.storage.k8s.io", "v1", "volumesnapshots")
        if (namespace, name) not in self.objects:
            raise ApiException(status=404, reason="NotFound")
        obj = copy.deepcopy(self.objects[(namespace, name)])
        obj["status"] = self.statuses[min(self.reads, len(self.statuses) - 1)]
        self.reads += 1
        return obj


def _snapshot_body() -> dict:
    from trainyard import k8s

    profile = k8s.load_cluster_profile(ROOT / "deploy" / "cluster_profile.yaml")
    return k8s.volume_snapshot(profile, "digits", SNAPSHOT, SNAPSHOT_CLASS)


READY = {"readyToUse": True, "restoreSize": "10Gi", "boundVolumeSnapshotContentName": "sc-1"}


@pytest.mark.parametrize(
    ("statuses", "existing", "race", "created"),
    [
        (({}, {"readyToUse": False}, READY), False, False, True),
        ((READY,), True, False, False),
        ((READY,), False, True, False),
    ],
    ids=["missing: created", "re-run: exists", "concurrent create: 409"],
)
def test_take_volume_snapshot_creates_once_and_waits(
    statuses: tuple[dict, ...], existing: bool, race: bool, created: bool
) -> None:
    from trainyard.airflow_k8s import take_volume_snapshot

    body = _snapshot_body()
    api = VolumeSnapshots(*statuses, existing=body if existing else None, race=race)
    name = f"trainyard-data-digits-{SNAPSHOT}"
    result = take_volume_snapshot(api, body, timeout_s=5, poll_s=0)
    assert result == {
        "name": name,
        "namespace": "trainyard",
        "pvc": "trainyard-data-digits",
        "created": created,
        "restore_size": "10Gi",
        "content": "sc-1",
    }
    assert api.created == ([name] if created else [])
    assert list(api.objects) == [("trainyard", name)]


def test_take_volume_snapshot_fails_naming_the_object() -> None:
    from trainyard.airflow_k8s import take_volume_snapshot
    from trainyard.k8s.apply import VolumeSnapshotError

    error = {"readyToUse": False, "error": {"message": "CSI driver: snapshot quota exceeded"}}
    with pytest.raises(VolumeSnapshotError) as e:
        take_volume_snapshot(VolumeSnapshots({}, error), _snapshot_body(), timeout_s=5, poll_s=0)
    assert str(e.value) == (
        f"VolumeSnapshot trainyard/trainyard-data-digits-{SNAPSHOT} of PVC "
        "trainyard-data-digits failed: CSI driver: snapshot quota exceeded"
    )
    with pytest.raises(TimeoutError, match=f"trainyard-data-digits-{SNAPSHOT} .* still not ready"):
        take_volume_snapshot(
            VolumeSnapshots({"readyToUse": False}), _snapshot_body(), timeout_s=0.05, poll_s=0.01
        )
