"""Create-if-missing and rollout decisions on typed Kubernetes objects."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kubernetes.client import (
    V1Deployment,
    V1DeploymentCondition,
    V1DeploymentSpec,
    V1DeploymentStatus,
    V1LabelSelector,
    V1ObjectMeta,
    V1PodTemplateSpec,
)
from kubernetes.client.exceptions import ApiException

from trainyard.k8s.apply import (
    VolumeSnapshotError,
    delete_if_exists,
    ensure_exists,
    recreate,
    rollout_state,
    volume_snapshot_state,
    wait_volume_snapshot,
)


def _deployment(
    generation: int,
    observed: int,
    updated: int,
    available: int,
    running: int,
    stalled: bool = False,
) -> V1Deployment:
    """A 2-replica Deployment with the given rollout status."""
    conditions = (
        [
            V1DeploymentCondition(
                type="Progressing", status="False", reason="ProgressDeadlineExceeded"
            )
        ]
        if stalled
        else None
    )
    return V1Deployment(
        metadata=V1ObjectMeta(name="serving-digits", generation=generation),
        spec=V1DeploymentSpec(replicas=2, selector=V1LabelSelector(), template=V1PodTemplateSpec()),
        status=V1DeploymentStatus(
            observed_generation=observed,
            updated_replicas=updated,
            available_replicas=available,
            replicas=running,
            conditions=conditions,
        ),
    )


@pytest.mark.parametrize(
    ("deployment", "state"),
    [
        (_deployment(2, 2, 2, 2, 2), "complete"),
        (_deployment(3, 2, 2, 2, 2), "progressing"),
        (_deployment(2, 2, 1, 2, 3), "progressing"),
        (_deployment(2, 2, 2, 1, 2), "progressing"),
        (_deployment(2, 2, 1, 1, 2, stalled=True), "stalled"),
    ],
    ids=["complete", "generation-not-observed", "old-pods-left", "not-available", "deadline"],
)
def test_rollout_state(deployment: V1Deployment, state: str) -> None:
    assert rollout_state(deployment) == state


def test_ensure_exists_creates_when_missing_and_reads_when_present() -> None:
    store: dict[str, str] = {}

    def read() -> str:
        if "pvc" not in store:
            raise ApiException(status=404)
        return store["pvc"]

    def create() -> str:
        if "pvc" in store:
            raise ApiException(status=409)
        store["pvc"] = "claim"
        return "claim"

    assert ensure_exists(create, read) == ("claim", True)
    assert ensure_exists(create, read) == ("claim", False)


def test_ensure_exists_treats_a_concurrent_create_as_existing() -> None:
    reads = iter([ApiException(status=404), "theirs"])

    def read() -> str:
        item = next(reads)
        if isinstance(item, Exception):
            raise item
        return item

    def create() -> str:
        raise ApiException(status=409)

    assert ensure_exists(create, read) == ("theirs", False)


def test_ensure_exists_surfaces_other_errors() -> None:
    def read() -> str:
        raise ApiException(status=403, reason="Forbidden")

    with pytest.raises(ApiException):
        ensure_exists(lambda: "x", read)


def test_delete_if_exists_counts_not_found_as_gone() -> None:
    store = {"job-ty-digits-worker": "job"}

    def delete() -> None:
        if store.pop("job-ty-digits-worker", None) is None:
            raise ApiException(status=404)

    assert delete_if_exists(delete) is True
    assert delete_if_exists(delete) is False


def test_delete_if_exists_surfaces_other_errors() -> None:
    def delete() -> None:
        raise ApiException(status=403, reason="Forbidden")

    with pytest.raises(ApiException):
        delete_if_exists(delete)


class OneName:
    """One object name in a namespace, as the API serves it (create, delete, read).

    A deletion takes ``terminating_reads`` reads to finish, as a foreground deletion waits
    for the object's pods; until then the object is still there and a create gets 409.
    """

    def __init__(self, leftover: str | None = None, terminating_reads: int = 0) -> None:
        self.obj = leftover
        self.terminating_reads = terminating_reads
        self.deleting = False
        self.calls: list[str] = []

    def create(self, spec: str) -> str:
        self.calls.append("create")
        if self.obj is not None:
            raise ApiException(status=409, reason="AlreadyExists")
        self.obj = spec
        return spec

    def delete(self) -> None:
        self.calls.append("delete")
        if self.obj is None:
            raise ApiException(status=404, reason="NotFound")
        self.deleting = True

    def read(self) -> str:
        self.calls.append("read")
        if self.deleting and self.terminating_reads == 0:
            self.obj, self.deleting = None, False
        if self.obj is None:
            raise ApiException(status=404, reason="NotFound")
        if self.deleting:
            self.terminating_reads -= 1
        return self.obj


@pytest.mark.parametrize(
    ("leftover", "terminating_reads", "replaced", "calls"),
    [
        (None, 0, False, ["delete", "create"]),
        ("service of an earlier run", 0, True, ["delete", "read", "create"]),
        ("job with 3 pods left", 3, True, ["delete", "read", "read", "read", "read", "create"]),
    ],
    ids=["nothing left behind", "leftover gone at once", "leftover terminating"],
)
def test_recreate_replaces_a_leftover_with_this_spec(
    leftover: str | None, terminating_reads: int, replaced: bool, calls: list[str]
) -> None:
    name = OneName(leftover, terminating_reads)
    result = recreate(lambda: name.create("this run"), name.delete, name.read, poll_s=0)
    assert result == ("this run", replaced)
    assert name.obj == "this run"
    assert name.calls == calls


def test_recreate_gives_up_on_a_leftover_that_never_goes() -> None:
    name = OneName("job with a stuck finalizer", terminating_reads=10**9)
    with pytest.raises(TimeoutError, match="Job job-ty-digits-worker still exists"):
        recreate(
            lambda: name.create("this run"),
            name.delete,
            name.read,
            what="Job job-ty-digits-worker",
            timeout_s=0.05,
            poll_s=0.01,
        )
    assert "create" not in name.calls
    assert name.obj == "job with a stuck finalizer"


def test_recreate_surfaces_other_errors() -> None:
    def forbidden() -> None:
        raise ApiException(status=403, reason="Forbidden")

    name = OneName("left behind")
    with pytest.raises(ApiException) as deleting:
        recreate(lambda: name.create("this run"), forbidden, name.read, poll_s=0)
    assert deleting.value.status == 403
    with pytest.raises(ApiException) as reading:
        recreate(lambda: name.create("this run"), name.delete, forbidden, poll_s=0)
    assert reading.value.status == 403
    assert "create" not in name.calls


def test_recreate_does_not_overwrite_a_concurrent_creator() -> None:
    name = OneName()

    def create_after_someone_else() -> str:
        name.obj = "theirs"
        return name.create("this run")

    with pytest.raises(ApiException) as conflict:
        recreate(create_after_someone_else, name.delete, name.read, poll_s=0)
    assert conflict.value.status == 409
    assert name.obj == "theirs"


# ------------------------------------------------------------------ VolumeSnapshot status

SNAPSHOT = "VolumeSnapshot trainyard/trainyard-data-digits-88fa3acafa0854bd"
PENDING = {"status": {"readyToUse": False}}
READY = {"status": {"readyToUse": True, "restoreSize": "10Gi"}}
FAILED = {
    "status": {
        "readyToUse": False,
        "error": {"message": "rpc error: snapshot quota exceeded", "time": "2026-11-22T02:20Z"},
    }
}


@pytest.mark.parametrize(
    ("snapshot", "state"),
    [
        ({}, ("pending", "")),
        ({"status": {}}, ("pending", "")),
        (PENDING, ("pending", "")),
        (READY, ("ready", "")),
        (FAILED, ("failed", "rpc error: snapshot quota exceeded")),
        ({"status": {"error": {"time": "2026-11-22T02:20Z"}}}, ("failed", "{'time'")),
    ],
    ids=["just created", "empty status", "not ready", "ready", "error", "error no message"],
)
def test_volume_snapshot_state(snapshot: dict, state: tuple[str, str]) -> None:
    got = volume_snapshot_state(snapshot)
    assert got[0] == state[0]
    assert got[1].startswith(state[1])


def _reads(*statuses: dict) -> tuple[list[dict], Callable[[], dict]]:
    """A ``read`` returning ``statuses`` in turn (the last one from then on)."""
    served: list[dict] = []

    def read() -> dict:
        item = statuses[min(len(served), len(statuses) - 1)]
        served.append(item)
        return item

    return served, read


def test_wait_volume_snapshot_returns_once_ready() -> None:
    served, read = _reads({}, PENDING, PENDING, READY)
    logged: list[str] = []
    snap = wait_volume_snapshot(read, what=SNAPSHOT, timeout_s=5, poll_s=0, log=logged.append)
    assert snap is READY
    assert len(served) == 4
    assert logged == [f"{SNAPSHOT}: ready to use (restore size 10Gi)"]


def test_wait_volume_snapshot_fails_on_an_error_naming_the_object() -> None:
    served, read = _reads(PENDING, FAILED)
    with pytest.raises(VolumeSnapshotError) as e:
        wait_volume_snapshot(read, what=SNAPSHOT, timeout_s=5, poll_s=0)
    assert str(e.value) == f"{SNAPSHOT} failed: rpc error: snapshot quota exceeded"
    assert len(served) == 2


def test_wait_volume_snapshot_gives_up_at_the_deadline() -> None:
    served, read = _reads(PENDING)
    with pytest.raises(TimeoutError, match=f"{SNAPSHOT} is still not ready to use after"):
        wait_volume_snapshot(read, what=SNAPSHOT, timeout_s=0.05, poll_s=0.01)
    assert len(served) >= 2
