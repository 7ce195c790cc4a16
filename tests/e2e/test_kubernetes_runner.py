"""Both shipped pipelines on the kubernetes runner, end to end, against localkube.

``airflow dags test`` runs each DAG with ``TRAINYARD_RUNNER=kubernetes``: the steps are
KubernetesPodOperator pods, training is the run's headless Service and Indexed Jobs
(KubernetesJobOperator), deploy applies the serving Deployment and Service. They talk to
localkube (:mod:`tests.localkube`), a local API server whose pods are local processes,
through the ``kubernetes_default`` connection as the operators' service account (the RBAC
Role of ``deploy/k8s/rbac.yaml``). One cluster and one Airflow database (PostgreSQL) serve
the module; the two DAG runs go at once:

* digits: multi-worker mirrored (2 workers), Kueue off;
* transactions: parameter servers (a ps, a chief and a worker Job), Kueue on, a CSI
  VolumeSnapshot of the dataset volume after staging;
* faults, on the digits run's training task (while transactions runs): a worker pod dies,
  the Airflow worker dies (the retry reattaches), Airflow kills the task (on_kill deletes
  its objects).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.localkube.api import Request
from tests.localkube.cluster import LocalCluster
from tests.support.harness import ROOT, Project, init_airflow, make_project

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NS = "trainyard"
DAY = "2026-11-20"
SNAPSHOT_CLASS = "csi-snapclass"
PS_ROLES = ["chief", "ps", "worker"]


@dataclass
class Kube:
    """The module's cluster, Airflow project and cluster profiles (without, with Kueue)."""

    cluster: LocalCluster
    project: Project
    plain: Path
    kueue: Path

    def _log(self, args: list[str]) -> Path:
        logs = self.project.home / "logs"
        logs.mkdir(exist_ok=True)
        name = "-".join(a for a in args[:3] if not a.startswith("-"))
        return logs / f"{time.strftime('%H%M%S')}-{len(list(logs.iterdir()))}-{name}.log"

    def spawn(self, args: list[str], profile: Path) -> tuple[subprocess.Popen[bytes], Path]:
        """Start the ``airflow`` CLI; its output goes to ``<home>/logs``."""
        path = self._log(args)
        with path.open("wb") as out:
            proc = subprocess.Popen(
                [str(Path(sys.executable).with_name("airflow")), *args],
                env={
                    **self.project.env,
                    "TRAINYARD_CLUSTER_PROFILE": str(profile),
                    "PYTHONFAULTHANDLER": "1",  # _stop's SIGABRT: every thread's stack
                },
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return proc, path

    def names(self, plural: str, labels: str | None = None) -> list[str]:
        return [o["metadata"]["name"] for o in self.cluster.objects(plural, NS, labels)]

    def training_left(self, pipeline: str) -> list[str]:
        """A pipeline's Jobs, training pods and training Services still in the cluster."""
        labels = f"trainyard.io/pipeline={pipeline},app.kubernetes.io/component=training"
        return [
            *(f"job/{n}" for n in self.names("jobs", f"trainyard.io/pipeline={pipeline}")),
            *(f"pod/{n}" for n in self.names("pods", labels)),
            *(f"service/{n}" for n in self.names("services", labels)),
        ]

    def settled(self, pipeline: str, timeout_s: float = 60) -> None:
        """Teardown is done: no Job, training pod or training Service of it is left."""
        self.cluster.wait_for(
            f"no training object of {pipeline} left",
            lambda: not self.training_left(pipeline),
            timeout_s,
        )


def _profile(path: Path, **changes: object) -> Path:
    doc = yaml.safe_load((ROOT / "deploy" / "cluster_profile.yaml").read_text())
    for dotted, value in changes.items():
        section, key = dotted.split("__")
        doc[section][key] = value
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    """localkube with ``deploy/k8s/`` applied, and an Airflow project that uses it."""
    from trainyard.settings import Settings

    tmp = tmp_path_factory.mktemp("k8s")
    small = {"start_deadline_s": 120, "attempt_timeout_s": 300}
    ps = {"strategy": "parameter_server", "parameter_servers": 1, "workers": 1}
    # each pipeline's YAML keeps a laptop port of its own: on the cluster deploy and the
    # smoke test dial the Service's (settings.serving_endpoint)
    project = make_project(
        tmp,
        {"training": {**small, "epochs": 3}},
        extra_pipelines={
            "transactions": {"from": "transactions", "training": {**small, **ps, "epochs": 4}}
        },
        database="postgres",  # the two runs at once
    )
    pipelines = Path(project.env["TRAINYARD_PIPELINES_DIR"])
    settings = Settings(
        project_dir=ROOT,
        volume_root=project.volume_root,
        runner="local",
        pipelines_dir=pipelines,
        contracts_dir=ROOT / "data_contracts",
        cluster_profile=ROOT / "deploy" / "cluster_profile.yaml",
    )
    image_env = {  # what the images set (images/*/Dockerfile), these pipelines baked in
        "PATH": project.env["PATH"],
        "LANG": "C.UTF-8",
        "TRAINYARD_PROJECT_DIR": str(ROOT),
        "TRAINYARD_PIPELINES_DIR": str(pipelines),
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    state = tmp / "localkube"
    cluster = LocalCluster(
        state, volume_root=project.volume_root, image_env=image_env, settings=settings
    )
    cluster.start()
    try:
        snapshot_class = tmp / "snapshot-class.yaml"
        snapshot_class.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "snapshot.storage.k8s.io/v1",
                    "kind": "VolumeSnapshotClass",
                    "metadata": {"name": SNAPSHOT_CLASS},
                    "driver": "nfs.csi.k8s.io",
                    "deletionPolicy": "Delete",
                }
            )
        )
        cluster.apply_files([*sorted((ROOT / "deploy" / "k8s").glob("*.yaml")), snapshot_class])
        kubeconfig = cluster.kubeconfig(tmp / "kubeconfig")
        connection = {"kube_config_path": str(kubeconfig), "namespace": NS}
        project.env.update(
            TRAINYARD_RUNNER="kubernetes",
            AIRFLOW_CONN_KUBERNETES_DEFAULT=json.dumps(
                {"conn_type": "kubernetes", "extra": connection}
            ),
        )
        init_airflow(project)
        pools = project.trainyard("pools")
        assert pools.returncode == 0, pools.stderr
        (tmp / "pools.json").write_text(pools.stdout)
        out = project.airflow("pools", "import", str(tmp / "pools.json"))
        assert out.returncode == 0, out.stderr
        yield Kube(
            cluster,
            project,
            _profile(tmp / "profile.yaml"),
            _profile(
                tmp / "profile-kueue.yaml",
                kueue__enabled=True,
                storage__volume_snapshot_class=SNAPSHOT_CLASS,
            ),
        )
        left = [
            p["metadata"]["name"]
            for p in cluster.objects("pods")
            if p["metadata"]["labels"].get("app.kubernetes.io/component") != "serving"
        ]
        assert left == [], f"pods left behind: {left}"
    finally:
        project.stop_postgres()
        if any(not r.done for r in cluster.api.requests):
            cluster.dump_threads(state / "threads.txt")
        cluster.stop()
        with (state / "requests.txt").open("w") as f:  # for a post-mortem
            for r in cluster.api.requests:
                took = f"{r.done - r.at:.3f}s" if r.done else "unanswered"
                f.write(
                    f"{r.at:.3f} {r.code} {took} {r.verb} {r.plural}/{r.name}/{r.sub} {r.query}\n"
                )
    assert cluster.errors == []


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """End a process left running: its threads' stacks to its log (SIGABRT), then SIGKILL."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGABRT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


def _kill(proc: subprocess.Popen[bytes], sig: int) -> None:
    os.killpg(proc.pid, sig)


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-8000:]


def _last_run(kube: Kube, pipeline: str) -> dict:
    path = kube.project.volume_root / "_models" / pipeline / "last_run.json"
    return json.loads(path.read_text())


def _force_retrain(kube: Kube, dag_id: str, run_id: str) -> None:
    """Set ``force_retrain`` in a finished run's conf: its train task, tried again on the
    same inputs, would reuse the version it trained and create no Job."""
    code = (
        "import sys\n"
        "from airflow.models.dagrun import DagRun\n"
        "from airflow.utils.session import create_session\n"
        "with create_session() as s:\n"
        "    run = s.query(DagRun).filter_by(dag_id=sys.argv[1], run_id=sys.argv[2]).one()\n"
        "    run.conf = {**(run.conf or {}), 'force_retrain': True}\n"
    )
    subprocess.run(
        [sys.executable, "-c", code, dag_id, run_id], env=kube.project.env, check=True, cwd=ROOT
    )


def _service_url(kube: Kube, model: str) -> str:
    """The serving Service's address as the pods reach it (``kubectl port-forward``)."""
    table = json.loads(kube.cluster.network_file().read_text())
    ends = table[f"serving-{model}.{NS}.svc:8501"]
    assert ends, f"serving-{model} has no ready endpoint"
    return f"http://{ends[0]}/v1/models/{model}"


def _predict(url: str, instances: list) -> dict:
    req = urllib.request.Request(
        f"{url}:predict",
        data=json.dumps({"instances": instances}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def _job_prefix(pipeline: str) -> str:
    from trainyard.k8s.objects import JOB_NAME_PREFIX, training_prefix

    return JOB_NAME_PREFIX + training_prefix(pipeline)


def job_waits(
    requests: list[Request], prefix: str
) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """The Jobs created (in order) and, for each read of a Job after its creation (a wait:
    the operator looking for its pods or polling its status), the Jobs created by then.

    Args:
        requests: The API server's requests (:attr:`ApiServer.requests`).
        prefix: Only Jobs whose names start with this (one pipeline's).
    """
    created: list[str] = []
    waits: list[tuple[str, list[str]]] = []
    for r in list(requests):
        if r.plural != "jobs" or not r.name.startswith(prefix):
            continue
        if r.verb == "create":
            created.append(r.name)
        elif r.verb == "get" and r.name in created:
            waits.append((r.name, list(created)))
    return created, waits


def _roles(names: list[str]) -> list[str]:
    return sorted({n.rsplit("-", 1)[1] for n in names})


@dataclass
class Run:
    """A DAG run: the CLI's exit code and log, and the first Job its training waited on."""

    code: int | None
    log: Path
    first_wait: tuple[str, list[str]] | None


class DagRun:
    """``airflow dags test`` of a pipeline, started now, watched from a thread.

    It is stopped at once if its training waits on a Job before it created every role's
    (that wait would last until the Job's deadline).
    """

    def __init__(self, kube: Kube, pipeline: str, profile: Path, roles: list[str]) -> None:
        self.requests, self.prefix, self.roles = (
            kube.cluster.api.requests,
            _job_prefix(pipeline),
            roles,
        )
        self.proc, self.log = kube.spawn(["dags", "test", f"trainyard_{pipeline}", DAY], profile)
        self.first: tuple[str, list[str]] | None = None
        self.watcher = threading.Thread(target=self._watch, daemon=True)
        self.watcher.start()

    def _watch(self) -> None:
        while self.proc.poll() is None:
            waits = job_waits(self.requests, self.prefix)[1]
            if waits:
                self.first = waits[0]
                if _roles(self.first[1]) != self.roles:
                    _stop(self.proc)
                return
            time.sleep(0.2)

    def result(self, timeout_s: float) -> Run:
        try:
            self.proc.wait(timeout=timeout_s)
        finally:
            _stop(self.proc)
        self.watcher.join(timeout=10)
        return Run(self.proc.returncode, self.log, self.first)


@pytest.fixture(scope="module")
def runs(kube: Kube) -> Iterator[dict[str, DagRun]]:
    """Both pipelines' DAGs, at once: digits without Kueue, transactions with.

    The second starts once the first has written the DAGs to the database (both would
    insert the same rows).
    """
    started = {"digits": DagRun(kube, "digits", kube.plain, ["worker"])}
    _log_says(started["digits"].log, "[DAG TEST] starting task_id=stage", 300)
    started["transactions"] = DagRun(kube, "transactions", kube.kueue, PS_ROLES)
    yield started
    for run in started.values():
        _stop(run.proc)


@pytest.fixture(scope="module")
def digits_run(runs: dict[str, DagRun]) -> Run:
    return runs["digits"].result(900)


@pytest.fixture(scope="module")
def transactions_run(runs: dict[str, DagRun]) -> Run:
    return runs["transactions"].result(900)


# ------------------------------------------------------------------------------- the runs


def test_digits_mirrored_strategy_end_to_end(kube: Kube, digits_run: Run) -> None:
    """Stage into the dataset PVC, validate, train 2 workers, gate, deploy, predict."""
    assert digits_run.code == 0, _tail(digits_run.log)
    run = _last_run(kube, "digits")
    assert run["validate"]["success"] is True
    assert run["train"]["training"]["strategy"] == "multi_worker_mirrored"
    assert run["evaluate"]["verdict"] == "promote", run["evaluate"]
    assert run["deploy"]["version"] == 1
    assert {"trainyard-data-digits", "trainyard-models"} <= set(
        kube.names("persistentvolumeclaims")
    )
    kube.settled("digits")
    assert kube.names("pods", "app.kubernetes.io/component=step,trainyard.io/pipeline=digits") == []
    assert "serving-digits" in kube.names("deployments")
    image = [[[1.0 if col == 4 else 0.0] for col in range(8)] for _ in range(8)]
    pred = _predict(_service_url(kube, "digits"), [{"image": image}])["predictions"][0]
    assert len(pred["probabilities"]) == 10


# ------------------------------------------------------------------------------- faults


def _training_pods(kube: Kube, job: str, count: int, timeout_s: float = 120) -> list[str]:
    """The names of a Job's pods once ``count`` of them run."""

    def running() -> list[str]:
        pods = kube.cluster.objects("pods", NS, f"job-name={job}")
        live = [p["metadata"]["name"] for p in pods if p["status"].get("phase") == "Running"]
        return live if len(live) == count else []

    return kube.cluster.wait_for(f"{count} running pods of {job}", running, timeout_s)


def _log_says(path: Path, text: str, timeout_s: float = 120) -> None:
    end = time.monotonic() + timeout_s
    while text not in path.read_text(errors="replace"):
        assert time.monotonic() < end, f"{path.name} never said {text!r}:\n{_tail(path)}"
        time.sleep(0.2)


def _made(kube: Kube, plural: str, prefix: str, since: int) -> list[str]:
    """The uids of the objects of a kind created since change ``since`` named ``prefix*``."""
    return [
        c.obj["metadata"]["uid"]
        for c in kube.cluster.store.log[since:]
        if c.plural == plural and c.type == "ADDED" and c.obj["metadata"]["name"].startswith(prefix)
    ]


def test_training_task_faults_fail_restart_reattach_and_kill_cleanly(
    kube: Kube, digits_run: Run
) -> None:
    """Three tries of the digits run's training task (``airflow tasks test``, its run id).

    1. A worker pod dies: ``backoffLimit: 0`` fails the Job, which stops the other pod
       and replaces none; the try fails with the Job's reason; nothing is left.
    2. The next try starts the group anew (a new Job, new pods); its Airflow worker dies
       (SIGKILL) while the Job runs. The pods are paused (SIGSTOP) meanwhile, so training
       cannot end before the next try looks.
    3. The next try reattaches to that Job (nothing is created again) and waits on it;
       then Airflow kills it (SIGTERM): on_kill deletes the Job, its pods and the Service
       before training ended.
    """
    from trainyard.k8s.objects import job_name, training_base_name

    assert digits_run.code == 0, "needs the digits run"
    run_id = _last_run(kube, "digits")["run_id"]
    job = job_name(training_base_name("digits", run_id), "worker")
    requests = kube.cluster.api.requests
    train = ["tasks", "test", "trainyard_digits", "train", run_id]
    _force_retrain(kube, "trainyard_digits", run_id)
    since = len(kube.cluster.store.log)
    procs = []
    try:
        # 1. a worker pod dies
        first, log = kube.spawn(train, kube.plain)
        procs.append(first)
        pods = _training_pods(kube, job, 2)
        kube.cluster.kubelet.signal_pod(NS, next(p for p in pods if p.startswith(f"{job}-1-")), 9)
        first.wait(timeout=180)
        assert "is failed with error 'BackoffLimitExceeded'" in _tail(log), _tail(log)
        kube.settled("digits")
        assert len(_made(kube, "pods", job, since)) == 2, "a pod of the failed Job was replaced"

        # 2. the retry: a new group; its Airflow worker dies
        second, _ = kube.spawn(train, kube.plain)
        procs.append(second)
        pods = _training_pods(kube, job, 2)
        assert len(_made(kube, "jobs", job, since)) == 2
        assert len(_made(kube, "pods", job, since)) == 4
        uid = kube.cluster.store.get("jobs", NS, job)["metadata"]["uid"]
        for pod in pods:
            kube.cluster.kubelet.signal_pod(NS, pod, signal.SIGSTOP)
        _kill(second, signal.SIGKILL)
        second.wait(timeout=60)
        creates = [r for r in requests if r.verb == "create" and r.name == job]
        mark = len(requests)

        # 3. the next retry reattaches; then Airflow kills it
        third, log = kube.spawn(train, kube.plain)
        procs.append(third)
        _log_says(log, f"reattached to Job {job} of this run (still running)")
        kube.cluster.wait_for(  # waiting on it: polling its status
            f"the retry waiting on {job}",
            lambda: any(r.name == job and r.sub == "status" for r in requests[mark:]),
            120,
        )
        assert [r for r in requests if r.verb == "create" and r.name == job] == creates
        assert kube.cluster.store.get("jobs", NS, job)["metadata"]["uid"] == uid
        _kill(third, signal.SIGTERM)
        kube.settled("digits")
        third.wait(timeout=120)  # on_kill done, the task fails and its process ends
    finally:
        for proc in procs:
            _stop(proc)
    [gone] = [
        c.obj
        for c in kube.cluster.store.log
        if c.type == "DELETED" and c.plural == "jobs" and c.obj["metadata"]["uid"] == uid
    ]
    assert not any(c["type"] == "Complete" for c in gone["status"].get("conditions") or [])
    assert "and the pods labelled trainyard.io/run=" in log.read_text(errors="replace")


# ------------------------------------------ transactions (it ran meanwhile), the order


def test_transactions_parameter_servers_with_kueue_end_to_end(
    kube: Kube, transactions_run: Run
) -> None:
    """PS training queued by Kueue; a CSI snapshot of the dataset volume; deploy, predict."""
    assert transactions_run.code == 0, _tail(transactions_run.log)
    run = _last_run(kube, "transactions")
    assert run["train"]["training"]["strategy"] == "parameter_server"
    assert run["evaluate"]["verdict"] == "promote", run["evaluate"]
    assert run["deploy"]["version"] == 1
    # Kueue's webhook suspended each Job; the tier's LocalQueue admitted each one
    prefix = _job_prefix("transactions")
    admitted = [
        e
        for e in kube.cluster.objects("events", NS)
        if e["reason"] == "Started" and e["involvedObject"]["name"].startswith(prefix)
    ]
    assert _roles([e["involvedObject"]["name"] for e in admitted]) == PS_ROLES
    assert {e["message"] for e in admitted} == {"Admitted by clusterQueue trainyard-low"}
    # the dataset volume's CSI snapshot, taken once the snapshot was published
    [snap] = kube.cluster.objects("volumesnapshots", NS)
    assert snap["spec"]["source"]["persistentVolumeClaimName"] == "trainyard-data-transactions"
    assert snap["status"]["readyToUse"] is True
    assert snap["metadata"]["labels"]["trainyard.io/snapshot"] == run["stage"]["snapshot_id"]
    kube.settled("transactions")
    rows = [
        {"amount": 950.0, "hour": 3, "customer_age": 19},
        {"amount": 12.5, "hour": 14, "customer_age": 50},
    ]
    assert len(_predict(_service_url(kube, "transactions"), rows)["predictions"]) == 2


def test_training_creates_every_job_before_it_waits_on_one(
    kube: Kube, digits_run: Run, transactions_run: Run
) -> None:
    """The runner waits on the role whose completion ends training only once every Job of
    the attempt exists: the chief of parameter-server training ends only once the worker
    Job runs, so waiting on it first lasted until its deadline."""
    assert transactions_run.first_wait is not None, _tail(transactions_run.log)
    waited, seen = transactions_run.first_wait
    assert _roles(seen) == PS_ROLES, f"the runner waited on {waited} having created only {seen}"
    for pipeline in ("digits", "transactions"):
        created, waits = job_waits(kube.cluster.api.requests, _job_prefix(pipeline))
        late = [(w, sorted(set(created) - set(s))) for w, s in waits if set(s) != set(created)]
        assert not late, f"{pipeline}: waited on {late[0][0]} before creating {late[0][1]}"
