"""Applying rendered objects to a cluster: create if missing, replace, delete, roll out, wait.

What the kubernetes runner does to the cluster, with no Airflow in it: the decisions are
functions of typed ``kubernetes.client`` objects and API clients (a ``KubernetesHook``'s,
passed in); ``orchestration/runners.py`` only calls them. Run against localkube, a local
API server, in ``tests/e2e/test_kubernetes_runner.py``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

from trainyard.errors import ServingError, TrainingError, TrainyardError
from trainyard.k8s import objects
from trainyard.k8s.objects import RUN_LABEL

if TYPE_CHECKING:
    from kubernetes.client import CoreV1Api, CustomObjectsApi, V1Job, V1Service

    from trainyard.config import PipelineConfig
    from trainyard.k8s.objects import TrainingObjects
    from trainyard.k8s.profile import ClusterProfile

log = logging.getLogger("trainyard.k8s")

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


# --------------------------------------------------------------------------- the runner's


VOLUME_SNAPSHOT_POLL_S = 10.0


JOB_POLL_S = 10.0


RUN_ANNOTATION = "trainyard.io/airflow-run-id"


def create_or_reattach_job(batch: Any, job: V1Job, *, log: Any = log.info) -> V1Job:
    """Create a Job, or reattach to the same run's Job that is still running.

    Args:
        batch: ``BatchV1Api``.
        job: The Job to create (annotated with the run id).
        log: Message sink.

    Returns:
        The Job that runs (created or existing).
    """
    from kubernetes.client import V1DeleteOptions
    from kubernetes.client.rest import ApiException

    name, ns = job.metadata.name, job.metadata.namespace
    try:
        current = batch.read_namespaced_job(name, ns)
    except ApiException as e:
        if e.status != 404:
            raise
        current = None
    if current is not None:
        same_run = (current.metadata.annotations or {}).get(RUN_ANNOTATION) == (
            (job.metadata.annotations or {}).get(RUN_ANNOTATION)
        )
        status = current.status
        finished = bool(status and ((status.failed or 0) > 0 or status.completion_time))
        if same_run and not finished:
            log(f"reattached to Job {name} of this run (still running)")
            return current
        log(f"deleting Job {name} left behind ({'finished' if same_run else 'another run'})")
        batch.delete_namespaced_job(name, ns, body=V1DeleteOptions(propagation_policy="Foreground"))
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                batch.read_namespaced_job(name, ns)
            except ApiException as e:
                if e.status == 404:
                    break
                raise
            time.sleep(1)
    batch.create_namespaced_job(ns, job)
    return job


def find_job_pods(
    core: Any,
    batch: Any,
    job: V1Job,
    *,
    expected: int,
    timeout_s: float,
    first_pause_s: float = 1.0,
    max_pause_s: float = 30.0,
) -> list[Any]:
    """The pods of a Job, waiting while it is suspended (Kueue) or its pods are created.

    Args:
        core: ``CoreV1Api``.
        batch: ``BatchV1Api``.
        job: The Job.
        expected: How many pods to wait for.
        timeout_s: Give up after this long.
        first_pause_s: First pause between looks (doubling up to ``max_pause_s``).
        max_pause_s: Longest pause.

    Returns:
        The pods; fewer once the Job has ended (a failed Job deletes its running pods, so
        the rest never come).

    Raises:
        AirflowException: If the pods do not all exist in time, naming the Job and
            whether it is still suspended (not admitted).
    """
    name, ns = job.metadata.name, job.metadata.namespace
    selector = f"job-name={name}"
    pause, deadline = first_pause_s, time.monotonic() + timeout_s
    suspended = False
    while True:
        pods = core.list_namespaced_pod(ns, label_selector=selector).items
        if len(pods) >= expected:
            return list(pods)
        current = batch.read_namespaced_job(name, ns)
        conditions = (current.status.conditions if current.status else None) or []
        if any(c.type in ("Complete", "Failed") and c.status == "True" for c in conditions):
            return list(pods)
        suspended = bool(current.spec and current.spec.suspend)
        if time.monotonic() + pause > deadline:
            state = "still suspended (not admitted by Kueue)" if suspended else "not all created"
            raise TrainingError(
                f"Job {ns}/{name}: {len(pods)} of {expected} pods after {timeout_s:g}s; {state}"
            )
        time.sleep(pause)
        pause = min(pause * 2, max_pause_s)


def delete_training_objects(hook: Any, objects: TrainingObjects) -> list[str]:
    """Every Job, the Service and the pods of a run's training, whichever exist."""
    from kubernetes.client import V1DeleteOptions

    batch, core = hook.batch_v1_client, hook.core_v1_client
    ns, base = objects.service.metadata.namespace, objects.name
    foreground = V1DeleteOptions(propagation_policy="Foreground")
    deleted = []
    for job in objects.jobs:
        jname = job.metadata.name
        if delete_if_exists(partial(batch.delete_namespaced_job, jname, ns, body=foreground)):
            deleted.append(f"job {jname}")
    if delete_if_exists(partial(core.delete_namespaced_service, base, ns)):
        deleted.append(f"service {base}")
    core.delete_collection_namespaced_pod(ns, label_selector=f"{RUN_LABEL}={base}")
    log.info(
        "deleted %s and the pods labelled %s=%s",
        ", ".join(deleted) or "nothing",
        RUN_LABEL,
        base,
    )
    return deleted


def ensure_volumes(core: CoreV1Api, profile: ClusterProfile, cfg: PipelineConfig) -> list[str]:
    """The dataset's PVC and the models PVC, created when missing; returns those created."""
    ns, st = profile.namespace, cfg.staging
    claims = [
        objects.dataset_pvc(profile, cfg.dataset, st.pvc_size, st.storage_class, st.access_mode),
        objects.models_pvc(profile),
    ]
    created = []
    for pvc in claims:
        name = pvc.metadata.name
        _, new = ensure_exists(
            partial(core.create_namespaced_persistent_volume_claim, ns, pvc),
            partial(core.read_namespaced_persistent_volume_claim, name, ns),
        )
        log.info("PVC %s: %s", name, "created" if new else "exists")
        created += [name] if new else []
    return created


def ensure_serving(hook: Any, profile: ClusterProfile, cfg: PipelineConfig) -> str:
    """TF Serving's Deployment + Service: created when missing, else rolled to this spec.

    TF Serving loads new version folders by itself, so a model deploy changes no pod; this
    only (re)applies the serving spec, waits for the rollout within its progress deadline
    and, when it stalls, puts the previous spec back.

    Returns:
        The Service's host name the deploy step smoke-tests through.
    """
    serving = cfg.serving
    deployment = objects.serving_deployment(profile, serving.model_name, 0, serving.replicas)
    service = objects.serving_service(profile, serving.model_name)
    ns = profile.namespace
    apps, core = hook.apps_v1_client, hook.core_v1_client
    dname, sname = deployment.metadata.name, service.metadata.name
    ensure_exists(
        lambda: core.create_namespaced_service(ns, service),
        lambda: core.read_namespaced_service(sname, ns),
    )
    current, created = ensure_exists(
        lambda: apps.create_namespaced_deployment(ns, deployment),
        lambda: apps.read_namespaced_deployment(dname, ns),
    )
    if created:
        # nothing to serve before this deploy writes the model config: its pods get ready
        # once the version loads, which the deploy step waits for through the Service
        return f"{sname}.{ns}.svc"
    previous = current.spec.template
    apps.patch_namespaced_deployment(dname, ns, {"spec": {"template": deployment.spec.template}})
    deadline = (deployment.spec.progress_deadline_seconds or 600) + 60
    state = wait_rollout(lambda: apps.read_namespaced_deployment(dname, ns), deadline, log=log.info)
    if state != "complete":
        apps.patch_namespaced_deployment(dname, ns, {"spec": {"template": previous}})
        log.warning("serving rollout %s: restored the previous spec", state)
        raise ServingError(f"serving Deployment {dname} rollout {state}")
    return f"{sname}.{ns}.svc"


def ensure_scorer(
    apps: Any, profile: ClusterProfile, cfg: PipelineConfig, version: Any = None
) -> str:
    """Create the pipeline's scorer Deployment, or roll it to this spec and model version.

    Called after a deploy: the pods restart with the current config (the version
    annotation changes the pod template), consumer-group members hand their partitions
    over, and each scores with the version the ``stable`` label names.

    Returns:
        One line saying what was done.
    """
    from trainyard.k8s.objects import VERSION_ANNOTATION
    from trainyard.k8s.scoring import scorer_deployment

    deployment = scorer_deployment(profile, cfg)
    if version is not None:
        deployment.spec.template.metadata.annotations[VERSION_ANNOTATION] = str(version)
    ns, name = profile.namespace, deployment.metadata.name
    _, created = ensure_exists(
        lambda: apps.create_namespaced_deployment(ns, deployment),
        lambda: apps.read_namespaced_deployment(name, ns),
    )
    if created:
        return f"scorer Deployment {name} created ({deployment.spec.replicas} replicas)"
    apps.patch_namespaced_deployment(
        name,
        ns,
        {"spec": {"replicas": deployment.spec.replicas, "template": deployment.spec.template}},
    )
    return f"scorer Deployment {name} rolled ({deployment.spec.replicas} replicas)"


def replace_training_service(core: CoreV1Api, service: V1Service, run: str = "") -> bool:
    """Create a run's headless Service, replacing one of the same name left behind.

    Args:
        core: The core API client.
        service: The run's Service (:func:`~trainyard.k8s.render.run_training_objects`).
        run: The run id; a Service of the same run is kept (a retry reattaches).

    Returns:
        True if a Service left behind by an earlier run was deleted first.
    """
    from kubernetes.client.rest import ApiException

    try:
        current = core.read_namespaced_service(service.metadata.name, service.metadata.namespace)
    except ApiException as e:
        if e.status != 404:
            raise
        current = None
    if (
        current is not None
        and run
        and (current.metadata.annotations or {}).get(RUN_ANNOTATION) == run
    ):
        return False

    name, ns = service.metadata.name, service.metadata.namespace
    _, replaced = recreate(
        lambda: core.create_namespaced_service(ns, service),
        lambda: core.delete_namespaced_service(name, ns),
        lambda: core.read_namespaced_service(name, ns),
        what=f"Service {name}",
    )
    if replaced:
        log.warning("replaced Service %s left behind by an earlier run", name)
    return replaced


def take_volume_snapshot(
    custom: CustomObjectsApi,
    body: dict[str, Any],
    timeout_s: float,
    poll_s: float = VOLUME_SNAPSHOT_POLL_S,
) -> dict[str, Any]:
    """Create a VolumeSnapshot unless it exists, then wait until it is ready to use.

    Its name is fixed by dataset and snapshot id, so a retry or a re-run finds the one
    already taken (a 409 from a concurrent create counts as taken too) and only waits.

    Args:
        custom: The custom objects API client.
        body: The VolumeSnapshot (:func:`trainyard.k8s.objects.volume_snapshot`).
        timeout_s: How long it may take to become ready to use.
        poll_s: Seconds between reads while it does.

    Returns:
        ``name``, ``namespace``, ``pvc``, ``created`` (by this call), ``restore_size`` and
        ``content`` (the bound VolumeSnapshotContent), for the task's XCom.

    Raises:
        VolumeSnapshotError: If the VolumeSnapshot reports ``status.error``.
        TimeoutError: If it is not ready to use within ``timeout_s``.
    """
    group, version, plural = (
        objects.VOLUME_SNAPSHOT_GROUP,
        objects.VOLUME_SNAPSHOT_VERSION,
        objects.VOLUME_SNAPSHOT_PLURAL,
    )
    name, ns = body["metadata"]["name"], body["metadata"]["namespace"]
    pvc = body["spec"]["source"]["persistentVolumeClaimName"]
    what = f"VolumeSnapshot {ns}/{name} of PVC {pvc}"

    def read() -> dict[str, Any]:
        return custom.get_namespaced_custom_object(group, version, ns, plural, name)

    _, created = ensure_exists(
        lambda: custom.create_namespaced_custom_object(group, version, ns, plural, body), read
    )
    log.info("%s: %s", what, "created" if created else "exists")
    status = wait_volume_snapshot(
        read, what=what, timeout_s=timeout_s, poll_s=poll_s, log=log.info
    ).get("status", {})
    return {
        "name": name,
        "namespace": ns,
        "pvc": pvc,
        "created": created,
        "restore_size": status.get("restoreSize"),
        "content": status.get("boundVolumeSnapshotContentName"),
    }
