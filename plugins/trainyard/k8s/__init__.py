"""Kubernetes: cluster profile, typed ``kubernetes.client`` builders, offline validation.

Cheap to import (the Airflow DAG file imports it at parse time through the adapter):
``kubernetes.client`` is imported inside the builders, and the profile YAML is read only by
:func:`load_cluster_profile`.

Profile (``deploy/cluster_profile.yaml``):
    * ``load_cluster_profile(path=None) -> ClusterProfile``: frozen pydantic model with
      ``namespace``, ``service_account``, ``images`` (trainer, serving, steps),
      ``gpu_pools`` (newest first), ``tiers`` (pools in order of preference + PriorityClass
      + Kueue queue), ``cpu_pool``, ``resources``, ``storage``, ``security``, ``kueue``.

Placement:
    * ``placement_for_tier(profile, tier, kueue=None) -> Placement``: required node
      affinity over the tier's pools, preferred affinity weighted 100, 50, 25, …,
      tolerations, priorityClassName, and ``plan`` lines for the task log; in Kueue mode
      ``labels`` (``kueue.x-k8s.io/queue-name``, ``kueue.x-k8s.io/priority-class``) and
      ``kueue_queue`` instead of affinity.
    * ``cpu_placement(profile) -> Placement``.

Security:
    * ``restricted_pod_security_context(profile)``, ``restricted_security_context()``,
      ``xcom_sidecar_security_context()`` (pass to KubernetesPodOperator's
      ``xcom_sidecar_container_security_context``: the XCom sidecar must be restricted too).

Storage:
    * ``dataset_pvc(profile, dataset, size, storage_class, access_mode)``
      (``trainyard-data-<dataset>``), ``models_pvc(profile)``.
    * ``volume_snapshot(profile, dataset, snapshot_id, snapshot_class=None) -> dict``: a
      CSI VolumeSnapshot of the dataset PVC (class from the pipeline, else the profile),
      named ``volume_snapshot_name(dataset, snapshot_id)``.

Steps:
    * ``step_pod(profile, step, args, dataset, *, pipeline, run_id=None, writes_dataset,
      env=None) -> V1Pod`` (``step_pod_name``, labelled with the pipeline and ``run_name``):
      ``python -m trainyard <step> <args>`` from the steps image on the CPU pool, dataset
      PVC at ``/volumes/<dataset>``, models PVC sub-paths at ``/volumes/_models``,
      ``/volumes/_serving``, ``/volumes/_checkpoints``; for ``KubernetesPodOperator(
      full_pod_spec=...)``.

Training (Indexed Jobs behind a headless Service; env contract in ``training/worker/tf_config.py``):
    * ``training_objects(profile, pipeline, run_id, strategy=..., workers=...,
      parameter_servers=..., tier=..., gpus_per_worker=..., args=..., dataset=...,
      attempt=1, deadline_s=None) -> TrainingObjects`` (service, jobs, placement, plan,
      teardown).
    * ``training_service(name, namespace)``, ``training_job(profile, name, role, replicas,
      tier, args, gpus, dataset, tf_jobs=...)``, ``training_base_name`` (``run_name`` +
      attempt; ``training_prefix``), ``job_name``,
      ``tf_jobs_env``.
    * ``job_operator_kwargs(job, deferrable=False, kueue_queue=None) -> dict`` for
      ``KubernetesJobOperator`` / ``KubernetesStartKueueJobOperator``.

Serving:
    * ``serving_deployment(profile, model_name, version, replicas) -> V1Deployment``,
      ``serving_service(profile, model_name) -> V1Service``, named ``serving_name``
      (``serving-`` + ``model_key``).
    * ``pipeline_object_names(cfg)``: the names no two pipelines may share.

Checks and rendering:
    * ``validate_object(obj) -> list[str]`` (Kubernetes 1.33 schema + Pod Security
      restricted; VolumeSnapshot against ``VOLUME_SNAPSHOT_SCHEMA``),
      ``schema_errors(data, schema)``, ``pss_violations(pod_spec)``,
      ``render_yaml(objs) -> str``, ``to_dict(obj)``.
    * ``cli_main(argv)``: ``python -m trainyard render <pipeline> [--step ...]``.
"""

from __future__ import annotations

from trainyard.k8s.checks import (
    K8S_VERSION,
    VOLUME_SNAPSHOT_SCHEMA,
    load_manifests,
    pss_violations,
    render_yaml,
    schema_errors,
    to_dict,
    validate_object,
)
from trainyard.k8s.objects import (
    BASE_CONTAINER,
    COMPONENT_LABEL,
    DATASET_LABEL,
    JOB_NAME_PREFIX,
    MODEL_LABEL,
    PIPELINE_LABEL,
    ROLE_LABEL,
    RUN_LABEL,
    SNAPSHOT_LABEL,
    STEP_POD_NAME_MAX,
    STEP_PROGRAM,
    TERMINATION_LOG,
    TF_PORT,
    VOLUME_ROOT,
    VOLUME_SNAPSHOT_GROUP,
    VOLUME_SNAPSHOT_PLURAL,
    VOLUME_SNAPSHOT_VERSION,
    XCOM_PATH,
    TrainingObjects,
    dataset_pvc,
    dataset_pvc_name,
    job_name,
    job_operator_kwargs,
    k8s_name,
    model_key,
    models_pvc,
    pipeline_label,
    pipeline_object_names,
    restricted_pod_security_context,
    restricted_security_context,
    run_name,
    scorer_name,
    serving_deployment,
    serving_name,
    serving_service,
    step_pod,
    step_pod_name,
    tf_jobs_env,
    training_base_name,
    training_job,
    training_objects,
    training_prefix,
    training_service,
    volume_snapshot,
    volume_snapshot_name,
    xcom_sidecar_security_context,
)
from trainyard.k8s.placement import (
    KUEUE_PRIORITY_LABEL,
    KUEUE_QUEUE_LABEL,
    Placement,
    cpu_placement,
    placement_for_tier,
    preference_weight,
)
from trainyard.k8s.profile import ClusterProfile, load_cluster_profile, parse_cluster_profile
from trainyard.k8s.render import run_training_objects

__all__ = [
    "BASE_CONTAINER",
    "COMPONENT_LABEL",
    "DATASET_LABEL",
    "JOB_NAME_PREFIX",
    "K8S_VERSION",
    "KUEUE_PRIORITY_LABEL",
    "KUEUE_QUEUE_LABEL",
    "MODEL_LABEL",
    "PIPELINE_LABEL",
    "ROLE_LABEL",
    "RUN_LABEL",
    "SNAPSHOT_LABEL",
    "STEP_POD_NAME_MAX",
    "STEP_PROGRAM",
    "TERMINATION_LOG",
    "TF_PORT",
    "VOLUME_ROOT",
    "VOLUME_SNAPSHOT_GROUP",
    "VOLUME_SNAPSHOT_PLURAL",
    "VOLUME_SNAPSHOT_SCHEMA",
    "VOLUME_SNAPSHOT_VERSION",
    "XCOM_PATH",
    "ClusterProfile",
    "Placement",
    "TrainingObjects",
    "cpu_placement",
    "dataset_pvc",
    "dataset_pvc_name",
    "job_name",
    "job_operator_kwargs",
    "k8s_name",
    "load_cluster_profile",
    "load_manifests",
    "model_key",
    "models_pvc",
    "parse_cluster_profile",
    "pipeline_label",
    "pipeline_object_names",
    "placement_for_tier",
    "preference_weight",
    "pss_violations",
    "render_yaml",
    "restricted_pod_security_context",
    "restricted_security_context",
    "run_name",
    "run_training_objects",
    "schema_errors",
    "scorer_name",
    "serving_deployment",
    "serving_name",
    "serving_service",
    "step_pod",
    "step_pod_name",
    "tf_jobs_env",
    "to_dict",
    "training_base_name",
    "training_job",
    "training_objects",
    "training_prefix",
    "training_service",
    "validate_object",
    "volume_snapshot",
    "volume_snapshot_name",
    "xcom_sidecar_security_context",
]
