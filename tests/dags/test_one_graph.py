"""One graph, one step table, two runners: what the cluster runs is what the CLI has.

No cluster here: the operators build their real request objects (what they would send),
which are checked against the Kubernetes schema and Pod Security "restricted"; the API
calls of the training launch are served by small in-memory fakes at the client boundary.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
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
PIPELINES = sorted(p.stem for p in (ROOT / "dags" / "pipelines").glob("*.yaml"))
SNAPSHOT = "20240601-3f2a9c01"
KUBECONFIG = """
apiVersion: v1
kind: Config
clusters: [{name: offline, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: offline, user: {token: unused}}]
contexts: [{name: offline, context: {cluster: offline, user: offline}}]
current-context: offline
"""


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
def profile():
    from trainyard import k8s

    return k8s.load_cluster_profile(ROOT / "deploy" / "cluster_profile.yaml")


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("kube") / "config"
    path.write_text(KUBECONFIG)
    return str(path)


def _cfg(name: str = "digits"):
    from trainyard.config import parse_pipeline

    return parse_pipeline(ROOT / "dags" / "pipelines" / f"{name}.yaml")


def _shape(dag) -> dict:
    return {
        t.task_id: (
            type(t).__name__,
            getattr(t, "step", None),
            sorted(t.upstream_task_ids),
            sorted(t.downstream_task_ids),
            str(t.trigger_rule.value),
            t.retries,
            # training waits in the runner's pool: one per GPU tier on a cluster
            "training" if t.pool.startswith("trainyard_training") else t.pool,
            t.execution_timeout,
            sorted(getattr(o, "name", str(o)) for o in t.outlets or []),
        )
        for t in dag.tasks
    }


# ------------------------------------------------------------------ one graph


def test_both_runners_build_the_same_graph(k8s_dags: dict, local_dags: dict) -> None:
    """Same task ids, operators, edges, trigger rules, retries, pools, timeouts, outlets."""
    assert sorted(k8s_dags) == sorted(local_dags) == [f"trainyard_{p}" for p in PIPELINES]
    for dag_id, dag in k8s_dags.items():
        assert _shape(dag) == _shape(local_dags[dag_id]), dag_id
        assert set(dag.task_ids) == {
            "stage",
            "validate",
            "publish_snapshot",
            "train",
            "register",
            "evaluate",
            "gate",
            "deploy",
            "summary",
        }


def test_a_changed_graph_is_noticed(k8s_dags: dict) -> None:
    """The comparison above sees a difference of one edge or one retry count."""
    dag = k8s_dags["trainyard_digits"]
    shape = _shape(dag)
    changed = copy.deepcopy(shape)
    changed["register"] = (*changed["register"][:5], 7, *changed["register"][6:])
    assert changed != shape


def test_step_tasks_declare_only_arguments_their_step_has(k8s_dags: dict) -> None:
    from trainyard.steps import STEPS

    for dag in k8s_dags.values():
        for task in dag.tasks:
            if not hasattr(task, "step"):
                continue
            args = {a.name: a for a in STEPS[task.step].args}
            assert set(task.inputs) <= set(args), task.task_id
            required = {n for n, a in args.items() if a.required} - {"pipeline"}
            assert required <= set(task.inputs), task.task_id


# ------------------------------------------------------------------ one step table


def _containers(objs: list) -> list:
    out = []
    for obj in objs:
        if obj.kind == "Pod":
            out += obj.spec.containers
        elif obj.kind == "Job":
            out += obj.spec.template.spec.containers
    return out


def _every_rendered_object(profile) -> list:
    from trainyard.k8s.render import run_training_objects
    from trainyard.pods import render_objects
    from trainyard.steps import training_params

    objs = []
    for name in PIPELINES:
        cfg = _cfg(name)
        objs += render_objects(profile, cfg, "all", snapshot=SNAPSHOT, version=3, run_id="r1")
        for strategy in ("multi_worker_mirrored", "parameter_server"):
            training = training_params(cfg, {"strategy": strategy, "workers": 3})
            tr = run_training_objects(profile, cfg, training, SNAPSHOT, "manual__2026")
            objs += [tr.service, *tr.jobs]
        # a training window: one --snapshot-dir per snapshot
        window = ["20240530-0a0b0c0d", "20240531-1a1b1c1d", SNAPSHOT]
        tr = run_training_objects(
            profile, cfg, training_params(cfg, {}), SNAPSHOT, "manual__2026", window=window
        )
        assert all(c.args.count("--snapshot-dir") == 3 for c in _containers(tr.jobs))
        objs += [tr.service, *tr.jobs]
    return objs


def test_every_pod_and_job_runs_a_command_the_cli_accepts(profile) -> None:
    """Each container's exact command line goes through the CLI's own parser."""
    from trainyard.cli import commands, parse_command

    containers = _containers(_every_rendered_object(profile))
    seen = set()
    for c in containers:
        assert c.command[:3] == ["python", "-m", "trainyard"], c.command
        argv = [*c.command[3:], *(c.args or [])]
        assert argv[0] in commands()
        parse_command(argv)  # exits 2 on an unknown command or flag
        seen.add(argv[0])
    # the train step's own command is the laptop's shortcut; on a cluster training is the
    # plan pod (train or reuse), the worker Jobs, then the register pod
    assert seen == {
        "stage",
        "validate",
        "plan",
        "register",
        "evaluate",
        "deploy",
        "summary",
        "worker",
    }


@pytest.mark.parametrize(
    "argv",
    [
        ["registr", "--pipeline", "digits"],
        ["register", "--pipeline", "digits", "--output-dir", "/x"],
        ["validate", "--pipeline", "digits"],
        ["worker", "--snapshot-dir", "/x"],
    ],
    ids=["unknown command", "unknown flag", "missing required", "worker missing required"],
)
def test_the_parser_check_refuses_what_the_cli_would(argv: list[str]) -> None:
    from trainyard.cli import parse_command

    with pytest.raises(SystemExit) as e:
        parse_command(argv)
    assert e.value.code == 2
    proc = subprocess.run(
        [sys.executable, "-m", "trainyard", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "plugins")},
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr


def test_every_rendered_object_is_valid_and_restricted(profile) -> None:
    from trainyard.k8s import validate_object

    objs = _every_rendered_object(profile)
    for obj in objs:
        assert validate_object(obj) == [], obj.metadata.name
    for c in _containers(objs):
        assert c.security_context.read_only_root_filesystem is True, c.name


def test_step_pods_through_the_pod_operator_are_valid(profile) -> None:
    """What KubernetesPodOperator would send, XCom sidecar included."""
    from trainyard.k8s import validate_object
    from trainyard.orchestration.runners import step_pod_operator
    from trainyard.pods import SAMPLE_VALUES, step_pod

    cfg = _cfg()
    for step, values in SAMPLE_VALUES.items():
        filled = {
            k: {"{snapshot}": SNAPSHOT, "{version}": 2, "{run_id}": "r"}.get(v, v)
            if isinstance(v, str)
            else v
            for k, v in values.items()
        }
        op = step_pod_operator(step_pod(profile, cfg, step, filled), profile, step)
        pod = op.build_pod_request_obj(dry_run=True)
        assert "airflow-xcom-sidecar" in [c.name for c in pod.spec.containers]
        assert validate_object(pod) == [], step


def test_role_jobs_through_the_job_operator_are_valid(profile, kubeconfig: str) -> None:
    from trainyard.k8s import validate_object
    from trainyard.k8s.render import run_training_objects
    from trainyard.orchestration.runners import role_job_operator
    from trainyard.steps import training_params

    cfg = _cfg()
    training = training_params(cfg, {"strategy": "parameter_server", "workers": 2})
    objs = run_training_objects(profile, cfg, training, SNAPSHOT, "run-1")
    for job in objs.jobs:
        op = role_job_operator(job, "train", wait=True)
        op.config_file = kubeconfig
        built = op.build_job_request_obj()
        assert validate_object(built) == []
        assert built.spec.completion_mode == "Indexed"
        assert built.spec.template.spec.containers[0].command == [
            "python",
            "-m",
            "trainyard",
            "worker",
        ]


# ------------------------------------------------------------------ training decisions


class DagRunCounts:
    def __init__(self, queued: int) -> None:
        self.queued = queued
        self.asked: list = []

    def get_dr_count(self, dag_id: str, states=None, **_: object) -> int:
        self.asked.append((dag_id, states))
        return self.queued


def _run_params(dag, conf: dict) -> dict:
    params = copy.deepcopy(dag.params)
    params.update(conf)
    return params.validate()


def _context(dag, conf: dict, run_type: str, queued: int) -> dict:
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
        conf=conf,
    )
    return {
        "params": _run_params(dag, conf),
        "dag": dag,
        "dag_run": dag_run,
        "ti": DagRunCounts(queued),
        "run_id": dag_run.run_id,
    }


class Staged:
    """``ti`` with stage's and validate's results: the training task's snapshot and window."""

    def __init__(self, counts: DagRunCounts) -> None:
        self.counts = counts

    def xcom_pull(self, task_ids: str):
        assert task_ids in ("stage", "validate")
        if task_ids == "validate":
            return {"window": [{"snapshot_id": SNAPSHOT, "rows": 10}]}
        return {"snapshot_id": SNAPSHOT, "reused": False}

    def get_dr_count(self, *a, **kw):
        return self.counts.get_dr_count(*a, **kw)


SKIP_CASES = [
    ("digits", {"dry_run": True}, "manual", 0, "dry run: stopping before training"),
    ("transactions", {"dry_run": True, "workers": 4}, "scheduled", 0, "dry run: stopping"),
    ("transactions", {}, "backfill", 2, "backfill run with 2 later interval(s) still queued"),
    ("digits", {"dry_run": True}, "backfill", 1, "backfill run with 1 later interval(s)"),
    ("transactions", {"dry_run": True}, "backfill", 0, "dry run: stopping before training"),
]


@pytest.mark.parametrize(("pipeline", "conf", "run_type", "queued", "reason"), SKIP_CASES)
@pytest.mark.parametrize("runner", ["local", "kubernetes"])
def test_runs_that_do_not_train_skip_before_anything_starts(
    k8s_dags: dict, runner: str, pipeline, conf, run_type, queued, reason, monkeypatch
) -> None:
    """The same task skips alike under both runners, before any process or API call."""
    from airflow.sdk.exceptions import AirflowSkipException

    monkeypatch.setenv("TRAINYARD_RUNNER", runner)
    dag = k8s_dags[f"trainyard_{pipeline}"]
    context = _context(dag, conf, run_type, queued)
    counts = context["ti"]
    context["ti"] = Staged(counts)
    with pytest.raises(AirflowSkipException, match=re.escape(reason)):
        dag.get_task("train").execute(context)
    assert counts.asked == ([(dag.dag_id, ["queued"])] if run_type == "backfill" else [])


def test_a_dry_run_logs_the_runs_plan(k8s_dags: dict, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from airflow.sdk.exceptions import AirflowSkipException

    dag = k8s_dags["trainyard_digits"]
    conf = {"dry_run": True, "strategy": "parameter_server", "workers": 3, "priority": "low"}
    context = _context(dag, conf, "manual", 0)
    context["ti"] = Staged(context["ti"])
    with (
        caplog.at_level(logging.INFO, logger="trainyard.orchestration"),
        pytest.raises(AirflowSkipException),
    ):
        dag.get_task("train").execute(context)
    assert '"strategy":"parameter_server","workers":3' in caplog.text
    assert "strategy parameter_server" in caplog.text
    assert "worker: 3 pod(s)" in caplog.text
    assert "tier 'low'" in caplog.text


@pytest.mark.parametrize(
    ("policy", "run_type", "queued", "trains"),
    [
        ("last", "scheduled", 0, True),
        ("last", "backfill", 0, True),
        ("last", "backfill", 3, False),
        ("each", "backfill", 3, True),
        ("none", "backfill", 0, False),
        ("none", "scheduled", 0, True),
    ],
)
def test_training_decision_follows_the_backfill_policy(
    k8s_dags: dict, policy: str, run_type: str, queued: int, trains: bool
) -> None:
    from airflow.sdk.exceptions import AirflowSkipException

    from trainyard.orchestration.run_conf import run_training_or_skip, should_train

    cfg = _cfg().model_copy(update={"backfill_training": policy})
    context = _context(k8s_dags["trainyard_digits"], {"workers": 3}, run_type, queued)
    if trains:
        assert run_training_or_skip(cfg, context)[0].workers == 3
    else:
        with pytest.raises(AirflowSkipException) as skip:
            run_training_or_skip(cfg, context)
        assert str(skip.value) == should_train(policy, run_type, queued)[1]


@pytest.mark.parametrize(
    ("conf", "why"),
    [
        ({"force_promote": True}, "force promote needs a reason"),
        ({"force_promote": True, "force_reason": "   "}, "force promote needs a reason"),
        ({"epoch": 3}, "unknown key(s) in the run's conf: 'epoch' (the trigger form's: "),
    ],
    ids=["no-reason", "blank-reason", "typo"],
)
def test_the_first_step_refuses_a_conf_a_later_step_would(
    k8s_dags: dict, conf: dict, why: str, volume_root: Path
) -> None:
    """Found by a cold user: force promote without a reason failed only at the train
    task, after staging and validation had run; a typo in the conf was ignored. (And by
    another: the run's note and page did not say why; the task records it.)"""
    from airflow.sdk.exceptions import AirflowFailException

    from trainyard import runview

    dag = k8s_dags["trainyard_digits"]
    context = _context(dag, conf, "manual", 0)
    with pytest.raises(AirflowFailException, match=re.escape(why)):
        dag.get_task("stage").execute(context)  # before it resolves or stages anything
    reason = runview.run_failure(volume_root, "digits", context["run_id"], ["stage"])
    assert reason is not None and why in reason
    assert runview.run_failure(volume_root, "digits", context["run_id"], ["train"]) is None
    ok = _context(dag, {"force_promote": True, "force_reason": "a bad day"}, "manual", 0)
    from trainyard.orchestration.run_conf import check_run_conf

    assert check_run_conf(_cfg(), ok).epochs == _cfg().training.epochs


@pytest.mark.parametrize("runner", ["local", "kubernetes"])
def test_a_failed_training_task_records_why_for_the_runs_page(
    k8s_dags: dict, runner: str, volume_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a cold user: a run whose train task failed said "no reason recorded" on
    its page and note (only step tasks recorded theirs)."""
    from airflow.sdk.exceptions import AirflowFailException

    from trainyard import runview

    monkeypatch.setenv("TRAINYARD_RUNNER", runner)
    dag = k8s_dags["trainyard_digits"]
    context = _context(dag, {"epoch": 3}, "manual", 0)  # a train task cleared alone
    context["ti"] = Staged(context["ti"])
    with pytest.raises(AirflowFailException, match="unknown key"):
        dag.get_task("train").execute(context)
    reason = runview.run_failure(volume_root, "digits", context["run_id"], ["train"])
    assert reason is not None and "unknown key(s) in the run's conf: 'epoch'" in reason


@pytest.mark.parametrize("stop", ["TrainingError", "AirflowTaskTerminated"])
def test_a_task_stopped_from_outside_records_why(
    k8s_dags: dict, volume_root: Path, stop: str
) -> None:
    """Found by a cold user: a run marked failed in the middle of training said "no
    reason recorded" on its note, though its task had logged ``TrainingError: training
    stopped by SIGTERM`` (only Airflow's own exceptions were recorded)."""
    from airflow.sdk.exceptions import AirflowTaskTerminated

    from trainyard import runview
    from trainyard.errors import TrainingError
    from trainyard.orchestration.runners import recording_failure

    context = _context(k8s_dags["trainyard_digits"], {}, "manual", 0)
    raised = {
        "TrainingError": TrainingError("training stopped by SIGTERM: every worker was killed"),
        "AirflowTaskTerminated": AirflowTaskTerminated("Task received SIGTERM signal"),
    }[stop]

    def execute(context: dict) -> dict:
        raise raised

    with pytest.raises(type(raised)):
        recording_failure("digits", "train", context, execute)
    reason = runview.run_failure(volume_root, "digits", context["run_id"], ["train"])
    assert reason is not None and "SIGTERM" in reason, reason


def test_the_form_bounds_the_reason_for_forcing(k8s_dags: dict) -> None:
    """Found by a cold user: a 5,000-character reason filled every page it showed on."""
    from airflow.sdk.definitions.param import ParamValidationError

    dag = k8s_dags["trainyard_digits"]
    with pytest.raises(ParamValidationError):
        _run_params(dag, {"force_reason": "x" * 2001})
    assert _run_params(dag, {"force_reason": "x" * 2000})["force_reason"] == "x" * 2000


# ------------------------------------------------------------------ the cluster's API


class Cluster:
    """Core and batch API calls of the training launch, on objects held in memory."""

    def __init__(self, *objects, suspended_reads: int = 0, pods: int = 0) -> None:
        self.objects = {(o.kind, o.metadata.namespace, o.metadata.name): o for o in objects}
        self.deleted: list = []
        self.created: list = []
        self.suspended_reads = suspended_reads
        self.pods = pods

    def _read(self, kind, ns, name):
        from kubernetes.client.exceptions import ApiException

        if (kind, ns, name) not in self.objects:
            raise ApiException(status=404, reason="NotFound")
        return self.objects[(kind, ns, name)]

    def _delete(self, kind, ns, name, body=None):
        self._read(kind, ns, name)
        del self.objects[(kind, ns, name)]
        self.deleted.append((kind, name, body.propagation_policy if body else None))

    def create_namespaced_service(self, ns, body):
        from kubernetes.client.exceptions import ApiException

        if ("Service", ns, body.metadata.name) in self.objects:
            raise ApiException(status=409, reason="AlreadyExists")
        self.objects[("Service", ns, body.metadata.name)] = body
        self.created.append(("Service", body.metadata.name))

    def read_namespaced_service(self, name, ns):
        return self._read("Service", ns, name)

    def delete_namespaced_service(self, name, ns):
        self._delete("Service", ns, name)

    def create_namespaced_job(self, ns, body):
        self.objects[("Job", ns, body.metadata.name)] = body
        self.created.append(("Job", body.metadata.name))

    def read_namespaced_job(self, name, ns):
        job = self._read("Job", ns, name)
        if self.suspended_reads:
            self.suspended_reads -= 1
            job.spec.suspend = True
        else:
            job.spec.suspend = False
            self.pods = job.spec.parallelism
        return job

    def delete_namespaced_job(self, name, ns, body=None):
        self._delete("Job", ns, name, body)

    def list_namespaced_pod(self, ns, label_selector):
        from types import SimpleNamespace

        return SimpleNamespace(items=[f"pod-{i}" for i in range(self.pods)])


def _objects(profile, run_id: str = "manual__1", workers: int = 2):
    from trainyard.k8s.apply import RUN_ANNOTATION
    from trainyard.k8s.render import run_training_objects
    from trainyard.steps import training_params

    cfg = _cfg()
    objs = run_training_objects(
        profile, cfg, training_params(cfg, {"workers": workers}), SNAPSHOT, run_id
    )
    for o in (objs.service, *objs.jobs):
        o.metadata.annotations = {RUN_ANNOTATION: run_id}
    return objs


def test_a_job_of_another_run_is_deleted_foreground_then_created(profile) -> None:
    from trainyard.k8s.apply import create_or_reattach_job

    leftover = _objects(profile, "manual__0").jobs[0]
    job = _objects(profile, "manual__1").jobs[0]
    job.metadata.name = leftover.metadata.name
    cluster = Cluster(leftover)
    assert create_or_reattach_job(cluster, job, log=lambda _m: None) is job
    assert cluster.deleted == [("Job", job.metadata.name, "Foreground")]
    assert cluster.created == [("Job", job.metadata.name)]


def test_a_running_job_of_the_same_run_is_reattached(profile) -> None:
    """After the Airflow worker restarts, the retry finds its Job: nothing recreated."""
    from kubernetes.client import V1JobStatus

    from trainyard.k8s.apply import create_or_reattach_job

    running = _objects(profile).jobs[0]
    running.status = V1JobStatus(active=2)
    cluster = Cluster(running)
    lines: list[str] = []
    assert create_or_reattach_job(cluster, copy.deepcopy(running), log=lines.append) is running
    assert cluster.created == cluster.deleted == []
    assert "reattached" in lines[0]
    failed = copy.deepcopy(running)
    failed.status = V1JobStatus(failed=1)
    cluster = Cluster(failed)
    create_or_reattach_job(cluster, copy.deepcopy(running), log=lines.append)
    assert cluster.deleted == [("Job", running.metadata.name, "Foreground")]


def test_a_service_of_another_run_is_replaced_one_of_this_run_kept(profile) -> None:
    from trainyard.k8s.apply import replace_training_service

    service = _objects(profile).service
    other = _objects(profile, "manual__0").service
    other.metadata.name = service.metadata.name
    cluster = Cluster(other)
    assert replace_training_service(cluster, service, run="manual__1") is True
    assert cluster.deleted == [("Service", service.metadata.name, None)]
    cluster = Cluster(service)
    assert replace_training_service(cluster, service, run="manual__1") is False
    assert cluster.deleted == []


def test_pods_of_a_job_kueue_admits_later_are_found(profile) -> None:
    """apache/airflow#70585: the Job is suspended for a while, its pods come after."""
    from trainyard.k8s.apply import find_job_pods

    job = _objects(profile).jobs[0]
    cluster = Cluster(job, suspended_reads=3)
    pods = find_job_pods(cluster, cluster, job, expected=2, timeout_s=5, first_pause_s=0.01)
    assert pods == ["pod-0", "pod-1"]


def test_pods_of_a_job_that_already_failed_are_not_waited_for(profile) -> None:
    """A failed Job deletes its running pods: those left are all there will ever be."""
    from kubernetes.client import V1JobCondition, V1JobStatus

    from trainyard.k8s.apply import find_job_pods

    job = _objects(profile).jobs[0]
    job.status = V1JobStatus(failed=1, conditions=[V1JobCondition(type="Failed", status="True")])
    cluster = Cluster(job, pods=1)
    pods = find_job_pods(cluster, cluster, job, expected=2, timeout_s=60, first_pause_s=30)
    assert pods == ["pod-0"]


def test_a_job_never_admitted_fails_naming_it(profile) -> None:
    from trainyard.errors import TrainingError
    from trainyard.k8s.apply import find_job_pods

    job = _objects(profile).jobs[0]
    cluster = Cluster(job, suspended_reads=10**6)
    with pytest.raises(TrainingError, match="still suspended \\(not admitted by Kueue\\)"):
        find_job_pods(cluster, cluster, job, expected=2, timeout_s=0.05, first_pause_s=0.01)


# ------------------------------------------------------------------ parsing, serialising


def test_dags_serialize(k8s_dags: dict) -> None:
    from airflow.serialization.serialized_objects import DagSerialization

    for dag in k8s_dags.values():
        loaded = DagSerialization.from_dict(DagSerialization.to_dict(dag))
        assert sorted(loaded.task_ids) == sorted(dag.task_ids)


def test_kubernetes_runner_parse_is_free(tmp_path: Path) -> None:
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


def test_one_invalid_pipeline_does_not_hide_the_others(tmp_path: Path, monkeypatch) -> None:
    import shutil

    from trainyard.orchestration.graph import build_dags

    folder = tmp_path / "pipelines"
    shutil.copytree(ROOT / "dags" / "pipelines", folder)
    (folder / "broken.yaml").write_text("name: broken\ndataset: [\n")
    (folder / "wrong.yaml").write_text(yaml.safe_dump({"name": "wrong", "dataset": "x"}))
    # found by a cold user: an unquoted impossible date raised a bare ValueError in the
    # YAML loader, and Airflow listed no trainyard DAG at all
    (folder / "baddate.yaml").write_text("name: baddate\nstart_date: 2026-11-31\n")
    # a broken file whose DAG id is a working pipeline's ("tx-sp" → trainyard_tx_sp) took
    # that pipeline's DAG; it now gets a suffix
    tx = yaml.safe_load((folder / "transactions.yaml").read_text())
    tx["name"] = tx["serving"]["model_name"] = "tx_sp"
    (folder / "tx_sp.yaml").write_text(yaml.safe_dump(tx))
    (folder / "tx-sp.yaml").write_text(yaml.safe_dump({**tx, "name": "tx-sp"}))
    monkeypatch.setenv("TRAINYARD_VOLUME_ROOT", str(tmp_path / "v"))
    dags = build_dags(folder)
    assert dags["trainyard_tx_sp"].task_ids != ["invalid_config"]
    (stray,) = [d for i, d in dags.items() if i.startswith("trainyard_tx_sp_")]
    assert stray.task_ids == ["invalid_config"] and "tx-sp.yaml" in stray.doc_md
    assert {f"trainyard_{p}" for p in PIPELINES} <= set(dags)
    assert "2026-11-31 is no calendar date" in dags["trainyard_baddate"].description
    for bad in ("trainyard_broken", "trainyard_wrong", "trainyard_baddate"):
        assert dags[bad].task_ids == ["invalid_config"]
        assert "invalid-config" in dags[bad].tags
    assert "not valid YAML" in dags["trainyard_broken"].description
    assert "invalid pipeline config" in dags["trainyard_wrong"].doc_md


def test_a_priority_no_tier_has_is_an_invalid_dag(tmp_path: Path, monkeypatch) -> None:
    # the trigger form fell back to the first tier; render and `pipelines check` refuse it
    from trainyard.orchestration.graph import build_dags

    folder = tmp_path / "pipelines"
    folder.mkdir()
    raw = yaml.safe_load((ROOT / "dags" / "pipelines" / "digits.yaml").read_text())
    raw["training"]["priority"] = "urgent"
    (folder / "digits.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.setenv("TRAINYARD_VOLUME_ROOT", str(tmp_path / "v"))
    dag = build_dags(folder)["trainyard_digits"]
    assert dag.task_ids == ["invalid_config"]
    assert (
        f"{folder / 'digits.yaml'}: training.priority: unknown priority tier 'urgent' "
        "(known: high, low)"
    ) in dag.doc_md


# ------------------------------------------------------------------ VolumeSnapshot


class VolumeSnapshots:
    def __init__(self, *statuses: dict, existing: dict | None = None, race: bool = False):
        self.statuses = statuses or ({"readyToUse": True},)
        self.objects: dict = {}
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

        if self.race:
            self._store(body)
        if (namespace, body["metadata"]["name"]) in self.objects:
            raise ApiException(status=409, reason="AlreadyExists")
        self._store(body)
        self.created.append(body["metadata"]["name"])
        return body

    def get_namespaced_custom_object(self, group, version, namespace, plural, name):
        from kubernetes.client.exceptions import ApiException

        if (namespace, name) not in self.objects:
            raise ApiException(status=404, reason="NotFound")
        obj = copy.deepcopy(self.objects[(namespace, name)])
        obj["status"] = self.statuses[min(self.reads, len(self.statuses) - 1)]
        self.reads += 1
        return obj


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
    profile, statuses, existing, race, created
) -> None:
    from trainyard import k8s
    from trainyard.k8s.apply import take_volume_snapshot

    body = k8s.volume_snapshot(profile, "digits", SNAPSHOT, "csi-snap")
    api = VolumeSnapshots(*statuses, existing=body if existing else None, race=race)
    result = take_volume_snapshot(api, body, timeout_s=5, poll_s=0)
    assert result["created"] is created
    assert result["content"] == "sc-1"
    assert len(api.objects) == 1
