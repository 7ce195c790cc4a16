"""Pure builders of typed ``kubernetes.client`` objects for every trainyard workload.

Nothing here talks to a cluster. ``kubernetes.client`` is imported inside the functions
(it takes about a second to import), so the Airflow DAG parse path stays cheap.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from trainyard.errors import ConfigError
from trainyard.k8s.placement import Placement, cpu_placement, placement_for_tier
from trainyard.settings import SERVING_GRPC_PORT, SERVING_REST_PORT
from trainyard.training import spec

if TYPE_CHECKING:
    from kubernetes.client import (
        V1Deployment,
        V1Job,
        V1PersistentVolumeClaim,
        V1Pod,
        V1PodSecurityContext,
        V1ResourceRequirements,
        V1SecurityContext,
        V1Service,
        V1Volume,
        V1VolumeMount,
    )

    from trainyard.config import PipelineConfig
    from trainyard.k8s.profile import ClusterProfile, Resources

VOLUME_ROOT = "/volumes"
TF_PORT = 2222
BASE_CONTAINER = "base"
"""Main container name: ``KubernetesPodOperator.base_container_name`` (logs, XCom)."""
JOB_NAME_PREFIX = "job-"
"""``KubernetesJobOperator`` prepends this to every Job name; our Job names carry it."""
APP_LABEL = "app.kubernetes.io/name"
COMPONENT_LABEL = "app.kubernetes.io/component"
RUN_LABEL = "trainyard.io/run"
ROLE_LABEL = "trainyard.io/role"
MODEL_LABEL = "trainyard.io/model"
PIPELINE_LABEL = "trainyard.io/pipeline"
DATASET_LABEL = "trainyard.io/dataset"
SNAPSHOT_LABEL = "trainyard.io/snapshot"
VERSION_ANNOTATION = "trainyard.io/model-version"
MODELS_SUBPATHS = ("_models", "_serving", "_checkpoints")
"""Folders of the models PVC, mounted at ``/volumes/<folder>`` (the volume layout)."""

STEP_PROGRAM = ("python", "-m", "trainyard")
"""Every step pod runs ``python -m trainyard <step> <args>`` (the step table's CLI)."""
XCOM_PATH = "/airflow/xcom/return.json"
"""Where a step pod writes its result (KubernetesPodOperator's XCom sidecar reads it)."""
TERMINATION_LOG = "/dev/termination-log"
"""Where a step pod writes its one-line error (the container's terminationMessagePath)."""
Role = Literal["worker", "chief", "ps"]
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
VOLUME_SNAPSHOT_GROUP = "snapshot.storage.k8s.io"
VOLUME_SNAPSHOT_VERSION = "v1"
VOLUME_SNAPSHOT_PLURAL = "volumesnapshots"
STEP_POD_NAME_MAX = 54
"""``KubernetesPodOperator`` cuts a pod name to 54 characters before its random suffix;
a step pod's name fits, so the part that tells pipelines apart is never cut."""
SERVING_PREFIX = "serving-"


def k8s_name(text: str, max_len: int = 63) -> str:
    """A DNS-1123 label from free text (``digits_v2`` → ``digits-v2``).

    Args:
        text: Any name (pipeline, dataset, run id).
        max_len: Maximum length.

    Returns:
        Lowercase letters, digits and ``-``, starting with a letter.

    Raises:
        ConfigError: If nothing usable remains.
    """
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    name = re.sub(r"-{2,}", "-", name)
    if not name or not name[0].isalpha():
        raise ConfigError(f"cannot derive a Kubernetes name from {text!r}")
    return name[:max_len].rstrip("-")


def dataset_pvc_name(dataset: str) -> str:
    """The PVC holding a dataset's volume: ``trainyard-data-<dataset>``.

    ``_`` becomes ``-``, and runs of ``-`` one (``a__b`` and ``a_b`` meet: ``pipelines
    check`` refuses the second, see :func:`trainyard.pipelines.k8s_name_clashes`). When that
    is longer than 63 characters: its head, cut to fit, then ``-<hash8>`` of the dataset
    name, so two long names with the same head never share a volume.
    """
    return _fitted_label(k8s_name(f"trainyard-data-{dataset}", 255), dataset)


def _digest(text: str, size: int = 4) -> str:
    return hashlib.blake2b(text.encode(), digest_size=size).hexdigest()


def _fitted_label(name: str, identity: str, max_len: int = 63) -> str:
    """``name`` if it is a DNS-1123 label of at most ``max_len``, else its head + ``-<hash8>``.

    The hash is of ``identity`` (what the name stands for), so distinct identities keep
    distinct names: callers pass a ``name`` made one-to-one from ``identity`` (pipeline
    names have no ``-``, so ``_`` → ``-`` is), and anything else (lowercased, other
    characters replaced, cut) gets the hash.
    """
    if len(name) <= max_len and DNS_LABEL.match(name):
        return name
    digest = _digest(identity)
    return f"{k8s_name(name, max_len - len(digest) - 1)}-{digest}"


def pipeline_label(pipeline: str) -> str:
    """The ``trainyard.io/pipeline`` label value of a pipeline's objects (``_`` → ``-``)."""
    return k8s_name(pipeline)


def step_pod_name(step: str, pipeline: str) -> str:
    """A step pod's name: ``trainyard-<step>-<pipeline>``, ``_`` → ``-``.

    At most :data:`STEP_POD_NAME_MAX` characters: longer ones are cut and end in
    ``-<hash8>`` of the pipeline name, so two pipelines never share a step pod's name.
    """
    return _fitted_label(
        f"trainyard-{step}-{pipeline.replace('_', '-')}", pipeline, STEP_POD_NAME_MAX
    )


def _labels(component: str, **extra: str) -> dict[str, str]:
    return {APP_LABEL: "trainyard", COMPONENT_LABEL: component, **extra}


def _pipeline_labels(pipeline: str | None) -> dict[str, str]:
    return {} if pipeline is None else {PIPELINE_LABEL: pipeline_label(pipeline)}


def _label_value(text: str) -> str:
    """``text`` as a label value: ``[A-Za-z0-9_.-]``, alphanumeric at both ends, <= 63."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:63].strip("-_.")


def restricted_pod_security_context(profile: ClusterProfile | None = None) -> V1PodSecurityContext:
    """Pod-level security context meeting Pod Security "restricted".

    Args:
        profile: Supplies uid/gid/fsGroup (defaults: 50000/0/0, the apache/airflow user).

    Returns:
        runAsNonRoot, a non-zero runAsUser, fsGroup, seccomp RuntimeDefault.
    """
    from kubernetes.client import V1PodSecurityContext, V1SeccompProfile

    from trainyard.k8s.profile import Security

    sec = profile.security if profile else Security()
    return V1PodSecurityContext(
        run_as_non_root=True,
        run_as_user=sec.run_as_user,
        run_as_group=sec.run_as_group,
        fs_group=sec.fs_group,
        fs_group_change_policy="OnRootMismatch",
        seccomp_profile=V1SeccompProfile(type="RuntimeDefault"),
    )


def restricted_security_context(*, read_only_root: bool = False) -> V1SecurityContext:
    """Container-level security context meeting Pod Security "restricted".

    Args:
        read_only_root: Also make the root filesystem read-only (serving; the Python steps
            and TensorFlow write caches under ``$HOME``).

    Returns:
        No privilege escalation, every capability dropped, non-root, seccomp RuntimeDefault.
    """
    from kubernetes.client import V1Capabilities, V1SeccompProfile, V1SecurityContext

    return V1SecurityContext(
        allow_privilege_escalation=False,
        privileged=False,
        capabilities=V1Capabilities(drop=["ALL"]),
        run_as_non_root=True,
        read_only_root_filesystem=read_only_root,
        seccomp_profile=V1SeccompProfile(type="RuntimeDefault"),
    )


def xcom_sidecar_security_context() -> dict[str, Any]:
    """Security context for KubernetesPodOperator's XCom sidecar (``airflow-xcom-sidecar``).

    Pass it as ``xcom_sidecar_container_security_context=`` (provider >= 10.x) or set it in
    the Kubernetes connection extra ``xcom_sidecar_container_security_context``; without
    it the sidecar has no security context and the pod is rejected by a "restricted"
    namespace whenever ``do_xcom_push=True``.

    Returns:
        The restricted container security context, as a plain dict.
    """
    from kubernetes.client import ApiClient

    return ApiClient().sanitize_for_serialization(restricted_security_context(read_only_root=True))


def _resources(res: Resources, gpus: int = 0) -> V1ResourceRequirements:
    from kubernetes.client import V1ResourceRequirements

    limits = dict(res.limits)
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    return V1ResourceRequirements(requests=dict(res.requests) or None, limits=limits or None)


def _tmp_volume() -> tuple[V1Volume, V1VolumeMount]:
    from kubernetes.client import V1EmptyDirVolumeSource, V1Volume, V1VolumeMount

    return (
        V1Volume(name="tmp", empty_dir=V1EmptyDirVolumeSource(size_limit="1Gi")),
        V1VolumeMount(name="tmp", mount_path="/tmp"),
    )


def _data_volume(dataset: str, read_only: bool) -> tuple[V1Volume, V1VolumeMount]:
    from kubernetes.client import V1PersistentVolumeClaimVolumeSource, V1Volume, V1VolumeMount

    return (
        V1Volume(
            name="data",
            persistent_volume_claim=V1PersistentVolumeClaimVolumeSource(
                claim_name=dataset_pvc_name(dataset), read_only=read_only
            ),
        ),
        V1VolumeMount(name="data", mount_path=f"{VOLUME_ROOT}/{dataset}", read_only=read_only),
    )


def _models_volume(
    profile: ClusterProfile, subpaths: dict[str, bool]
) -> tuple[V1Volume, list[V1VolumeMount]]:
    from kubernetes.client import V1PersistentVolumeClaimVolumeSource, V1Volume, V1VolumeMount

    all_ro = all(subpaths.values())
    vol = V1Volume(
        name="models",
        persistent_volume_claim=V1PersistentVolumeClaimVolumeSource(
            claim_name=profile.storage.models_pvc, read_only=all_ro
        ),
    )
    mounts = [
        V1VolumeMount(name="models", mount_path=f"{VOLUME_ROOT}/{sub}", sub_path=sub, read_only=ro)
        for sub, ro in subpaths.items()
    ]
    return vol, mounts


def _env(values: dict[str, str]) -> list[Any]:
    from kubernetes.client import V1EnvVar

    return [V1EnvVar(name=k, value=v) for k, v in values.items()]


# --------------------------------------------------------------------------- storage


def _pvc(
    profile: ClusterProfile,
    name: str,
    labels: dict[str, str],
    access_mode: str,
    storage_class: str | None,
    size: str,
) -> V1PersistentVolumeClaim:
    from kubernetes.client import (
        V1ObjectMeta,
        V1PersistentVolumeClaim,
        V1PersistentVolumeClaimSpec,
        V1VolumeResourceRequirements,
    )

    return V1PersistentVolumeClaim(
        api_version="v1",
        kind="PersistentVolumeClaim",
        metadata=V1ObjectMeta(name=name, namespace=profile.namespace, labels=labels),
        spec=V1PersistentVolumeClaimSpec(
            access_modes=[access_mode],
            storage_class_name=storage_class,
            resources=V1VolumeResourceRequirements(requests={"storage": size}),
        ),
    )


def dataset_pvc(
    profile: ClusterProfile,
    dataset: str,
    size: str | None = None,
    storage_class: str | None = None,
    access_mode: str | None = None,
) -> V1PersistentVolumeClaim:
    """The PVC of one dataset volume (``trainyard-data-<dataset>``).

    Args:
        profile: Cluster profile (namespace and storage defaults).
        dataset: Dataset name.
        size: Requested size (pipeline ``staging.pvc_size``); default from the profile.
        storage_class: StorageClass; default from the profile.
        access_mode: ``ReadWriteMany`` lets step pods and all training workers mount it.

    Returns:
        The claim.
    """
    st = profile.storage
    return _pvc(
        profile,
        dataset_pvc_name(dataset),
        _labels("dataset-volume", **{DATASET_LABEL: k8s_name(dataset)}),
        access_mode or st.dataset_access_mode,
        storage_class or st.storage_class,
        size or st.dataset_size,
    )


def models_pvc(profile: ClusterProfile) -> V1PersistentVolumeClaim:
    """The shared models PVC (registry, serving base paths, training checkpoints).

    Args:
        profile: Cluster profile.

    Returns:
        The claim named ``profile.storage.models_pvc``.
    """
    st = profile.storage
    return _pvc(
        profile,
        st.models_pvc,
        _labels("models-volume"),
        st.models_access_mode,
        st.storage_class,
        st.models_size,
    )


def volume_snapshot_name(dataset: str, snapshot_id: str) -> str:
    """The VolumeSnapshot taken of a dataset's PVC once a snapshot was published.

    Args:
        dataset: Dataset name.
        snapshot_id: The published snapshot's id.

    Returns:
        ``trainyard-data-<dataset>-<snapshot id>``, a DNS-1123 label. When that is longer
        than 63 characters or not a label as written: its head, cut to fit, then
        ``-<hash8>`` of dataset and id, so distinct pairs keep distinct names.
    """
    return _fitted_label(f"{dataset_pvc_name(dataset)}-{snapshot_id}", f"{dataset}/{snapshot_id}")


def volume_snapshot(
    profile: ClusterProfile,
    dataset: str,
    snapshot_id: str,
    snapshot_class: str | None = None,
) -> dict[str, Any]:
    """A CSI ``VolumeSnapshot`` of a dataset's PVC, taken after a snapshot was published.

    Args:
        profile: Cluster profile (namespace; ``storage.volume_snapshot_class`` default).
        dataset: Dataset whose PVC (``trainyard-data-<dataset>``) is snapshotted.
        snapshot_id: The published snapshot the VolumeSnapshot is named and labelled after.
        snapshot_class: VolumeSnapshotClass (pipeline ``staging.volume_snapshot_class``);
            default from the profile.

    Returns:
        The object as a dict (a CRD: there is no typed model), named by
        :func:`volume_snapshot_name` and labelled with dataset and snapshot id.

    Raises:
        ConfigError: If neither the pipeline nor the profile names a snapshot class.
    """
    cls = snapshot_class or profile.storage.volume_snapshot_class
    if not cls:
        raise ConfigError(
            "no VolumeSnapshotClass: set the pipeline's staging.volume_snapshot_class "
            "or the cluster profile's storage.volume_snapshot_class"
        )
    labels = _labels(
        "dataset-snapshot",
        **{DATASET_LABEL: k8s_name(dataset), SNAPSHOT_LABEL: _label_value(snapshot_id)},
    )
    return {
        "apiVersion": f"{VOLUME_SNAPSHOT_GROUP}/{VOLUME_SNAPSHOT_VERSION}",
        "kind": "VolumeSnapshot",
        "metadata": {
            "name": volume_snapshot_name(dataset, snapshot_id),
            "namespace": profile.namespace,
            "labels": labels,
        },
        "spec": {
            "volumeSnapshotClassName": cls,
            "source": {"persistentVolumeClaimName": dataset_pvc_name(dataset)},
        },
    }


# --------------------------------------------------------------------------- step pods


def step_pod(
    profile: ClusterProfile,
    step: str,
    args: list[str],
    dataset: str,
    *,
    pipeline: str,
    run_id: str | None = None,
    writes_dataset: bool,
    env: dict[str, str] | None = None,
) -> V1Pod:
    """The pod of one pipeline step: ``python -m trainyard <step> <args>``.

    Give it to ``KubernetesPodOperator(full_pod_spec=...)``; the operator appends a random
    suffix to the name (:data:`STEP_POD_NAME_MAX`) and adds its own labels. If the operator
    pushes XCom, also pass
    ``xcom_sidecar_container_security_context=xcom_sidecar_security_context()``. The local
    runner runs the same container as a process (:mod:`trainyard.k8s.local`).

    Args:
        profile: Cluster profile (image, pool, service account, security).
        step: Step name (an entry of ``trainyard.steps.STEPS``).
        args: Arguments after the step name (``Step.argv`` of the step table).
        dataset: Dataset whose PVC is mounted at ``/volumes/<dataset>``.
        pipeline: The pipeline (names the pod, :func:`step_pod_name`; its
            ``trainyard.io/pipeline`` label).
        run_id: The Airflow run: its ``trainyard.io/run`` label (:func:`run_name`).
        writes_dataset: Mount the dataset read-write (else read-only).
        env: Extra environment variables.

    Returns:
        The pod, restricted (read-only root filesystem, ``/tmp`` an emptyDir), on the CPU
        pool, ``restartPolicy: Never``; its result goes to :data:`XCOM_PATH`.
    """
    from kubernetes.client import V1Container, V1ObjectMeta, V1Pod, V1PodSpec

    place = cpu_placement(profile)
    labels = _pipeline_labels(pipeline)
    if run_id is not None:
        labels[RUN_LABEL] = run_name(pipeline, run_id)
    data_vol, data_mount = _data_volume(dataset, not writes_dataset)
    models_vol, models_mounts = _models_volume(profile, dict.fromkeys(MODELS_SUBPATHS, False))
    tmp_vol, tmp_mount = _tmp_volume()
    container = V1Container(
        name=BASE_CONTAINER,
        image=profile.images.steps,
        image_pull_policy=profile.images.pull_policy,
        command=[*STEP_PROGRAM, step],
        args=list(args),
        env=_env(
            {
                "TRAINYARD_VOLUME_ROOT": VOLUME_ROOT,
                # inside the pod the step does its own work; it never renders more pods
                "TRAINYARD_RUNNER": "local",
                "TRAINYARD_XCOM_PATH": XCOM_PATH,
                "TRAINYARD_TERMINATION_LOG": TERMINATION_LOG,
                "PYTHONUNBUFFERED": "1",
                "HOME": "/tmp",
                **(env or {}),
            }
        ),
        resources=_resources(profile.resources.steps),
        security_context=restricted_security_context(read_only_root=True),
        volume_mounts=[data_mount, *models_mounts, tmp_mount],
    )
    return V1Pod(
        api_version="v1",
        kind="Pod",
        metadata=V1ObjectMeta(
            name=step_pod_name(step, pipeline),
            namespace=profile.namespace,
            labels=_labels("step", **{"trainyard.io/step": step}, **labels),
        ),
        spec=V1PodSpec(
            restart_policy="Never",
            service_account_name=profile.service_account,
            automount_service_account_token=False,
            enable_service_links=False,
            security_context=restricted_pod_security_context(profile),
            containers=[container],
            volumes=[data_vol, models_vol, tmp_vol],
            **place.pod_fields(),
        ),
    )


# --------------------------------------------------------------------------- training


def training_prefix(pipeline: str, max_len: int = 36) -> str:
    """What every run's training names of a pipeline start with: ``ty-<pipeline>-<hash6>``.

    The pipeline name is cut to fit, so the hash of the whole name tells apart two
    pipelines that share a head; ``pipelines check`` refuses two pipelines whose prefixes
    are still the same (:func:`pipeline_object_names`).

    Args:
        pipeline: Pipeline name.
        max_len: Length of the :func:`run_name` it begins.
    """
    digest = _digest(pipeline, 3)
    head = k8s_name(f"ty-{pipeline}", max_len - len(digest) - len("--") - 8)
    return f"{head}-{digest}"


def run_name(pipeline: str, run_id: str, max_len: int = 36) -> str:
    """A pipeline's run as a DNS label: ``ty-<pipeline>-<hash6 of it>-<hash8 of the run id>``.

    The ``trainyard.io/run`` label of the run's step pods, and the head of its training
    attempts' names (:func:`training_base_name`). The run id's hash is the one of its
    folders on the volumes (:func:`trainyard.layout.run_key`).

    Args:
        pipeline: Pipeline name.
        run_id: Airflow run id (any characters).
        max_len: Longest name wanted.

    Returns:
        At most ``max_len`` characters; distinct pipelines or run ids give distinct names.
    """
    return f"{training_prefix(pipeline, max_len)}-{_digest(run_id)}"


def training_base_name(pipeline: str, run_id: str, attempt: int = 1) -> str:
    """Stable, DNS-safe base name of one training attempt (service = pod subdomain).

    A retry is a new attempt and so a new Job, Service and set of pods. It is the
    attempt's ``trainyard.io/run`` label, the Service's selector and what teardown deletes
    by, so it differs for every pipeline, run id and attempt.

    Args:
        pipeline: Pipeline name.
        run_id: Airflow run id (any characters).
        attempt: 1-based attempt number.

    Returns:
        ``<run_name>-a<attempt>`` (:func:`run_name`, the same for attempts 1 to 99), at
        most 40 characters, so ``job-<base>-worker-<index>`` stays a valid hostname.
    """
    suffix = f"-a{attempt}"
    return f"{run_name(pipeline, run_id, min(36, 40 - len(suffix)))}{suffix}"


def job_name(base: str, role: str) -> str:
    """The created Job name of a role (``job-<base>-<role>``); pods are ``<job>-<index>``."""
    return f"{JOB_NAME_PREFIX}{base}-{role}"


def tf_jobs_env(base: str, replicas: dict[str, int]) -> str:
    """``TRAINYARD_TF_JOBS``: JSON ``{"worker": {"job": ..., "replicas": n}, ...}``.

    Args:
        base: Attempt base name.
        replicas: Replicas per role; roles with 0 replicas are left out.

    Returns:
        Compact JSON with sorted keys.
    """
    jobs = {r: {"job": job_name(base, r), "replicas": n} for r, n in replicas.items() if n > 0}
    return json.dumps(jobs, sort_keys=True, separators=(",", ":"))


def training_service(name: str, namespace: str, pipeline: str | None = None) -> V1Service:
    """Headless Service giving every training pod a stable DNS name.

    ``publishNotReadyAddresses`` matters: training pods have no readiness probe and must
    resolve each other while still starting.

    Args:
        name: Attempt base name (the pods' ``subdomain``).
        namespace: Namespace.
        pipeline: The pipeline: its ``trainyard.io/pipeline`` label.

    Returns:
        ``clusterIP: None`` service selecting the attempt's pods on port 2222.
    """
    from kubernetes.client import V1ObjectMeta, V1Service, V1ServicePort, V1ServiceSpec

    return V1Service(
        api_version="v1",
        kind="Service",
        metadata=V1ObjectMeta(
            name=name,
            namespace=namespace,
            labels=_labels("training", **{RUN_LABEL: name}, **_pipeline_labels(pipeline)),
        ),
        spec=V1ServiceSpec(
            cluster_ip="None",
            publish_not_ready_addresses=True,
            selector={RUN_LABEL: name},
            ports=[V1ServicePort(name="tf-grpc", port=TF_PORT, target_port=TF_PORT)],
        ),
    )


def training_job(
    profile: ClusterProfile,
    name: str,
    role: Role,
    replicas: int,
    tier: str,
    args: list[str],
    gpus: int,
    dataset: str,
    *,
    tf_jobs: str,
    deadline_s: float | None = None,
    kueue: bool | None = None,
    pipeline: str | None = None,
) -> V1Job:
    """One role of a training attempt as an Indexed Job.

    Args:
        profile: Cluster profile.
        name: Attempt base name (= headless Service name = pod subdomain).
        role: ``worker``, ``chief`` (GPU; CPU pool with ``gpus`` 0) or ``ps`` (CPU,
            parameter server).
        replicas: Pods of this role (``completions = parallelism = replicas``).
        tier: Priority tier of the GPU roles.
        args: Arguments of ``python -m trainyard.training.worker``.
        gpus: ``nvidia.com/gpu`` per pod (ignored for ``ps``).
        dataset: Dataset PVC, mounted read-only.
        tf_jobs: ``TRAINYARD_TF_JOBS`` of the attempt (:func:`tf_jobs_env`).
        deadline_s: ``activeDeadlineSeconds`` (the attempt timeout).
        kueue: Kueue mode (labels, created suspended); default ``profile.kueue.enabled``.
        pipeline: The pipeline: its ``trainyard.io/pipeline`` label.

    Returns:
        The Job, ``backoffLimit: 0``: the launcher owns retries (a retry is a new Job).

    Raises:
        ConfigError: On an unknown role/tier or replicas < 1.
    """
    from kubernetes.client import (
        V1Container,
        V1ContainerPort,
        V1Job,
        V1JobSpec,
        V1ObjectMeta,
        V1PodSpec,
        V1PodTemplateSpec,
    )

    if role not in ("worker", "chief", "ps"):
        raise ConfigError(f"unknown training role {role!r} (worker, chief, ps)")
    if replicas < 1:
        raise ConfigError(f"training role {role!r}: replicas must be >= 1, got {replicas}")
    use_kueue = profile.kueue.enabled if kueue is None else kueue
    gpu_place = placement_for_tier(profile, tier, kueue=use_kueue)
    if role == "ps" and use_kueue:
        # the admitted ResourceFlavor injects its node labels; a CPU-pool selector of our
        # own would conflict with them
        place, res, gpus = gpu_place, profile.resources.ps, 0
    elif role == "ps" or gpus == 0:
        # no GPU: the CPU pool, without the GPU pools' affinity and tolerations (a pod
        # there would hold a GPU node it does not use)
        cpu = cpu_placement(profile)
        place = Placement(
            tier=tier,
            node_selector=cpu.node_selector,
            affinity=None,
            tolerations=cpu.tolerations,
            priority_class_name=gpu_place.priority_class_name,
            plan=cpu.plan,
        )
        res = profile.resources.ps if role == "ps" else profile.resources.trainer
        gpus = 0
    else:
        place, res = gpu_place, profile.resources.trainer
    jname = job_name(name, role)
    data_vol, data_mount = _data_volume(dataset, read_only=True)
    models_vol, models_mounts = _models_volume(profile, {"_checkpoints": False})
    tmp_vol, tmp_mount = _tmp_volume()
    pod_labels = _labels(
        "training", **{RUN_LABEL: name, ROLE_LABEL: role}, **_pipeline_labels(pipeline)
    )
    container = V1Container(
        name=BASE_CONTAINER,
        image=profile.images.trainer,
        image_pull_policy=profile.images.pull_policy,
        command=list(spec.WORKER_COMMAND),
        args=list(args),
        ports=[V1ContainerPort(name="tf-grpc", container_port=TF_PORT)],
        env=_env(
            {
                spec.ENV_TASK_TYPE: role,
                spec.ENV_JOBS: tf_jobs,
                spec.ENV_SERVICE: name,
                spec.ENV_PORT: str(TF_PORT),
                "TRAINYARD_VOLUME_ROOT": VOLUME_ROOT,
                "TF_USE_LEGACY_KERAS": "1",
                "PYTHONUNBUFFERED": "1",
                "HOME": "/tmp",
            }
        ),
        resources=_resources(res, gpus),
        security_context=restricted_security_context(read_only_root=True),
        volume_mounts=[data_mount, *models_mounts, tmp_mount],
    )
    return V1Job(
        api_version="batch/v1",
        kind="Job",
        metadata=V1ObjectMeta(
            name=jname,
            namespace=profile.namespace,
            labels={**pod_labels, **place.labels},
        ),
        spec=V1JobSpec(
            completion_mode="Indexed",
            completions=replicas,
            parallelism=replicas,
            backoff_limit=0,
            active_deadline_seconds=int(deadline_s) if deadline_s else None,
            ttl_seconds_after_finished=3600,
            suspend=True if use_kueue else None,
            template=V1PodTemplateSpec(
                metadata=V1ObjectMeta(labels=pod_labels),
                spec=V1PodSpec(
                    restart_policy="Never",
                    subdomain=name,
                    service_account_name=profile.service_account,
                    automount_service_account_token=False,
                    enable_service_links=False,
                    security_context=restricted_pod_security_context(profile),
                    containers=[container],
                    volumes=[data_vol, models_vol, tmp_vol],
                    **place.pod_fields(),
                ),
            ),
        ),
    )


@dataclass(frozen=True)
class TrainingObjects:
    """Everything one training attempt creates, in creation order.

    Attributes:
        name: Attempt base name (Service name, pod subdomain).
        service: The headless Service (create first).
        jobs: One Indexed Job per role (ps first, then chief, then worker).
        placement: GPU placement of the tier.
        plan: Lines for the task log: roles, pools, priorities, addresses.
        teardown: What to delete afterwards, as ``kubectl`` commands.
    """

    name: str
    service: V1Service
    jobs: list[V1Job]
    placement: Placement
    plan: list[str] = field(default_factory=list)
    teardown: list[str] = field(default_factory=list)


def training_objects(
    profile: ClusterProfile,
    pipeline: str,
    run_id: str,
    *,
    strategy: str,
    workers: int,
    parameter_servers: int,
    tier: str,
    gpus_per_worker: int,
    args: list[str],
    dataset: str,
    attempt: int = 1,
    deadline_s: float | None = None,
    kueue: bool | None = None,
) -> TrainingObjects:
    """Service + Jobs of one training attempt for a strategy.

    ``multi_worker_mirrored``: one ``worker`` Job of ``workers`` GPU pods (worker 0 acts as
    chief). ``parameter_server``: a CPU ``ps`` Job, a 1-pod GPU ``chief`` Job and a GPU
    ``worker`` Job.

    Args:
        profile: Cluster profile.
        pipeline: Pipeline name.
        run_id: Airflow run id.
        strategy: ``multi_worker_mirrored`` or ``parameter_server``.
        workers: Worker replicas.
        parameter_servers: Parameter servers (``parameter_server`` only, >= 1).
        tier: Priority tier.
        gpus_per_worker: GPUs per chief/worker pod.
        args: Trainer arguments (same for every role; the role comes from the env).
        dataset: Dataset PVC.
        attempt: 1-based attempt number (a retry is a new attempt).
        deadline_s: Attempt timeout (``activeDeadlineSeconds``).
        kueue: Kueue mode; default ``profile.kueue.enabled``.

    Returns:
        The objects, plan and teardown.

    Raises:
        ConfigError: On an unknown strategy or an impossible replica count.
    """
    if strategy == "multi_worker_mirrored":
        replicas = {"worker": workers}
    elif strategy == "parameter_server":
        if parameter_servers < 1:
            raise ConfigError("parameter_server strategy needs parameter_servers >= 1")
        replicas = {"ps": parameter_servers, "chief": 1, "worker": workers}
    else:
        raise ConfigError(f"unknown training strategy {strategy!r}")
    base = training_base_name(pipeline, run_id, attempt)
    tf_jobs = tf_jobs_env(base, replicas)
    jobs = [
        training_job(
            profile,
            base,
            role,  # type: ignore[arg-type]
            n,
            tier,
            args,
            0 if role == "ps" else gpus_per_worker,
            dataset,
            tf_jobs=tf_jobs,
            deadline_s=deadline_s,
            kueue=kueue,
            pipeline=pipeline,
        )
        for role, n in replicas.items()
    ]
    place = placement_for_tier(profile, tier, kueue=kueue)
    plan = [f"training attempt {base}: strategy {strategy}"]
    for role, n in replicas.items():
        gpu = role != "ps" and gpus_per_worker > 0
        where = f"{gpus_per_worker} GPU(s) each, tier {tier!r}" if gpu else "CPU pool"
        addrs = ", ".join(f"{job_name(base, role)}-{i}.{base}:{TF_PORT}" for i in range(min(n, 3)))
        more = ", ..." if n > 3 else ""
        plan.append(f"  {role}: {n} pod(s), {where}; {addrs}{more}")
    plan += place.plan
    ns = profile.namespace
    teardown = [
        *(
            f"kubectl -n {ns} delete job {j.metadata.name} --cascade=foreground --ignore-not-found"
            for j in jobs
        ),
        f"kubectl -n {ns} delete service {base} --ignore-not-found",
        f"kubectl -n {ns} delete pods -l {RUN_LABEL}={base} --ignore-not-found",
    ]
    service = training_service(base, ns, pipeline)
    return TrainingObjects(base, service, jobs, place, plan, teardown)


def job_operator_kwargs(
    job: V1Job,
    *,
    deferrable: bool = False,
    poll_interval: float = 10,
    kueue_queue: str | None = None,
) -> dict[str, Any]:
    """Keyword arguments for ``KubernetesJobOperator`` (or ``KubernetesStartKueueJobOperator``).

    The operator rebuilds the Job from its own parameters and merges ``full_job_spec``
    under them, and prefixes the name with ``job-``; these kwargs make the created Job
    equal ours: same name (so pod DNS names match ``TRAINYARD_TF_JOBS``), Indexed,
    ``completions = parallelism``, no retries inside the Job.

    Caveats of provider 10.25: it lists the Job's pods right after creating it, up to
    ``discover_pods_retry_number`` times with no wait between tries (apache/airflow#70585),
    so pods that are slow to appear (or a Job Kueue still holds suspended) fail the task;
    and it fetches logs only after the Job ended. The trainyard launcher therefore treats
    a failed task as a failed attempt.

    Args:
        job: A Job from :func:`training_job`.
        deferrable: Defer to the triggerer while waiting.
        poll_interval: Seconds between Job status polls.
        kueue_queue: For ``KubernetesStartKueueJobOperator``: its ``queue_name``.

    Returns:
        The kwargs (add ``task_id`` and connection settings).
    """
    name = job.metadata.name
    if not name.startswith(JOB_NAME_PREFIX):
        raise ConfigError(f"Job name {name!r} must start with {JOB_NAME_PREFIX!r}")
    spec = job.spec
    kwargs: dict[str, Any] = {
        "name": name[len(JOB_NAME_PREFIX) :],
        "namespace": job.metadata.namespace,
        "full_job_spec": job,
        "completion_mode": spec.completion_mode,
        "completions": spec.completions,
        "parallelism": spec.parallelism,
        "backoff_limit": spec.backoff_limit,
        "random_name_suffix": False,
        "wait_until_job_complete": True,
        "deferrable": deferrable,
        "job_poll_interval": poll_interval,
        "get_logs": True,
        "do_xcom_push": False,
        "base_container_name": BASE_CONTAINER,
        "on_finish_action": "delete_pod",
        "reattach_on_restart": False,
        "discover_pods_retry_number": 10,
    }
    if spec.active_deadline_seconds:
        kwargs["active_deadline_seconds"] = spec.active_deadline_seconds
    if spec.ttl_seconds_after_finished is not None:
        kwargs["ttl_seconds_after_finished"] = spec.ttl_seconds_after_finished
    if kueue_queue:
        kwargs["queue_name"] = kueue_queue
        kwargs["suspend"] = True
    return kwargs


# --------------------------------------------------------------------------- serving


def model_key(model_name: str) -> str:
    """A served model as a DNS label: its ``trainyard.io/model`` label, in its objects' names.

    A model name that is already a DNS-1123 label (and short enough for
    ``serving-<name>``) is kept as is, so those names never change; any other (capitals,
    ``.``, ``_``, too long) is lowercased, its other characters replaced by ``-``, cut to
    fit and given ``-<hash8>`` of the exact name: ``fraud.model`` and ``fraud_model``, or two
    long names with the same head, stay apart.
    """
    fitted = _fitted_label(f"{SERVING_PREFIX}{model_name}", model_name)
    return fitted[len(SERVING_PREFIX) :]


def serving_name(model_name: str) -> str:
    """Deployment / Service name of a served model: ``serving-<model key>`` (:func:`model_key`)."""
    return f"{SERVING_PREFIX}{model_key(model_name)}"


def scorer_name(pipeline: str) -> str:
    """Deployment name of a pipeline's scorer: ``scorer-<pipeline>``, ``_`` → ``-``.

    One too long is cut and ends in ``-<hash8>`` of the pipeline name.
    """
    return _fitted_label(f"scorer-{pipeline.replace('_', '-')}", pipeline)


def pipeline_object_names(pipeline: PipelineConfig) -> list[tuple[tuple[str, ...], str, str]]:
    """The Kubernetes names a pipeline's objects take that no other pipeline's may.

    Returns:
        ``(config field, what it names, the name)``: the serving Deployment and Service and
        their ``trainyard.io/model`` selector, the scorer Deployment (a pipeline that
        scores a stream), and what every training Service, Job and ``trainyard.io/run``
        label of the pipeline starts with (:func:`training_prefix`; the rest is the run
        id's hash, so distinct prefixes keep every run's names apart).
    """
    model = pipeline.serving.model_name
    out = [
        (("serving", "model_name"), "serving Deployment and Service", serving_name(model)),
        (("serving", "model_name"), f"serving selector {MODEL_LABEL}", model_key(model)),
        (("name",), "training objects' name prefix", training_prefix(pipeline.name)),
    ]
    if pipeline.scoring.stream is not None:
        out.append((("name",), "scorer Deployment", scorer_name(pipeline.name)))
    return out


def serving_deployment(
    profile: ClusterProfile,
    model_name: str,
    version: int,
    replicas: int,
    *,
    progress_deadline_s: int = 300,
) -> V1Deployment:
    """TF Serving (CPU) Deployment serving one model from the models PVC.

    The serving root (PVC sub-path ``_serving``) is mounted read-only at
    ``/volumes/_serving``, where the deploy step's pod sees it too, and TF Serving reads the
    model's config file ``/volumes/_serving/<model>/model.config`` (written by the deploy
    step and by ``models promote/rollback``; re-read every 5 s): the versions to serve and
    their ``stable``/``canary`` labels. The container waits for that file before starting
    the server, so the Deployment can exist before the first deploy.

    Args:
        profile: Cluster profile (serving image, CPU pool, security).
        model_name: Model name (URL path ``/v1/models/<name>``).
        version: Version being deployed.
        replicas: Pod replicas.
        progress_deadline_s: ``progressDeadlineSeconds`` of the rollout.

    Returns:
        A RollingUpdate Deployment with ``maxUnavailable: 0``, readiness on
        ``GET /v1/models/<name>``, a preStop sleep and a restricted security context.
    """
    from kubernetes.client import (
        V1Container,
        V1ContainerPort,
        V1Deployment,
        V1DeploymentSpec,
        V1DeploymentStrategy,
        V1ExecAction,
        V1HTTPGetAction,
        V1LabelSelector,
        V1Lifecycle,
        V1LifecycleHandler,
        V1ObjectMeta,
        V1PersistentVolumeClaimVolumeSource,
        V1PodSpec,
        V1PodTemplateSpec,
        V1Probe,
        V1RollingUpdateDeployment,
        V1TCPSocketAction,
        V1Volume,
        V1VolumeMount,
    )

    if replicas < 1:
        raise ConfigError(f"serving replicas must be >= 1, got {replicas}")
    name = serving_name(model_name)
    selector = {
        APP_LABEL: "trainyard",
        COMPONENT_LABEL: "serving",
        MODEL_LABEL: model_key(model_name),
    }
    place = cpu_placement(profile)
    tmp_vol, tmp_mount = _tmp_volume()
    config_file = f"{VOLUME_ROOT}/_serving/{model_name}/model.config"
    container = V1Container(
        name="serving",
        image=profile.images.serving,
        image_pull_policy=profile.images.pull_policy,
        command=[
            "sh",
            "-c",
            'until [ -s "$0" ]; do sleep 2; done; exec tensorflow_model_server "$@"',
            config_file,
        ],
        args=[
            f"--port={SERVING_GRPC_PORT}",
            f"--rest_api_port={SERVING_REST_PORT}",
            f"--model_config_file={config_file}",
            "--model_config_file_poll_wait_seconds=5",
            "--file_system_poll_wait_seconds=5",
            "--allow_version_labels_for_unavailable_models=true",
        ],
        ports=[
            V1ContainerPort(name="http", container_port=SERVING_REST_PORT),
            V1ContainerPort(name="grpc", container_port=SERVING_GRPC_PORT),
        ],
        readiness_probe=V1Probe(
            http_get=V1HTTPGetAction(path=f"/v1/models/{model_name}", port=SERVING_REST_PORT),
            period_seconds=5,
            failure_threshold=3,
        ),
        liveness_probe=V1Probe(
            tcp_socket=V1TCPSocketAction(port=SERVING_REST_PORT),
            initial_delay_seconds=15,
            period_seconds=10,
            failure_threshold=6,
        ),
        lifecycle=V1Lifecycle(
            pre_stop=V1LifecycleHandler(_exec=V1ExecAction(command=["sleep", "10"]))
        ),
        resources=_resources(profile.resources.serving),
        security_context=restricted_security_context(read_only_root=True),
        volume_mounts=[
            V1VolumeMount(
                name="models",
                mount_path=f"{VOLUME_ROOT}/_serving",
                sub_path="_serving",
                read_only=True,
            ),
            tmp_mount,
        ],
    )
    return V1Deployment(
        api_version="apps/v1",
        kind="Deployment",
        metadata=V1ObjectMeta(
            name=name,
            namespace=profile.namespace,
            labels=selector,
            annotations={VERSION_ANNOTATION: str(version)},
        ),
        spec=V1DeploymentSpec(
            replicas=replicas,
            selector=V1LabelSelector(match_labels=selector),
            strategy=V1DeploymentStrategy(
                type="RollingUpdate",
                rolling_update=V1RollingUpdateDeployment(max_unavailable=0, max_surge=1),
            ),
            min_ready_seconds=5,
            progress_deadline_seconds=progress_deadline_s,
            revision_history_limit=5,
            template=V1PodTemplateSpec(
                metadata=V1ObjectMeta(
                    labels=selector, annotations={VERSION_ANNOTATION: str(version)}
                ),
                spec=V1PodSpec(
                    service_account_name=profile.service_account,
                    automount_service_account_token=False,
                    enable_service_links=False,
                    termination_grace_period_seconds=30,
                    security_context=restricted_pod_security_context(profile),
                    containers=[container],
                    volumes=[
                        V1Volume(
                            name="models",
                            persistent_volume_claim=V1PersistentVolumeClaimVolumeSource(
                                claim_name=profile.storage.models_pvc, read_only=True
                            ),
                        ),
                        tmp_vol,
                    ],
                    **place.pod_fields(),
                ),
            ),
        ),
    )


def serving_service(profile: ClusterProfile, model_name: str) -> V1Service:
    """ClusterIP Service in front of the serving Deployment (REST 8501, gRPC 8500).

    Args:
        profile: Cluster profile.
        model_name: Model name.

    Returns:
        The Service named like the Deployment.
    """
    from kubernetes.client import V1ObjectMeta, V1Service, V1ServicePort, V1ServiceSpec

    selector = {
        APP_LABEL: "trainyard",
        COMPONENT_LABEL: "serving",
        MODEL_LABEL: model_key(model_name),
    }
    return V1Service(
        api_version="v1",
        kind="Service",
        metadata=V1ObjectMeta(
            name=serving_name(model_name), namespace=profile.namespace, labels=selector
        ),
        spec=V1ServiceSpec(
            type="ClusterIP",
            selector=selector,
            ports=[
                V1ServicePort(name="http", port=SERVING_REST_PORT, target_port="http"),
                V1ServicePort(name="grpc", port=SERVING_GRPC_PORT, target_port="grpc"),
            ],
        ),
    )
