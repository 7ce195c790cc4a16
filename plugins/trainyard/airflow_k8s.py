"""The kubernetes runner's tasks: each step as a pod, training as Indexed Jobs.

Part of the Airflow adapter (only :mod:`trainyard.airflow` imports it, and only when
``TRAINYARD_RUNNER=kubernetes``). Every object comes from the typed builders in
:mod:`trainyard.k8s`; this module only wires them into operators:

* ``stage``, ``validate``, ``register``, ``evaluate``, ``deploy``: KubernetesPodOperator
  running ``python -m trainyard <step> ...`` from the steps image; results return as XCom
  through ``/airflow/xcom/return.json`` (``TRAINYARD_XCOM_PATH``).
* ``ensure_volumes`` creates the dataset's PVC and the models PVC when missing.
* ``volume_snapshot`` (only when a VolumeSnapshotClass is configured: the pipeline's
  ``staging.volume_snapshot_class``, else the profile's ``storage.volume_snapshot_class``)
  takes a CSI VolumeSnapshot of the dataset's PVC once ``publish_snapshot`` announced a
  new snapshot, and waits until it is ready to use; it skips when the snapshot was reused.
* ``train``: a setup task creates the headless Service, one :class:`TrainingJobOperator`
  per role (``train_ps``, ``train_chief``, ``train_worker``) runs that role's Indexed Job,
  and a teardown task always deletes Jobs, Service and pods. Their names are fixed per
  pipeline, so a Service or Job a previous run left behind (its teardown did not run) is
  deleted and created again from this run's spec (:func:`trainyard.k8s.apply.recreate`).
* ``ensure_serving`` creates or rolls TF Serving's Deployment + Service (rolling back a
  stalled rollout); the ``deploy`` pod then publishes the version on the models volume and
  smoke-tests it through that Service.

The DAG's shape is fixed when it is parsed; the training objects are rendered when the run
executes, from the trigger form's params over the pipeline config
(:func:`trainyard.airflow.run_training_params`, as the local runner does). So the form's
epochs, workers, strategy and priority tier all apply on the cluster; roles the run's
strategy does not use (``ps`` and ``chief`` under ``multi_worker_mirrored``) skip.

Whether a run trains at all is decided as on the local runner
(:func:`trainyard.airflow.run_training_or_skip`: the pipeline's ``backfill_training``
policy, then the form's dry run, which logs the run's training and placement plan): the
setup task skips, creating nothing, and the role tasks, ``register``, ``evaluate``, the
gate, ``ensure_serving``, ``deploy`` and the teardown skip with it.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.providers.cncf.kubernetes.operators.job import KubernetesJobOperator
from airflow.sdk import task
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from trainyard import k8s
from trainyard.airflow import run_training_or_skip, run_training_params
from trainyard.errors import ConfigError
from trainyard.k8s.render import pipeline_training_objects, trainer_args

if TYPE_CHECKING:
    from airflow.sdk import Context
    from kubernetes.client import CoreV1Api, CustomObjectsApi, V1Job, V1Service

    from trainyard.config import PipelineConfig, TrainingConfig
    from trainyard.settings import Settings

log = logging.getLogger("trainyard.airflow")

XCOM_PATH = "/airflow/xcom/return.json"
ATTEMPT_RUN_ID = "airflow"  # one training per pipeline at a time (max_active_runs=1)
TRAINING_ROLES = ("ps", "chief", "worker")
"""Every role a training run may start, in creation order; the run's strategy picks some."""
JOB_FIELDS = (
    "name",
    "namespace",
    "full_job_spec",
    "completion_mode",
    "completions",
    "parallelism",
    "backoff_limit",
    "active_deadline_seconds",
    "ttl_seconds_after_finished",
)
"""The ``job_operator_kwargs`` that describe the Job itself (set again for every run)."""
VOLUME_SNAPSHOT_POLL_S = 10.0


def _xcom(task_id: str, key: str) -> str:
    return "{{ ti.xcom_pull(task_ids='" + task_id + "')['" + key + "'] }}"


def run_training_objects(
    profile: k8s.ClusterProfile,
    cfg: PipelineConfig,
    training: TrainingConfig,
    snapshot_id: str,
) -> k8s.TrainingObjects:
    """The Service and Jobs of one run, rendered with the run's training config.

    Args:
        profile: Cluster profile.
        cfg: The pipeline config.
        training: The run's effective training config (:func:`run_training_params`).
        snapshot_id: Snapshot the run trains on (trainer arguments).

    Returns:
        The attempt's objects; names are the same for every run of the pipeline.

    Raises:
        AirflowFailException: If the config cannot be rendered (e.g. ``parameter_server``
            with no parameter server): a config error, not worth a retry.
    """
    run_cfg = cfg.model_copy(update={"training": training})
    base = k8s.training_base_name(cfg.name, ATTEMPT_RUN_ID)
    try:
        return pipeline_training_objects(
            profile, run_cfg, ATTEMPT_RUN_ID, trainer_args(run_cfg, snapshot_id, base)
        )
    except ConfigError as e:
        raise AirflowFailException(f"ConfigError: {e}") from e


def replace_training_service(core: CoreV1Api, service: V1Service) -> bool:
    """Create a run's headless Service, replacing one of the same name left behind.

    Args:
        core: The core API client.
        service: The run's Service (:func:`run_training_objects`).

    Returns:
        True if a Service left behind by an earlier run was deleted first.
    """
    from trainyard.k8s.apply import recreate

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
        body: The VolumeSnapshot (:func:`trainyard.k8s.volume_snapshot`).
        timeout_s: How long it may take to become ready to use.
        poll_s: Seconds between reads while it does.

    Returns:
        ``name``, ``namespace``, ``pvc``, ``created`` (by this call), ``restore_size`` and
        ``content`` (the bound VolumeSnapshotContent), for the task's XCom.

    Raises:
        VolumeSnapshotError: If the VolumeSnapshot reports ``status.error``.
        TimeoutError: If it is not ready to use within ``timeout_s``.
    """
    from trainyard.k8s.apply import ensure_exists, wait_volume_snapshot

    group, version, plural = (
        k8s.VOLUME_SNAPSHOT_GROUP,
        k8s.VOLUME_SNAPSHOT_VERSION,
        k8s.VOLUME_SNAPSHOT_PLURAL,
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


class TrainingJobOperator(KubernetesJobOperator):
    """One role's Indexed Job of a training run, rendered when the task runs.

    The DAG holds one task per role in :data:`TRAINING_ROLES`, built from placeholder
    kwargs (:func:`trainyard.k8s.job_operator_kwargs`). :meth:`render_job` replaces the
    Job with this run's (the form's params over the pipeline config) before the provider
    builds and creates it; a role the run's strategy does not use skips.

    Args:
        role: ``ps``, ``chief`` or ``worker``.
        pipeline: The pipeline config.
        profile: Cluster profile.
        snapshot_id: Snapshot to train on (templated: an XCom of ``stage``).
        **kwargs: ``KubernetesJobOperator`` arguments.
    """

    template_fields: Sequence[str] = (*KubernetesJobOperator.template_fields, "snapshot_id")

    def __init__(
        self,
        *,
        role: str,
        pipeline: PipelineConfig,
        profile: k8s.ClusterProfile,
        snapshot_id: str,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if role not in TRAINING_ROLES:
            raise ConfigError(f"unknown training role {role!r} (known: {TRAINING_ROLES})")
        self.role = role
        self.pipeline = pipeline
        self.profile = profile
        self.snapshot_id = snapshot_id

    def render_job(self, params: Mapping[str, Any]) -> V1Job:
        """Render this role's Job for a run and make it the Job :meth:`execute` creates.

        Args:
            params: The run's params (``context["params"]``).

        Returns:
            The role's Job of this run (the operator's ``full_job_spec`` now).

        Raises:
            AirflowSkipException: If the run's strategy starts no Job of this role.
        """
        training = run_training_params(self.pipeline, params)
        objs = run_training_objects(self.profile, self.pipeline, training, self.snapshot_id)
        job = next((j for j in objs.jobs if j.metadata.labels[k8s.ROLE_LABEL] == self.role), None)
        if job is None:
            raise AirflowSkipException(f"strategy {training.strategy} runs no {self.role} Job")
        kwargs = k8s.job_operator_kwargs(job)
        for field in JOB_FIELDS:
            setattr(self, field, kwargs.get(field))
        self.arguments = list(job.spec.template.spec.containers[0].args or [])
        # Under the parameter-server strategy only the chief finishes; ps and workers
        # serve until the teardown deletes them.
        self.wait_until_job_complete = (
            training.strategy == "multi_worker_mirrored" or self.role == "chief"
        )
        return job

    def create_job(self, job_request_obj: V1Job) -> V1Job:
        """Create the role's Job, replacing one of the same name left behind.

        Job names are fixed (pod DNS names derive from them), so a Job an earlier run left
        would fail the create with 409: it is deleted with foreground propagation (its
        pods first), and this run's Job created once it is gone.

        Args:
            job_request_obj: The Job :meth:`build_job_request_obj` built.

        Returns:
            The Job as created.
        """
        from kubernetes.client import V1DeleteOptions

        from trainyard.k8s.apply import recreate

        create, batch = super().create_job, self.job_client
        name, ns = job_request_obj.metadata.name, job_request_obj.metadata.namespace
        foreground = V1DeleteOptions(propagation_policy="Foreground")
        job, replaced = recreate(
            lambda: create(job_request_obj),
            lambda: batch.delete_namespaced_job(name, ns, body=foreground),
            lambda: batch.read_namespaced_job(name, ns),
            what=f"Job {name}",
        )
        if replaced:
            self.log.warning("replaced Job %s left behind by an earlier run", name)
        return job

    def execute(self, context: Context) -> Any:
        """Render the run's Job for this role, then create (and maybe await) it."""
        self.render_job(context["params"])
        return super().execute(context)


def kubernetes_tasks(cfg: PipelineConfig, settings: Settings) -> None:
    """Add the pipeline's tasks for the kubernetes runner to the DAG being defined.

    Args:
        cfg: The pipeline config.
        settings: Locations (the cluster profile).
    """
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    from trainyard.airflow import gate, publish_snapshot_event, snapshot_asset

    profile = k8s.load_cluster_profile(settings.cluster_profile)
    name, t = cfg.name, cfg.training

    def step(step_name: str, args: list[str], **kwargs: Any) -> KubernetesPodOperator:
        pod = k8s.step_pod(profile, step_name, args, cfg.dataset)
        return KubernetesPodOperator(
            task_id=step_name,
            name=pod.metadata.name,
            namespace=profile.namespace,
            image=profile.images.steps,
            cmds=["python", "-m", "trainyard", step_name],
            arguments=args,
            env_vars=kwargs.pop("env_vars", {"TRAINYARD_XCOM_PATH": XCOM_PATH}),
            full_pod_spec=pod,
            do_xcom_push=True,
            xcom_sidecar_container_security_context=k8s.xcom_sidecar_security_context(),
            on_finish_action="delete_pod",
            get_logs=True,
            **kwargs,
        )

    interval = "{{ (data_interval_start or dag_run.run_after).strftime('%Y-%m-%d') }}"
    interval_end = "{{ (data_interval_end or dag_run.run_after).strftime('%Y-%m-%d') }}"
    stage_args = [
        "--pipeline", name,
        "--interval-start", interval,
        "--interval-end", interval_end,
        "--snapshot-id", "{{ params.snapshot_id or '' }}",
    ]  # fmt: skip
    stage = step("stage", stage_args, retries=2)

    @task(task_id="ensure_volumes", retries=2)
    def ensure_volumes() -> list[str]:
        """The dataset's PVC and the models PVC, created when missing."""
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        from trainyard.k8s.apply import ensure_exists

        core, ns, st = KubernetesHook().core_v1_client, profile.namespace, cfg.staging
        claims = [
            k8s.dataset_pvc(profile, cfg.dataset, st.pvc_size, st.storage_class, st.access_mode),
            k8s.models_pvc(profile),
        ]
        created = []
        for pvc in claims:
            name = pvc.metadata.name
            _, new = ensure_exists(
                lambda pvc=pvc: core.create_namespaced_persistent_volume_claim(ns, pvc),
                lambda name=name: core.read_namespaced_persistent_volume_claim(name, ns),
            )
            log.info("PVC %s: %s", name, "created" if new else "exists")
            created += [name] if new else []
        return created

    snapshot_class = cfg.staging.volume_snapshot_class or profile.storage.volume_snapshot_class
    snapshot_timeout_s = cfg.staging.volume_snapshot_timeout_s

    @task(
        task_id="volume_snapshot",
        retries=1,
        execution_timeout=dt.timedelta(seconds=snapshot_timeout_s + 300),
    )
    def volume_snapshot(staged: dict[str, Any]) -> dict[str, Any]:
        """A CSI VolumeSnapshot of the dataset's PVC, once a new snapshot was published."""
        if staged.get("reused"):
            raise AirflowSkipException(
                f"snapshot {staged['snapshot_id']} was reused: no volume snapshot"
            )
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
        from kubernetes.client import CustomObjectsApi

        body = k8s.volume_snapshot(profile, cfg.dataset, staged["snapshot_id"], snapshot_class)
        custom = CustomObjectsApi(KubernetesHook().api_client)
        return take_volume_snapshot(custom, body, snapshot_timeout_s)

    snapshot = _xcom("stage", "snapshot_id")
    validate = step("validate", ["--pipeline", name, "--snapshot", snapshot])

    base = k8s.training_base_name(name, ATTEMPT_RUN_ID)
    args = trainer_args(cfg, snapshot, base)
    output_dir = args[args.index("--output-dir") + 1]

    @task(task_id="create_training_service")
    def create_service(staged: dict[str, Any], **context: Any) -> dict[str, Any]:
        """This run's headless Service; returns the run's training config (for register).

        Skips, creating nothing, when the run does not train (backfill policy, dry run).
        """
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        def plan(training: TrainingConfig) -> list[str]:
            return run_training_objects(profile, cfg, training, staged["snapshot_id"]).plan

        training = run_training_or_skip(cfg, context, plan=plan)
        attempt = run_training_objects(profile, cfg, training, staged["snapshot_id"])
        log.info("placement plan:\n%s", "\n".join(attempt.plan))
        replace_training_service(KubernetesHook().core_v1_client, attempt.service)
        return training.model_dump()

    @task(task_id="delete_training_objects", trigger_rule="all_done")
    def delete_objects() -> None:
        """Every role's Job, the Service and the pods of the attempt, whichever exist."""
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
        from kubernetes.client import V1DeleteOptions

        from trainyard.k8s.apply import delete_if_exists

        hook, ns = KubernetesHook(), profile.namespace
        batch, core = hook.batch_v1_client, hook.core_v1_client
        foreground = V1DeleteOptions(propagation_policy="Foreground")
        deleted = []
        for role in TRAINING_ROLES:
            job = k8s.job_name(base, role)
            if delete_if_exists(
                lambda job=job: batch.delete_namespaced_job(job, ns, body=foreground)
            ):
                deleted.append(f"job {job}")
        if delete_if_exists(lambda: core.delete_namespaced_service(base, ns)):
            deleted.append(f"service {base}")
        core.delete_collection_namespaced_pod(ns, label_selector=f"{k8s.RUN_LABEL}={base}")
        log.info(
            "deleted %s and the pods labelled %s=%s",
            ", ".join(deleted) or "nothing",
            k8s.RUN_LABEL,
            base,
        )

    # Placeholder Jobs of every role (strategy parameter_server), for the operators'
    # fixed fields; each run renders its own Jobs in TrainingJobOperator.render_job.
    every_role = t.model_copy(
        update={"strategy": "parameter_server", "parameter_servers": max(1, t.parameter_servers)}
    )
    placeholders = run_training_objects(profile, cfg, every_role, snapshot).jobs
    jobs = [
        TrainingJobOperator(
            task_id=f"train_{job.metadata.labels[k8s.ROLE_LABEL]}",
            role=job.metadata.labels[k8s.ROLE_LABEL],
            pipeline=cfg,
            profile=profile,
            snapshot_id=snapshot,
            pool="trainyard_training",
            execution_timeout=dt.timedelta(seconds=t.attempt_timeout_s + 600),
            **k8s.job_operator_kwargs(job),
        )
        for job in placeholders
    ]

    register_args = [
        "--pipeline", name,
        "--snapshot", snapshot,
        "--run-id", "{{ run_id }}",
        "--output-dir", output_dir,
        "--overrides", "{{ ti.xcom_pull(task_ids='create_training_service') | tojson }}",
    ]  # fmt: skip
    # ps and chief skip under multi_worker_mirrored; the worker Job always runs.
    register = step("register", register_args, trigger_rule="none_failed_min_one_success")
    evaluate_args = [
        "--pipeline", name,
        "--version", _xcom("register", "version"),
        "--actor", "{{ dag_run.triggering_user_name or dag_run.run_type }}",
        "--force-promote", "{{ params.force_promote | string | lower }}",
        "--force-reason", "{{ params.force_reason or '' }}",
    ]  # fmt: skip
    evaluate = step("evaluate", evaluate_args)

    @task.short_circuit(task_id="gate", ignore_downstream_trigger_rules=False)
    def gate_task(decision: dict[str, Any]) -> bool:
        return gate(decision, cfg.gate.fail_run_on_reject)

    serving = cfg.serving
    deployment = k8s.serving_deployment(profile, serving.model_name, 0, serving.replicas)
    service = k8s.serving_service(profile, serving.model_name)

    @task(task_id="ensure_serving", retries=1)
    def ensure_serving() -> str:
        """TF Serving's Deployment + Service: created when missing, else rolled to this spec.

        TF Serving loads new version folders by itself, so a model deploy changes no pod;
        this task only (re)applies the serving spec, waits for the rollout within its
        progress deadline and, when it stalls, puts the previous spec back.
        """
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        from trainyard.k8s.apply import ensure_exists, wait_rollout

        hook, ns = KubernetesHook(), profile.namespace
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
        previous = None if created else current.spec.template
        if previous is not None:
            apps.patch_namespaced_deployment(
                dname, ns, {"spec": {"template": deployment.spec.template}}
            )
        deadline = (deployment.spec.progress_deadline_seconds or 600) + 60
        state = wait_rollout(
            lambda: apps.read_namespaced_deployment(dname, ns), deadline, log=log.info
        )
        if state != "complete":
            if previous is not None:
                apps.patch_namespaced_deployment(dname, ns, {"spec": {"template": previous}})
                log.warning("serving rollout %s: restored the previous spec", state)
            raise RuntimeError(f"serving Deployment {dname} rollout {state}")
        return f"{sname}.{ns}.svc"

    deploy = step(
        "deploy",
        ["--pipeline", name, "--version", _xcom("register", "version")],
        env_vars={
            "TRAINYARD_XCOM_PATH": XCOM_PATH,
            "TRAINYARD_SERVING_HOST": "{{ ti.xcom_pull(task_ids='ensure_serving') }}",
        },
    )

    volumes = ensure_volumes()
    training_service = create_service(stage.output)
    teardown = delete_objects()
    volumes >> stage >> validate >> training_service >> jobs >> register >> evaluate
    teardown.as_teardown(setups=training_service)
    jobs >> teardown
    gate_task(evaluate.output) >> ensure_serving() >> deploy
    announce = publish_snapshot_event(snapshot_asset(cfg, settings), cfg.dataset, name)
    published = announce(stage.output, validate.output)
    if snapshot_class:
        published >> volume_snapshot(stage.output)
