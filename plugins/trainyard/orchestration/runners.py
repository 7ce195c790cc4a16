"""How a step runs: the operators of the one graph, and the two ways to launch a pod.

Both runners render the same typed objects from the step table: a step's ``V1Pod``
(:func:`trainyard.pods.step_pod`) and a run's Service + Indexed Jobs
(:func:`trainyard.k8s.render.run_training_objects`). What differs is only how they are
launched, chosen by ``TRAINYARD_RUNNER`` when the task runs:

* :class:`LocalRunner` runs the pod's container as a local process (command, args and
  environment as rendered, each volume mount mapped to a local folder, the result read back
  from the same XCom file the pod writes) and the Jobs' pods as N processes under the
  launcher's liveness rules (:mod:`trainyard.training.launcher`).
* :class:`KubernetesRunner` submits them: the pod through ``KubernetesPodOperator`` (after
  making sure the volumes exist, and before ``deploy`` that TF Serving runs), the Jobs
  through ``KubernetesJobOperator`` behind a headless Service; a retry reattaches to Jobs
  of the same run that are still running; the Jobs, Service and pods are always deleted.

Failures are treated alike on both: a step that exits
:data:`~trainyard.steps.EXIT_DETERMINISTIC` (bad config or data, a rejection, a damaged
snapshot) fails its task without retry; any other failure may be retried.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from trainyard.errors import ConfigError, ServingError, TrainingError
from trainyard.k8s.apply import (
    RUN_ANNOTATION,
    create_or_reattach_job,
    delete_training_objects,
    ensure_scorer,
    ensure_serving,
    ensure_volumes,
    find_job_pods,
    replace_training_service,
    take_volume_snapshot,
)
from trainyard.lognoise import is_noise
from trainyard.orchestration.inputs import Source, resolve, resolve_all

if TYPE_CHECKING:
    from airflow.sdk import Context
    from kubernetes.client import V1Job, V1Pod

    from trainyard.config import PipelineConfig, TrainingConfig
    from trainyard.k8s.objects import TrainingObjects
    from trainyard.k8s.profile import ClusterProfile
    from trainyard.settings import Settings

log = logging.getLogger("trainyard.orchestration")


class StepFailed(Exception):
    """A step's pod or process failed, or had nothing to do.

    Attributes:
        deterministic: No retry can fix it (exit code 3).
        skipped: The step had nothing to do (exit code 4): the task skips.
    """

    def __init__(self, message: str, deterministic: bool, skipped: bool = False) -> None:
        super().__init__(message)
        self.deterministic = deterministic
        self.skipped = skipped


class Runner(Protocol):
    """How rendered objects execute."""

    def run_step(
        self, cfg: PipelineConfig, step: str, values: dict[str, Any], context: Context
    ) -> dict[str, Any]:
        """Run one step's pod; return its result (XCom)."""
        ...

    def run_training(
        self,
        cfg: PipelineConfig,
        training: TrainingConfig,
        objects: TrainingObjects,
        context: Context,
        snapshot_ids: Sequence[str],
    ) -> dict[str, Any]:
        """Run one run's training Jobs to completion; return attempts and seconds.

        ``snapshot_ids`` is the training window (the local runner leases each snapshot).
        """
        ...

    def kill(self) -> None:
        """Stop what this runner started for the task (the task was killed)."""
        ...


def runner_for(settings: Settings) -> Runner:
    """The runner ``TRAINYARD_RUNNER`` names."""
    return LocalRunner(settings) if settings.runner == "local" else KubernetesRunner(settings)


def _profile(settings: Settings) -> ClusterProfile:
    from trainyard.k8s.profile import load_cluster_profile

    return load_cluster_profile(settings.cluster_profile)


# --------------------------------------------------------------------------- operators


class StepOperator(BaseOperator):
    """One step of the step table, its arguments resolved from the run, its pod launched.

    Args:
        step: A key of :data:`trainyard.steps.STEPS`.
        pipeline: The pipeline config.
        inputs: Argument name → source (:mod:`trainyard.orchestration.inputs`).
        **kwargs: ``BaseOperator`` arguments.
    """

    ui_color = "#e8f1fb"

    def __init__(
        self, *, step: str, pipeline: PipelineConfig, inputs: Mapping[str, Source], **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        from trainyard.steps import STEPS

        if step not in STEPS:
            raise ConfigError(f"unknown step {step!r} (known: {', '.join(STEPS)})")
        self.step = step
        self.pipeline = pipeline
        self.inputs = dict(inputs)
        self._runner: Runner | None = None
        self._lineage: tuple[dict[str, Any], dict[str, Any], str] | None = None

    def execute(self, context: Context) -> dict[str, Any]:
        """Render the step's pod for this run and launch it with this runner.

        A failure's reason is recorded for the run's page and note
        (:func:`recording_failure`): a step that failed returns no result to show.
        """
        return recording_failure(self.pipeline.name, self.step, context, self._execute)

    def _execute(self, context: Context) -> dict[str, Any]:
        from trainyard.settings import get_settings

        if self.step == "stage":  # the run's first step: a conf no later step takes fails now
            from trainyard.orchestration.run_conf import check_run_conf

            check_run_conf(self.pipeline, context)
        values = resolve_all(self.inputs, context)
        self._lineage = (values, {}, context["run_id"])
        self._runner = runner_for(get_settings())
        result = launch_step(self.pipeline, self.step, values, context, self._runner)
        for outlet in self.outlets or []:
            context["outlet_events"][outlet].extra = {
                "pipeline": self.pipeline.name,
                **{k: result[k] for k in ("version", "snapshot_id") if k in result},
            }
        self._lineage = (values, result, context["run_id"])
        return result

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The step's OpenLineage datasets and facets (:mod:`.lineage`), from its result."""
        from trainyard.orchestration.lineage import step_lineage

        values, result, run_id = self._lineage or ({}, {}, None)
        return step_lineage(self.step, self.pipeline, values, result, run_id)

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> Any:
        """What a failed step read (a rejected snapshot with its assertions, :mod:`.lineage`)."""
        from trainyard.orchestration.lineage import failed_step_lineage

        values, _, _ = self._lineage or ({}, {}, None)
        return failed_step_lineage(self.step, self.pipeline, values)

    def on_kill(self) -> None:
        """Stop the step's process or pod."""
        if self._runner is not None:
            self._runner.kill()


def launch_step(
    cfg: PipelineConfig,
    step: str,
    values: dict[str, Any],
    context: Context,
    runner: Runner | None = None,
) -> dict[str, Any]:
    """Run one step's pod with this deployment's runner; its failure as Airflow's.

    Args:
        cfg: The pipeline.
        step: A key of :data:`trainyard.steps.STEPS`.
        values: Its arguments.
        context: The task's context.
        runner: The runner (default: the one ``TRAINYARD_RUNNER`` names).

    Returns:
        The step's result.

    Raises:
        AirflowSkipException: The step had nothing to do.
        AirflowFailException: It failed in a way no retry fixes.
        AirflowException: It failed otherwise.
    """
    from trainyard.settings import get_settings

    runner = runner or runner_for(get_settings())
    try:
        return runner.run_step(cfg, step, values, context)
    except StepFailed as e:
        if e.skipped:
            raise AirflowSkipException(str(e)) from None
        if e.deterministic:
            raise AirflowFailException(str(e)) from None
        raise AirflowException(str(e)) from None


def recording_failure(
    pipeline: str, step: str, context: Context, execute: Callable[[Context], dict[str, Any]]
) -> dict[str, Any]:
    """Run a task's ``execute``; a failure's reason is also written for the run's page.

    The run's page and note read it (:meth:`Layout.run_failure`): a step that failed
    returns no result to show. Ctrl-C (SIGINT: ``airflow dags test``, ``make run``) fails
    the task for good, ``interrupted by the user``: the step's process or the training
    workers are stopped on the way out, and no retry starts them again.
    """
    from airflow.sdk.exceptions import AirflowTaskTerminated

    from trainyard.errors import INTERRUPTED, Interrupted
    from trainyard.runs import record_failure
    from trainyard.settings import get_settings

    def interrupted() -> AirflowFailException:
        record_failure(pipeline, context["run_id"], step, f"{INTERRUPTED} (during {step})")
        return AirflowFailException(f"{INTERRUPTED} during {step}: not retried")

    stop = get_settings().stop_file
    try:
        return execute(context)
    except (KeyboardInterrupt, Interrupted):  # Ctrl-C (dags test, make run): never retry
        raise interrupted() from None
    except AirflowSkipException:
        raise
    except (Exception, AirflowTaskTerminated) as e:  # the latter is a BaseException
        # once make run was stopped, whatever fails next (a step or a worker it stopped) is
        # the interrupt, not a failure to retry
        if stop is not None and stop.exists():
            raise interrupted() from None
        if isinstance(e, AirflowException):  # a retry that succeeds makes it moot
            record_failure(pipeline, context["run_id"], step, str(e))
        elif isinstance(e, AirflowTaskTerminated):  # marked failed, or its worker stopped
            record_failure(pipeline, context["run_id"], step, f"stopped from outside: {e}")
        else:  # e.g. training stopped by SIGTERM when the run was marked failed
            record_failure(pipeline, context["run_id"], step, f"{type(e).__name__}: {e}")
        raise


class TrainingOperator(BaseOperator):
    """A run's distributed training: its rendered Service + Indexed Jobs, launched.

    Whether the run trains is decided first, alike on both runners
    (:func:`trainyard.orchestration.run_conf.run_training_or_skip`: backfill policy, a
    version trained on the same inputs (the ``plan`` step's pod), dry run).

    Args:
        pipeline: The pipeline config.
        snapshot_id: Where the snapshot id comes from (``stage``'s result).
        window: Where the training window comes from (``validate``'s result: the
            snapshots to train on); None trains on the snapshot alone.
        **kwargs: ``BaseOperator`` arguments.
    """

    ui_color = "#fdf0e0"

    def __init__(
        self,
        *,
        pipeline: PipelineConfig,
        snapshot_id: Source,
        window: Source = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.snapshot_id = snapshot_id
        self.window = window
        self._runner: Runner | None = None
        self._result: dict[str, Any] | None = None

    def execute(self, context: Context) -> dict[str, Any]:
        """Render this run's training objects and run them to completion.

        A failure's reason is recorded for the run's page and note, as a step's is.
        """
        return recording_failure(self.pipeline.name, "train", context, self._execute)

    def _execute(self, context: Context) -> dict[str, Any]:
        from trainyard.k8s.render import run_training_objects
        from trainyard.orchestration.run_conf import run_training_or_skip
        from trainyard.settings import get_settings
        from trainyard.steps import TRAINING_OVERRIDES, window_ids

        settings = get_settings()
        profile = _profile(settings)
        snapshot = resolve(self.snapshot_id, context)
        entries = resolve(self.window, context) or []
        run_id = context["run_id"]
        try:
            ids = window_ids(snapshot, entries)
        except ConfigError as e:
            raise AirflowFailException(f"ConfigError: {e}") from e
        if snapshot not in ids:
            raise AirflowFailException(
                f"the training window {ids} does not hold the run's snapshot {snapshot}"
            )
        log.info(
            "training window: %d snapshot(s), %s rows: %s",
            len(ids),
            sum(e.get("rows") or 0 for e in entries if isinstance(e, dict)) or "?",
            ", ".join(ids),
        )

        def render(training: TrainingConfig) -> TrainingObjects:
            try:
                return run_training_objects(
                    profile, self.pipeline, training, snapshot, run_id, window=ids
                )
            except ConfigError as e:
                raise AirflowFailException(f"ConfigError: {e}") from e

        self._runner = runner_for(settings)

        def decide(training: TrainingConfig, force: bool) -> dict[str, Any]:
            values = {
                "snapshot_id": snapshot,
                "window": ids,
                "overrides": {k: getattr(training, k) for k in TRAINING_OVERRIDES},
                "force_retrain": force,
                "trainer_image": None if settings.runner == "local" else profile.images.trainer,
            }
            return launch_step(self.pipeline, "plan", values, context, self._runner)

        training, decided = run_training_or_skip(
            self.pipeline, context, decide, plan=lambda t: render(t).plan
        )
        if decided.get("reused") is not None:  # nothing trains: no Job, no worker
            self._result = {
                "training": training.model_dump(),
                "snapshot_id": snapshot,
                "window": entries or ids,
                "job": None,
                "seconds": 0.0,
                "attempts": 0,
                **{k: decided.get(k) for k in ("reused", "fingerprint", "decision")},
            }
            return self._result
        objects = render(training)
        if settings.runner == "local":
            log.info("the cluster's plan for these objects (here each pod runs as a process):")
        for line in objects.plan:
            log.info("%s", line)
        t0 = time.monotonic()
        try:
            out = self._runner.run_training(self.pipeline, training, objects, context, ids)
        except StepFailed as e:
            if e.deterministic:
                raise AirflowFailException(str(e)) from None
            raise AirflowException(str(e)) from None
        self._result = {
            "training": training.model_dump(),
            "snapshot_id": snapshot,
            "window": entries or ids,
            "job": objects.name,
            "seconds": round(out.get("seconds", time.monotonic() - t0), 3),
            "attempts": out.get("attempts", 1),
            "reused": None,
            **{k: decided.get(k) for k in ("fingerprint", "decision")},
        }
        return self._result

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The snapshots the training read, as OpenLineage inputs (:mod:`.lineage`)."""
        from trainyard.orchestration.lineage import training_lineage

        return training_lineage(self.pipeline, self._result)

    def on_kill(self) -> None:
        """Stop the training processes or delete the training objects."""
        if self._runner is not None:
            self._runner.kill()


# --------------------------------------------------------------------------- local

TRACKING_STEPS = ("register", "evaluate", "deploy")
"""The steps that mirror into the pipeline's tracker (:mod:`trainyard.tracking`)."""


def connection_env(
    cfg: PipelineConfig, step: str, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The Airflow connections a step's process needs, as ``AIRFLOW_CONN_<CONN_ID>`` (JSON).

    ``stage`` gets the source's (``source.conn_id``), the tracking steps the tracker's
    (``tracking.conn_id``). Steps read connections from their environment (they import
    no Airflow); here Airflow looks each up (its secrets backends, then its database, and
    masks its password in every log), so a connection kept anywhere Airflow finds one
    reaches the step. One the environment already has is left to it; a tracker's that
    Airflow does not know is a warning (the mirror then warns and skips), a source's is
    the stage step's to refuse.

    Args:
        cfg: The pipeline.
        step: The step about to run.
        environ: The Airflow worker's environment (default: this process's).

    Returns:
        Variables to add to the step's environment.
    """
    from trainyard.connections import conn_env_name

    wanted = []
    if step == "stage" and cfg.source.conn_id:
        wanted.append(cfg.source.conn_id)
    if step in TRACKING_STEPS and cfg.tracking is not None:
        wanted.append(cfg.tracking.conn_id)
    env = os.environ if environ is None else environ
    out = {}
    for conn_id in wanted:
        name = conn_env_name(conn_id)
        if name in env:
            continue
        fields = airflow_connection(conn_id)
        if fields is None:
            log.warning(
                "connection %r of pipeline %s: Airflow has none; step %s runs without it",
                conn_id,
                cfg.name,
                step,
            )
            continue
        out[name] = json.dumps(fields)
    return out


def airflow_connection(conn_id: str) -> dict[str, Any] | None:
    """A connection as Airflow finds it (its JSON form's fields), or None if it has none."""
    try:
        from airflow.sdk import BaseHook

        conn = BaseHook.get_connection(conn_id)
    except Exception:  # Airflow raises its own not-found error
        return None
    fields = {
        "conn_type": conn.conn_type,
        "host": conn.host,
        "port": conn.port,
        "schema": conn.schema,
        "login": conn.login,
        "password": conn.password,
        "extra": conn.extra_dejson,
    }
    return {k: v for k, v in fields.items() if v not in (None, "", {})}


class LocalRunner:
    """Rendered pods as local processes (the embedded default).

    Args:
        settings: Local settings (volume root, checkout folders, cluster profile).
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._proc: subprocess.Popen[bytes] | None = None

    def run_step(
        self, cfg: PipelineConfig, step: str, values: dict[str, Any], context: Context
    ) -> dict[str, Any]:
        """Run a step's rendered pod as a process; its result is the pod's XCom file."""
        return run_pod_locally(
            self.pod(cfg, step, values, context["run_id"]),
            self.settings,
            log=log.info,
            started=self._started,
            env=connection_env(cfg, step),
        )

    def pod(
        self, cfg: PipelineConfig, step: str, values: dict[str, Any], run_id: str | None = None
    ) -> V1Pod:
        """The step's pod, as the cluster would get it."""
        from trainyard.pods import step_pod

        return step_pod(_profile(self.settings), cfg, step, values, run_id=run_id)

    def _started(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc = proc

    def run_training(
        self,
        cfg: PipelineConfig,
        training: TrainingConfig,
        objects: TrainingObjects,
        context: Context,
        snapshot_ids: Sequence[str],
    ) -> dict[str, Any]:
        """Run the Jobs' pods as processes, every snapshot of the window leased."""
        from trainyard.errors import SnapshotError
        from trainyard.training.launcher import run_jobs
        from trainyard.volumes import lease_window

        try:
            with lease_window(
                cfg.dataset,
                snapshot_ids,
                purpose=f"train {context['run_id']}",
                volume_root=self.settings.volume_root,
            ):
                attempts, seconds = run_jobs(objects, training, self.settings, log=log.info)
        except SnapshotError as e:
            raise StepFailed(f"SnapshotError: {e}", True) from e
        except TrainingError as e:
            raise StepFailed(f"TrainingError: {e}", not getattr(e, "retryable", True)) from e
        return {"attempts": attempts, "seconds": seconds}

    def kill(self) -> None:
        """SIGTERM the step's process group (the training launcher stops its own)."""
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGTERM)


def run_pod_locally(
    pod: V1Pod,
    settings: Settings,
    *,
    log: Any = log.info,
    started: Any = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Run a step pod's container as a local process and read back its result.

    Args:
        pod: The rendered step pod.
        settings: Local settings (the volume root its mounts map to).
        log: Receives the command and every output line.
        started: Called with the process once it started (for ``on_kill``).
        env: Variables added to the process's environment (never to the pod's spec).

    Returns:
        The result the step wrote to its XCom file.

    Raises:
        StepFailed: If the process exits non-zero (deterministic on exit code 3), naming
            the error line the step wrote.
        Interrupted: If ``make run`` was stopped (``settings.stop_file`` exists) before the
            process started or when it ended badly.
    """
    import shlex

    from trainyard.errors import Interrupted
    from trainyard.k8s.local import TERMINATION_LOG, XCOM_PATH, local_process
    from trainyard.steps import EXIT_DETERMINISTIC, EXIT_SKIPPED

    stop = settings.stop_file
    if stop is not None and stop.exists():
        raise Interrupted(f"pod {pod.metadata.name} not started")
    with tempfile.TemporaryDirectory(prefix="trainyard-pod-") as scratch:
        proc = local_process(
            pod.spec,
            volume_root=settings.volume_root,
            scratch=Path(scratch),
            settings=settings,
            extra_env=env,
        )
        log(f"pod {pod.metadata.name}: running {shlex.join(proc.argv)}")
        child = subprocess.Popen(
            proc.argv,
            env=proc.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if started is not None:
            started(child)
        tail: list[str] = []
        try:
            assert child.stdout is not None
            for raw in child.stdout:
                line = raw.decode("utf-8", "replace").rstrip()
                tail = [*tail[-19:], line]
                if not is_noise(line):
                    log(line)
            code = child.wait()
        finally:
            if child.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(child.pid, signal.SIGKILL)
                child.wait()
        if code != 0 and stop is not None and stop.exists():  # stopped by make run's Ctrl-C
            raise Interrupted(f"pod {pod.metadata.name} stopped (exit code {code})")
        if code != 0:
            message = proc.local(TERMINATION_LOG)
            text = message.read_text(encoding="utf-8").strip() if message.is_file() else ""
            last = next((t for t in reversed(tail) if t.strip()), None)
            if code < 0 and not text:  # a kill says nothing; its last line would mislead
                killer = signal.Signals(-code).name
                text = f"pod {pod.metadata.name}: the step's process was killed by {killer}"
                text += f" (its last line: {last})" if last else ""
            text = text or last or f"exit code {code}"
            final = code in (EXIT_DETERMINISTIC, EXIT_SKIPPED)
            raise StepFailed(text, deterministic=final, skipped=code == EXIT_SKIPPED)
        result_file = proc.local(XCOM_PATH)
        if not result_file.is_file():
            raise StepFailed(f"pod {pod.metadata.name} wrote no result ({XCOM_PATH})", False)
        return json.loads(result_file.read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- kubernetes


class KubernetesRunner:
    """Rendered objects submitted to the cluster (``TRAINYARD_RUNNER=kubernetes``).

    Args:
        settings: Settings (the cluster profile).
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.profile = _profile(settings)
        self._operator: Any = None
        self._teardown: Any = None

    def run_step(
        self, cfg: PipelineConfig, step: str, values: dict[str, Any], context: Context
    ) -> dict[str, Any]:
        """Submit the step's pod with KubernetesPodOperator and return its XCom."""
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        from trainyard.pods import step_pod

        hook = KubernetesHook()
        env: dict[str, str] = {}
        if step == "stage":
            ensure_volumes(hook.core_v1_client, self.profile, cfg)
        if step == "deploy":
            try:
                env["TRAINYARD_SERVING_HOST"] = ensure_serving(hook, self.profile, cfg)
            except ServingError as e:
                raise StepFailed(str(e), False) from e
        pod = step_pod(self.profile, cfg, step, values, env=env, run_id=context["run_id"])
        # the train task's plan pod looks for no pod to reattach to: by the task's labels it
        # would find the running Job's worker pods (a retry's FoundMoreThanOnePodFailure)
        op = step_pod_operator(
            pod, self.profile, task_id=context["ti"].task_id, reattach=step != "plan"
        )
        self._operator = op
        result = op.execute(context)
        if step == "stage":
            self._volume_snapshot(hook, cfg, result)
        if step == "deploy" and cfg.scoring.stream is not None:
            result["scorer"] = ensure_scorer(
                hook.apps_v1_client, self.profile, cfg, result.get("version")
            )
        return result

    def _volume_snapshot(self, hook: Any, cfg: PipelineConfig, staged: dict[str, Any]) -> None:
        from kubernetes.client import CustomObjectsApi

        from trainyard import k8s

        snapshot_class = cfg.staging.volume_snapshot_class or (
            self.profile.storage.volume_snapshot_class
        )
        if not snapshot_class or staged.get("reused"):
            return
        body = k8s.volume_snapshot(self.profile, cfg.dataset, staged["snapshot_id"], snapshot_class)
        custom = CustomObjectsApi(hook.api_client)
        take_volume_snapshot(custom, body, cfg.staging.volume_snapshot_timeout_s)

    def run_training(
        self,
        cfg: PipelineConfig,
        training: TrainingConfig,
        objects: TrainingObjects,
        context: Context,
        snapshot_ids: Sequence[str],
    ) -> dict[str, Any]:
        """Create (or reattach to) the Service and Jobs, wait, always delete them.

        The snapshots (``snapshot_ids``, the training window) are in the Jobs' worker
        command; the dataset volume is not mounted here, so nothing is leased.
        """
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        hook = KubernetesHook()
        core = hook.core_v1_client
        t0 = time.monotonic()
        self._teardown = lambda: delete_training_objects(hook, objects)
        for obj in (objects.service, *objects.jobs):
            obj.metadata.annotations = {
                **(obj.metadata.annotations or {}),
                RUN_ANNOTATION: context["run_id"],
            }
        try:
            replace_training_service(core, objects.service, run=context["run_id"])
            success_role = "chief" if training.strategy == "parameter_server" else "worker"
            # every Job exists before the wait: the chief's ends only once the workers run
            for job in sorted(objects.jobs, key=lambda j: _role(j) == success_role):
                op = role_job_operator(job, context["ti"].task_id, wait=_role(job) == success_role)
                self._operator = op
                op.execute(context)
        except (AirflowException, TrainingError) as e:
            raise StepFailed(f"training Job failed: {e}", False) from e
        finally:
            self._teardown()
            self._teardown = None
        return {"attempts": 1, "seconds": time.monotonic() - t0}

    def kill(self) -> None:
        """Stop the running pod operator and delete the training objects."""
        if self._operator is not None:
            with contextlib.suppress(Exception):
                self._operator.on_kill()
        if self._teardown is not None:
            self._teardown()


def _role(job: V1Job) -> str:
    from trainyard.k8s.objects import ROLE_LABEL

    return job.metadata.labels[ROLE_LABEL]


def step_pod_operator(
    pod: V1Pod, profile: ClusterProfile, task_id: str, *, reattach: bool = True
) -> Any:
    """The KubernetesPodOperator that submits a step pod and returns its XCom.

    A container that exits :data:`~trainyard.steps.EXIT_DETERMINISTIC` fails the task
    without retry, with the step's one-line error (its termination message); one that
    exits :data:`~trainyard.steps.EXIT_SKIPPED` skips it with the step's reason. With
    ``reattach``, a retry of the task takes over the pod an earlier try left running.
    """
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    from trainyard import k8s
    from trainyard.steps import EXIT_DETERMINISTIC, EXIT_SKIPPED

    class StepPodOperator(KubernetesPodOperator):
        def cleanup(self, pod: Any, remote_pod: Any, *args: Any, **kwargs: Any) -> None:
            try:
                super().cleanup(pod, remote_pod, *args, **kwargs)
            except AirflowException as e:
                state = _terminated(remote_pod)
                if state is not None and state.exit_code == EXIT_DETERMINISTIC:
                    raise AirflowFailException(state.message or str(e)) from None
                if state is not None and state.exit_code == EXIT_SKIPPED:
                    raise AirflowSkipException(state.message or str(e)) from None
                raise

    container = pod.spec.containers[0]
    return StepPodOperator(
        task_id=task_id,
        name=pod.metadata.name,
        namespace=profile.namespace,
        image=container.image,
        cmds=list(container.command),
        arguments=list(container.args),
        full_pod_spec=pod,
        do_xcom_push=True,
        xcom_sidecar_container_security_context=k8s.xcom_sidecar_security_context(),
        on_finish_action="delete_pod",
        get_logs=True,
        reattach_on_restart=reattach,
    )


def _terminated(remote_pod: Any) -> Any:
    from trainyard.k8s.objects import BASE_CONTAINER

    statuses = (
        remote_pod.status.container_statuses if remote_pod and remote_pod.status else None
    ) or []
    base = next((s for s in statuses if s.name == BASE_CONTAINER), None)
    return base.state.terminated if base and base.state else None


def role_job_operator(job: V1Job, task_id: str, *, wait: bool) -> Any:
    """The KubernetesJobOperator of one role's Indexed Job, reattaching and Kueue-aware.

    * A Job of the same name left running by an earlier try of the same run (the Airflow
      worker restarted) is reattached, not deleted and recreated; one of another run, or
      a failed one, is deleted (foreground) and created again.
    * Its pods are looked for until the Job is admitted and its pods exist (Kueue creates
      Jobs suspended; apache/airflow#70585), with a growing pause between looks.
    * The logs of pods that are gone are skipped: a failed Job's controller deletes its
      running pods, and the provider reads every pod's logs before it reports the failure.

    Args:
        job: The role's Job.
        task_id: The task.
        wait: Wait until the Job completes (the role whose completion ends training).

    Returns:
        The operator.
    """
    from functools import cached_property

    from airflow.providers.cncf.kubernetes.operators.job import KubernetesJobOperator
    from airflow.providers.cncf.kubernetes.utils.pod_manager import PodManager
    from kubernetes.client.rest import ApiException

    from trainyard import k8s

    class JobPodManager(PodManager):
        def fetch_requested_container_logs(self, pod: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().fetch_requested_container_logs(pod, *args, **kwargs)
            except ApiException as e:
                if e.status != 404:
                    raise
                self.log.warning("pod %s is gone: its logs are lost", pod.metadata.name)
                return []

    class RoleJobOperator(KubernetesJobOperator):
        @cached_property
        def pod_manager(self) -> PodManager:
            return JobPodManager(kube_client=self.client, callbacks=self.callbacks)

        def create_job(self, job_request_obj: V1Job) -> V1Job:
            return create_or_reattach_job(self.job_client, job_request_obj, log=self.log.info)

        def get_pods(self, pod_request_obj: Any, context: Any, **kwargs: Any) -> Sequence[Any]:
            return find_job_pods(
                self.client,
                self.job_client,
                self.job,
                expected=self.parallelism or 1,
                timeout_s=float(job.spec.active_deadline_seconds or 3600),
            )

    kwargs = k8s.job_operator_kwargs(job)
    kwargs["wait_until_job_complete"] = wait
    return RoleJobOperator(task_id=task_id, **kwargs)
