"""Both shipped pipelines on the kubernetes runner, end to end, against localkube.

``airflow dags test`` runs each DAG with ``TRAINYARD_RUNNER=kubernetes``: the steps are
KubernetesPodOperator pods, training is the run's headless Service and Indexed Jobs
(KubernetesJobOperator), deploy applies the serving Deployment and Service. They talk to
localkube (:mod:`tests.localkube`), a local API server whose pods are local processes,
through the ``kubernetes_default`` connection with the operators' service account. One
cluster and one Airflow database serve the whole module.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.e2e.harness import ROOT, Project, init_airflow, make_project
from tests.localkube.cluster import LocalCluster

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NS = "trainyard"
SNAPSHOT_CLASS = "csi-snapclass"


@dataclass
class Kube:
    """The module's cluster, Airflow project and cluster profiles."""

    cluster: LocalCluster
    project: Project
    plain: Path
    kueue: Path

    def env(self, profile: Path) -> dict[str, str]:
        return {**self.project.env, "TRAINYARD_CLUSTER_PROFILE": str(profile)}

    def dags_test(
        self, dag: str, day: str, profile: Path, conf: dict | None = None, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        args = ["dags", "test", f"trainyard_{dag}", day]
        if conf:
            args += ["--conf", json.dumps(conf)]
        return self.airflow(args, profile, timeout)

    def airflow(
        self, args: list[str], profile: Path, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        """Run the ``airflow`` CLI; its output is also kept in ``<home>/logs``."""
        exe = str(Path(sys.executable).with_name("airflow"))
        out = subprocess.run(
            [exe, *args],
            env=self.env(profile),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        logs = self.project.home / "logs"
        logs.mkdir(exist_ok=True)
        name = "-".join(a for a in args[:3] if not a.startswith("-"))
        (logs / f"{time.strftime('%H%M%S')}-{name}.log").write_text(out.stdout + out.stderr)
        return out

    def spawn(self, args: list[str], profile: Path) -> tuple[subprocess.Popen[bytes], Path]:
        """Start the ``airflow`` CLI in the background; its output goes to ``<home>/logs``."""
        logs = self.project.home / "logs"
        logs.mkdir(exist_ok=True)
        name = "-".join(a for a in args[:3] if not a.startswith("-"))
        path = logs / f"{time.strftime('%H%M%S')}-{name}.log"
        with path.open("wb") as out:
            proc = subprocess.Popen(
                [str(Path(sys.executable).with_name("airflow")), *args],
                env=self.env(profile),
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return proc, path

    def names(self, plural: str, labels: str | None = None) -> list[str]:
        return [o["metadata"]["name"] for o in self.cluster.objects(plural, NS, labels)]

    def training_left(self) -> list[str]:
        """Jobs, training pods and training Services still in the cluster."""
        return [
            *(f"job/{n}" for n in self.names("jobs")),
            *(f"pod/{n}" for n in self.names("pods", "app.kubernetes.io/component=training")),
            *(
                f"service/{n}"
                for n in self.names("services", "app.kubernetes.io/component=training")
            ),
        ]

    def step_pods_left(self) -> list[str]:
        return self.names("pods", "app.kubernetes.io/component=step")


def _profile(path: Path, **changes: object) -> Path:
    doc = yaml.safe_load((ROOT / "deploy" / "cluster_profile.yaml").read_text())
    for dotted, value in changes.items():
        section, key = dotted.split("__")
        doc[section][key] = value
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    from trainyard.settings import Settings

    tmp = tmp_path_factory.mktemp("k8s")
    small = {"start_deadline_s": 120, "attempt_timeout_s": 300}
    project = make_project(
        tmp,
        {"training": {**small, "epochs": 3}, "serving": {"port": 8501}},
        extra_pipelines={
            "transactions": {
                "from": "transactions",
                "training": {
                    **small,
                    "epochs": 4,
                    "strategy": "parameter_server",
                    "parameter_servers": 1,
                    "workers": 1,
                },
                "serving": {"port": 8501},
            }
        },
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
    image_env = {  # what the images set (images/*/Dockerfile), pipelines baked in
        "PATH": project.env["PATH"],
        "LANG": "C.UTF-8",
        "TRAINYARD_PROJECT_DIR": str(ROOT),
        "TRAINYARD_PIPELINES_DIR": str(pipelines),
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    cluster = LocalCluster(
        tmp / "localkube", volume_root=project.volume_root, image_env=image_env, settings=settings
    )
    cluster.start()
    try:
        cluster.apply_files(sorted((ROOT / "deploy" / "k8s").glob("*.yaml")))
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
        cluster.apply_files([snapshot_class])
        kubeconfig = cluster.kubeconfig(tmp / "kubeconfig")
        project.env.update(
            TRAINYARD_RUNNER="kubernetes",
            AIRFLOW_CONN_KUBERNETES_DEFAULT=json.dumps(
                {
                    "conn_type": "kubernetes",
                    "extra": {"kube_config_path": str(kubeconfig), "namespace": NS},
                }
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
    finally:
        cluster.stop()
    assert cluster.kubelet.processes() == []
    assert cluster.errors == []


def _last_run(kube: Kube, pipeline: str) -> dict:
    path = kube.project.volume_root / "_models" / pipeline / "last_run.json"
    return json.loads(path.read_text())


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


def _fail(out: subprocess.CompletedProcess[str]) -> str:
    return out.stdout[-6000:] + out.stderr[-6000:]


def test_digits_mirrored_strategy_end_to_end(kube: Kube) -> None:
    """Stage into the dataset PVC, validate, train 2 workers, gate, deploy, predict."""
    out = kube.dags_test("digits", "2026-11-20", kube.plain)
    assert out.returncode == 0, _fail(out)
    run = _last_run(kube, "digits")
    assert run["validate"]["success"] is True
    assert run["evaluate"]["verdict"] == "promote", run["evaluate"]
    assert run["deploy"]["version"] == 1
    assert "trainyard-data-digits" in kube.names("persistentvolumeclaims")
    assert kube.training_left() == []
    assert kube.step_pods_left() == []
    assert kube.names("deployments") == ["serving-digits"]
    image = [[[1.0 if col == 4 else 0.0] for col in range(8)] for _ in range(8)]
    pred = _predict(_service_url(kube, "digits"), [{"image": image}])["predictions"][0]
    assert len(pred["probabilities"]) == 10


# --------------------------------------------------------------- the order of the Jobs


def job_waits(requests: list, prefix: str) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """The Jobs created (in order) and, for each read of a Job created before it (a wait:
    the operator looking for its pods or polling its status), the Jobs created by then.

    Args:
        requests: The API server's requests (:attr:`ApiServer.requests`).
        prefix: Names of the Jobs looked at start with this (one pipeline's).
    """
    created: list[str] = []
    waits: list[tuple[str, list[str]]] = []
    for r in list(requests):
        if r.plural != "jobs":
            continue
        if r.verb == "create" and r.name.startswith(prefix):
            created.append(r.name)
        elif r.verb == "get" and r.name in created:
            waits.append((r.name, list(created)))
    return created, waits


def assert_no_job_created_after_a_wait(requests: list, prefix: str) -> None:
    """No Job is created once the runner waits on another (every wait saw them all)."""
    created, waits = job_waits(requests, prefix)
    late = [
        f"waited on {waited} before creating {sorted(set(created) - set(seen))}"
        for waited, seen in waits
        if set(seen) != set(created)
    ]
    assert not late, late[0]


def _roles(names: list[str]) -> list[str]:
    return sorted(n.rsplit("-", 1)[1] for n in names)


def test_transactions_parameter_servers_with_kueue(kube: Kube) -> None:
    """PS training (a ps, a chief and a worker Job) queued by Kueue; a CSI snapshot.

    Every Job is created before the runner waits on one: the chief ends training only
    once the worker exists (waiting on the chief first hung until its deadline).
    """
    from trainyard.k8s.objects import JOB_NAME_PREFIX, training_prefix

    prefix = JOB_NAME_PREFIX + training_prefix("transactions")
    requests = kube.cluster.api.requests
    proc, log = kube.spawn(["dags", "test", "trainyard_transactions", "2026-11-20"], kube.kueue)
    try:
        [(waited, seen)] = kube.cluster.wait_for(
            "the training task waiting on a Job", lambda: job_waits(requests, prefix)[1][:1], 400
        )
        assert _roles(seen) == ["chief", "ps", "worker"], (
            f"the runner waits on {waited} having created only {seen}"
        )
        assert proc.wait(timeout=600) == 0, log.read_text()[-8000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert_no_job_created_after_a_wait(requests, prefix)
    run = _last_run(kube, "transactions")
    assert run["train"]["training"]["strategy"] == "parameter_server"
    assert run["evaluate"]["verdict"] == "promote", run["evaluate"]
    assert run["deploy"]["version"] == 1
    # Kueue's webhook suspended each Job; the tier's queue admitted each one
    admitted = [
        e
        for e in kube.cluster.objects("events", NS)
        if e["reason"] == "Started" and e["involvedObject"]["name"].startswith(prefix)
    ]
    assert _roles([e["involvedObject"]["name"] for e in admitted]) == ["chief", "ps", "worker"]
    assert all(e["message"] == "Admitted by clusterQueue trainyard-low" for e in admitted)
    # the dataset volume's CSI snapshot, taken once the snapshot was published
    [snap] = kube.cluster.objects("volumesnapshots", NS)
    assert snap["spec"]["source"]["persistentVolumeClaimName"] == "trainyard-data-transactions"
    assert snap["status"]["readyToUse"] is True
    assert snap["metadata"]["labels"]["trainyard.io/snapshot"] == run["stage"]["snapshot_id"]
    assert kube.training_left() == []
    assert kube.step_pods_left() == []
    rows = [
        {"amount": 950.0, "hour": 3, "customer_age": 19},
        {"amount": 12.5, "hour": 14, "customer_age": 50},
    ]
    preds = _predict(_service_url(kube, "transactions"), rows)["predictions"]
    assert len(preds) == 2
