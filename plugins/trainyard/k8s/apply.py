"""Applying rendered objects to a cluster: create if missing, replace, delete, roll out, wait.

The decisions are pure functions of typed ``kubernetes.client`` objects (unit-tested
offline); the Airflow adapter calls them with a real API client.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

from trainyard.errors import TrainyardError

RolloutState = Literal["complete", "progressing", "stalled"]
SnapshotState = Literal["ready", "failed", "pending"]


class VolumeSnapshotError(TrainyardError):
    """A VolumeSnapshot reports an error (``status.error``) instead of becoming ready."""


def ensure_exists(create: Callable[[], Any], read: Callable[[], Any]) -> tuple[Any, bool]:
    """Create an object unless it exists (a 409 from a concurrent creator counts as exists).

    Args:
        create: Creates the object (a call of the typed API, e.g. creating a PVC).
        read: Reads it back (raises ``ApiException`` 404 when it does not exist).

    Returns:
        (the object as the API returns it, True if this call created it).
    """
    from kubernetes.client.exceptions import ApiException

    try:
        return read(), False
    except ApiException as e:
        if e.status != 404:
            raise
    try:
        return create(), True
    except ApiException as e:
        if e.status != 409:
            raise
        return read(), False


def delete_if_exists(delete: Callable[[], Any]) -> bool:
    """Delete an object, counting "not found" (a 404) as already gone.

    Args:
        delete: Deletes the object (a call of the typed API, e.g. deleting a Job).

    Returns:
        True if this call deleted it, False if it did not exist.
    """
    from kubernetes.client.exceptions import ApiException

    try:
        delete()
    except ApiException as e:
        if e.status != 404:
            raise
        return False
    return True


def recreate(
    create: Callable[[], Any],
    delete: Callable[[], Any],
    read: Callable[[], Any],
    *,
    what: str = "object",
    timeout_s: float = 300.0,
    poll_s: float = 2.0,
) -> tuple[Any, bool]:
    """Create an object from this spec, first deleting one of the same name left behind.

    For objects with a fixed name whose spec changes from run to run (a training run's
    Service and Jobs; a Job's spec cannot be patched). A deletion is not done when the API
    answers: a foreground deletion keeps the object until its dependents are gone, and a
    create meanwhile fails with 409. So the leftover is read until it is gone.

    Args:
        create: Creates the object (a call of the typed API).
        delete: Deletes it (raises ``ApiException`` 404 when it does not exist).
        read: Reads it (raises ``ApiException`` 404 once it is gone).
        what: The object, for the timeout's message (e.g. ``Job job-ty-digits-...``).
        timeout_s: How long the leftover may take to disappear.
        poll_s: Seconds between reads while it does.

    Returns:
        (the object as ``create`` returns it, True if a leftover was deleted first).

    Raises:
        TimeoutError: If the leftover still exists ``timeout_s`` after its deletion.
        ApiException: Any other API error (a 409 from ``create`` means another creator
            made the object in the meantime).
    """
    from kubernetes.client.exceptions import ApiException

    replaced = delete_if_exists(delete)
    end = time.monotonic() + timeout_s
    while replaced:
        try:
            read()
        except ApiException as e:
            if e.status != 404:
                raise
            break
        if time.monotonic() >= end:
            raise TimeoutError(f"{what} still exists {timeout_s:.0f} s after its deletion")
        time.sleep(poll_s)
    return create(), replaced


def rollout_state(deployment: Any) -> RolloutState:
    """Where a Deployment's rollout stands, the way ``kubectl rollout status`` decides.

    Args:
        deployment: A ``V1Deployment`` read from the API (spec and status).

    Returns:
        ``complete`` when the observed generation is current and every replica is updated
        and available; ``stalled`` when the Progressing condition reports
        ``ProgressDeadlineExceeded``; else ``progressing``.
    """
    meta, spec, status = deployment.metadata, deployment.spec, deployment.status
    if status is None:
        return "progressing"
    for cond in status.conditions or []:
        if cond.type == "Progressing" and cond.reason == "ProgressDeadlineExceeded":
            return "stalled"
    want = spec.replicas if spec.replicas is not None else 1
    if (
        (status.observed_generation or 0) >= (meta.generation or 0)
        and (status.updated_replicas or 0) >= want
        and (status.available_replicas or 0) >= want
        and (status.replicas or 0) <= want
    ):
        return "complete"
    return "progressing"


def wait_rollout(
    read: Callable[[], Any],
    timeout_s: float,
    poll_s: float = 5.0,
    log: Callable[[str], None] = print,
) -> RolloutState:
    """Poll a Deployment until its rollout completes, stalls, or ``timeout_s`` passes.

    Returns:
        The last state seen (``progressing`` means the timeout passed).
    """
    end = time.monotonic() + timeout_s
    state: RolloutState = "progressing"
    while time.monotonic() < end:
        state = rollout_state(read())
        if state != "progressing":
            break
        time.sleep(poll_s)
    log(f"rollout: {state}")
    return state


def volume_snapshot_state(snapshot: Mapping[str, Any]) -> tuple[SnapshotState, str]:
    """Where a VolumeSnapshot stands, from its ``status``.

    Args:
        snapshot: The VolumeSnapshot as the API returns it (a dict: it is a CRD).

    Returns:
        (state, message): ``ready`` when ``status.readyToUse`` is true, else ``failed``
        with the message of ``status.error`` when it is set, else ``pending``; the message
        is empty unless failed.
    """
    status = snapshot.get("status") or {}
    if status.get("readyToUse") is True:
        return "ready", ""
    error = status.get("error")
    if error:
        return "failed", str(error.get("message") or error)
    return "pending", ""


def wait_volume_snapshot(
    read: Callable[[], Mapping[str, Any]],
    *,
    what: str,
    timeout_s: float,
    poll_s: float = 5.0,
    log: Callable[[str], None] = print,
) -> Mapping[str, Any]:
    """Poll a VolumeSnapshot until it is ready to use.

    Args:
        read: Reads the VolumeSnapshot (e.g. ``CustomObjectsApi.get_namespaced_custom_object``).
        what: The object, for messages (e.g. ``VolumeSnapshot trainyard/trainyard-data-...``).
        timeout_s: Deadline from the first read.
        poll_s: Seconds between reads.
        log: Where the outcome is reported.

    Returns:
        The VolumeSnapshot as last read (``status.readyToUse`` true).

    Raises:
        VolumeSnapshotError: If it reports ``status.error`` (the message is included).
        TimeoutError: If it is not ready ``timeout_s`` after the first read.
    """
    end = time.monotonic() + timeout_s
    while True:
        snapshot = read()
        state, message = volume_snapshot_state(snapshot)
        if state == "ready":
            size = (snapshot.get("status") or {}).get("restoreSize")
            log(f"{what}: ready to use" + (f" (restore size {size})" if size else ""))
            return snapshot
        if state == "failed":
            raise VolumeSnapshotError(f"{what} failed: {message}")
        left = end - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{what} is still not ready to use after {timeout_s:.0f} s")
        time.sleep(min(poll_s, left))
