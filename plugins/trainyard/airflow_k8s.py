"""The kubernetes runner's tasks: each step as a pod, training as Indexed Jobs.

Part of the Airflow adapter (only :mod:`trainyard.airflow` imports it, and only when
``TRAINYARD_RUNNER=kubernetes``). Every object comes from the typed builders in
:mod:`trainyard.k8s`; this module only wires them into operators:

* ``stage``, ``validate``, ``register``, ``evaluate``, ``deploy``: KubernetesPodOperator
  running ``python -m trainyard <step> ...`` from the steps image; results return as XCom
  through ``/airflow/xcom/return.json`` (``TRAINYARD_XCOM_PATH``).
* ``ensure_volumes`` creates the dataset's PVC and the models PVC when missing.
* ``train``: a setup task creates the headless Service, one KubernetesJobOperator per role
  runs the Indexed Job(s) of workers, and a teardown task always deletes Jobs, Service and
  pods.
* ``ensure_serving`` creates or rolls TF Serving's Deployment + Service (rolling back a
  stalled rollout); the ``deploy`` pod then publishes the version on the models volume and
  smoke-tests it through that Service.

The training Jobs are rendered when the DAG is parsed, from the pipeline config: on the
cluster, the trigger form's epochs apply (they are container arguments) while the number
of workers, the strategy and the tier are those of the pipeline config.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from airflow.sdk import task

from trainyard.config import PipelineConfig
from trainyard.settings import Settings

log = logging.getLogger("trainyard.airflow")

XCOM_PATH = "/airflow/xcom/return.json"
ATTEMPT_RUN_ID = "airflow"  # one training per pipeline at a time (max_active_runs=1)


def _xcom(task_id: str, key: str) -> str:
    return "{{ ti.xcom_pull(task_ids='" + task_id + "')['" + key + "'] }}"


def kubernetes_tasks(cfg: PipelineConfig, settings: Settings) -> None:
    """Add the pipeline's tasks for the kubernetes runner to the DAG being defined.

    Args:
        cfg: The pipeline config.
        settings: Locations (the cluster profile).
    """
    from airflow.providers.cncf.kubernetes.operators.job import KubernetesJobOperator
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    from trainyard import k8s
    from trainyard.airflow import gate, publish_snapshot_event, snapshot_asset
    from trainyard.k8s.render import pipeline_training_objects, trainer_args

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

    validate = step("validate", ["--pipeline", name, "--snapshot", _xcom("stage", "snapshot_id")])

    # Trainer arguments travel as the operators' templated ``arguments``, not in the Jobs.
    attempt = pipeline_training_objects(profile, cfg, ATTEMPT_RUN_ID, args=[])
    args = trainer_args(cfg, _xcom("stage", "snapshot_id"), attempt.name)
    args[args.index("--epochs") + 1] = "{{ params.epochs }}"
    output_dir = args[args.index("--output-dir") + 1]

    @task(task_id="create_training_service")
    def create_service() -> None:
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        log.info("placement plan:\n%s", "\n".join(attempt.plan))
        api = KubernetesHook().core_v1_client
        api.create_namespaced_service(namespace=profile.namespace, body=attempt.service)

    @task(task_id="delete_training_objects", trigger_rule="all_done")
    def delete_objects() -> None:
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
        from kubernetes.client import V1DeleteOptions
        from kubernetes.client.exceptions import ApiException

        hook = KubernetesHook()
        ns = profile.namespace
        for job in attempt.jobs:
            try:
                hook.batch_v1_client.delete_namespaced_job(
                    job.metadata.name, ns, body=V1DeleteOptions(propagation_policy="Foreground")
                )
            except ApiException as e:
                if e.status != 404:
                    raise
        try:
            hook.core_v1_client.delete_namespaced_service(attempt.name, ns)
        except ApiException as e:
            if e.status != 404:
                raise
        hook.core_v1_client.delete_collection_namespaced_pod(
            ns, label_selector=f"{k8s.RUN_LABEL}={attempt.name}"
        )
        log.info("deleted training objects: %s", "; ".join(attempt.teardown))

    jobs = []
    for job in attempt.jobs:
        role = job.metadata.name.rsplit("-", 1)[-1]
        kwargs = k8s.job_operator_kwargs(job)
        # Under the parameter-server strategy only the chief finishes; ps and workers
        # serve until the teardown deletes them.
        kwargs["wait_until_job_complete"] = t.strategy == "multi_worker_mirrored" or role == "chief"
        jobs.append(
            KubernetesJobOperator(
                task_id=f"train_{role}",
                arguments=args,
                pool="trainyard_training",
                execution_timeout=dt.timedelta(seconds=t.attempt_timeout_s + 600),
                **kwargs,
            )
        )

    register_args = [
        "--pipeline", name,
        "--snapshot", _xcom("stage", "snapshot_id"),
        "--run-id", "{{ run_id }}",
        "--output-dir", output_dir,
        "--overrides", '{"epochs": {{ params.epochs }}}',
    ]  # fmt: skip
    register = step("register", register_args)
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
    training_service = create_service()
    teardown = delete_objects()
    volumes >> stage >> validate >> training_service >> jobs >> register >> evaluate
    teardown.as_teardown(setups=training_service)
    jobs >> teardown
    gate_task(evaluate.output) >> ensure_serving() >> deploy
    announce = publish_snapshot_event(snapshot_asset(cfg, settings), cfg.dataset, name)
    announce(stage.output, validate.output)
