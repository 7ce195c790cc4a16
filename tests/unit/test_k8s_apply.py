"""Create-if-missing and rollout decisions on typed Kubernetes objects."""

from __future__ import annotations

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

from trainyard.k8s.apply import delete_if_exists, ensure_exists, rollout_state


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
