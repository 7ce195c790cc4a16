"""localkube answers the real kubernetes client as an API server would (tests/localkube).

The test double of the kubernetes runner's end-to-end tests is itself tested here, with
the operators' service account and tiny pods (``python -c``): RBAC, validation and Pod
Security on create, logs followed, exec, watches, Indexed Jobs and their failure policy,
deletion propagation, Kueue admission.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.localkube.cluster import LocalCluster

ROOT = Path(__file__).resolve().parents[2]
NS = "trainyard"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    import os

    from trainyard.settings import get_settings

    tmp = tmp_path_factory.mktemp("localkube")
    kube = LocalCluster(
        tmp / "state",
        volume_root=tmp / "volumes",
        image_env={"PATH": os.environ["PATH"]},
        settings=get_settings(),
    )
    kube.start()
    kube.apply_files(sorted((ROOT / "deploy" / "k8s").glob("*.yaml")))
    yield kube
    kube.stop()
    assert kube.errors == []


@pytest.fixture(scope="module")
def api(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A client as the operators' service account (the Role of deploy/k8s/rbac.yaml)."""
    from kubernetes import config

    path = cluster.kubeconfig(tmp_path_factory.mktemp("kubeconfig") / "config")
    return config.new_client_from_config(str(path))


def _pod(name: str, code: str, **labels: str) -> dict[str, Any]:
    from kubernetes.client import ApiClient

    from trainyard.k8s.objects import restricted_pod_security_context, restricted_security_context

    sanitize = ApiClient().sanitize_for_serialization
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "restartPolicy": "Never",
            "serviceAccountName": "trainyard-runner",
            "securityContext": sanitize(restricted_pod_security_context()),
            "containers": [
                {
                    "name": "base",
                    "image": "steps",
                    "command": ["python", "-c", code],
                    "securityContext": sanitize(restricted_security_context()),
                }
            ],
        },
    }


def _wait(what: str, test: Any, timeout_s: float = 30) -> Any:
    end = time.monotonic() + timeout_s
    while not (value := test()):
        assert time.monotonic() < end, what
        time.sleep(0.1)
    return value


def _status(e: Any) -> tuple[int, str]:
    """An ApiException's code and the message of its Status."""
    import json

    return int(e.value.status), json.loads(e.value.body)["message"]


def test_requests_are_authorized_validated_and_admitted(api: Any) -> None:
    from kubernetes.client import CoreV1Api
    from kubernetes.client.exceptions import ApiException

    core = CoreV1Api(api)
    with pytest.raises(ApiException) as e:  # not in the Role
        core.list_namespaced_config_map(NS)
    assert _status(e)[0] == 403 and "cannot list resource" in _status(e)[1]
    privileged = _pod("privileged", "pass")
    privileged["spec"]["containers"][0]["securityContext"]["privileged"] = True
    with pytest.raises(ApiException) as e:  # Pod Security "restricted", enforced
        core.create_namespaced_pod(NS, privileged)
    assert _status(e)[0] == 403 and "violates PodSecurity" in _status(e)[1]
    unknown = _pod("unknown", "pass")
    unknown["spec"]["containers"][0]["bogus"] = 1
    with pytest.raises(ApiException) as e:  # the schema, strict
        core.create_namespaced_pod(NS, unknown)
    assert _status(e)[0] == 422 and "bogus" in _status(e)[1]
    nobody = _pod("nobody", "pass")
    nobody["spec"]["serviceAccountName"] = "nobody"
    with pytest.raises(ApiException) as e:
        core.create_namespaced_pod(NS, nobody)
    assert _status(e) == (
        403,
        'pods "nobody" is forbidden: error looking up service account trainyard/nobody: '
        'serviceaccount "nobody" not found',
    )


def test_a_pod_runs_logs_follow_exec_answers_and_watches_see_it(api: Any) -> None:
    from kubernetes import watch
    from kubernetes.client import CoreV1Api
    from kubernetes.stream import stream

    core = CoreV1Api(api)
    code = "import sys, time\nprint('one', flush=True)\ntime.sleep(0.5)\nprint('two')\nsys.exit(3)"
    core.create_namespaced_pod(NS, _pod("talker", code, app="talker"))
    out = stream(
        core.connect_get_namespaced_pod_exec,
        "talker",
        NS,
        container="base",
        command=["python", "-c", "print('from exec')"],
        stderr=True,
        stdin=False,
        stdout=True,
        tty=False,
    )
    assert out.strip() == "from exec"
    logs = core.read_namespaced_pod_log(
        "talker", NS, container="base", follow=True, timestamps=True, _preload_content=False
    )
    lines = [line.decode().split(" ", 1) for line in logs.stream() for line in line.splitlines()]
    assert [text for _, text in lines] == ["one", "two"]
    assert all(stamp.endswith("Z") for stamp, _ in lines)  # ends when the container does
    pod = _wait(
        "the pod's end reported",
        lambda: (p := core.read_namespaced_pod("talker", NS)).status.phase == "Failed" and p,
    )
    assert pod.status.container_statuses[0].state.terminated.exit_code == 3
    events = []
    for event in watch.Watch().stream(
        core.list_namespaced_pod, NS, label_selector="app=talker", timeout_seconds=10
    ):
        events.append(event["type"])
        if event["type"] == "ADDED":
            core.delete_namespaced_pod("talker", NS)
        if event["type"] == "DELETED":
            break
    assert events[0] == "ADDED" and events[-1] == "DELETED"


def _job(name: str, codes: list[str], **labels: str) -> dict[str, Any]:
    pod = _pod("unused", "pass")
    pod["spec"]["containers"][0]["command"] = [
        "python",
        "-c",
        "import os, sys\ncodes = "
        + repr(codes)
        + "\nexec(codes[int(os.environ['JOB_COMPLETION_INDEX'])])",
    ]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "completionMode": "Indexed",
            "completions": len(codes),
            "parallelism": len(codes),
            "backoffLimit": 0,
            "template": {"metadata": {"labels": {"job": name}}, "spec": pod["spec"]},
        },
    }


def _failed(batch: Any, name: str) -> str | None:
    conditions = batch.read_namespaced_job_status(name, NS).status.conditions or []
    return next((c.reason for c in conditions if c.type == "Failed"), None)


def test_backoff_limit_zero_fails_the_whole_indexed_job(api: Any) -> None:
    """One pod fails: the Job fails and stops the other pod; none is replaced."""
    from kubernetes.client import BatchV1Api, CoreV1Api, V1DeleteOptions

    core, batch = CoreV1Api(api), BatchV1Api(api)
    batch.create_namespaced_job(
        NS, _job("group", ["import time; time.sleep(60)", "raise SystemExit(1)"])
    )
    assert _wait("the Job fails", lambda: _failed(batch, "group")) == "BackoffLimitExceeded"
    pods = core.list_namespaced_pod(NS, label_selector="job-name=group").items
    assert [p.status.phase for p in pods] == ["Failed"]  # index 0 was deleted, not replaced
    batch.delete_namespaced_job("group", NS)  # a Job's default: its pods are orphaned
    assert len(core.list_namespaced_pod(NS, label_selector="job-name=group").items) == 1
    core.delete_collection_namespaced_pod(NS, label_selector="job-name=group")
    batch.create_namespaced_job(NS, _job("quick", ["pass", "pass"]))
    _wait(
        "the Job completes",
        lambda: batch.read_namespaced_job_status("quick", NS).status.completion_time,
    )
    batch.delete_namespaced_job("quick", NS, body=V1DeleteOptions(propagation_policy="Foreground"))
    _wait(
        "its pods go with it",
        lambda: not core.list_namespaced_pod(NS, label_selector="job-name=quick").items,
    )


def test_kueue_suspends_a_queued_job_and_admits_it_when_the_queue_runs(
    api: Any, cluster: LocalCluster
) -> None:
    from kubernetes.client import BatchV1Api, CustomObjectsApi

    batch = BatchV1Api(cluster.client())
    queues = CustomObjectsApi(cluster.client())
    hold = {"spec": {"stopPolicy": "Hold"}}
    queues.patch_namespaced_custom_object(
        "kueue.x-k8s.io", "v1beta2", NS, "localqueues", "trainyard-low", hold
    )
    job = _job("queued", ["pass"], **{"kueue.x-k8s.io/queue-name": "trainyard-low"})
    BatchV1Api(api).create_namespaced_job(NS, job)
    time.sleep(1)
    assert batch.read_namespaced_job("queued", NS).spec.suspend is True  # the webhook's
    run = {"spec": {"stopPolicy": "None"}}
    queues.patch_namespaced_custom_object(
        "kueue.x-k8s.io", "v1beta2", NS, "localqueues", "trainyard-low", run
    )
    _wait(
        "admitted and done",
        lambda: batch.read_namespaced_job_status("queued", NS).status.completion_time,
    )
    template = batch.read_namespaced_job("queued", NS).spec.template.spec
    assert template.node_selector == {"nvidia.com/gpu.product": "Tesla-T4"}  # the flavor's
