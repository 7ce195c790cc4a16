"""Local launcher: a run's rendered training Jobs as local processes, owning liveness.

Each pod of the Indexed Jobs the cluster would run becomes a process with the pod's
command, args and environment (``JOB_COMPLETION_INDEX`` included); every attempt maps the
headless Service's DNS names to fresh loopback ports, and each worker derives its
``TF_CONFIG`` from that environment exactly as in a pod. Each task runs in its
own process group; its output is streamed line by line, prefixed with its role, into the
``log`` callback (the Airflow task log). The attempt fails when a task has not printed
:data:`~trainyard.training.worker.main.READY_MARKER` by the start deadline, when any task exits
non-zero, or at the per-attempt wall-clock limit; then every group is stopped and the whole
attempt is retried, resuming from the ``BackupAndRestore`` checkpoint. NaN loss and bad
input are deterministic and end the run at once. No task outlives the launcher: groups are
killed on success, failure, timeout, exception and SIGTERM, and the workers watch the
launcher's pid (``PR_SET_PDEATHSIG``) in case it is SIGKILLed. A SIGTERM (Airflow killing
or timing out the task) ends the run with :class:`~trainyard.errors.TrainingTerminated`:
no other attempt starts.

TensorFlow's gRPC server listens on every interface whatever ``TF_CONFIG`` says; on Linux
each task gets :data:`LOOPBACK_LIBRARY` preloaded with :data:`~trainyard.training.spec.ENV_BIND`
set, which turns its wildcard binds into loopback ones (pods never get it). Without that
library the launcher refuses to start any task.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainyard.errors import TrainingError, TrainingTerminated
from trainyard.fsutil import read_json
from trainyard.lognoise import is_noise
from trainyard.training import spec
from trainyard.training.worker.main import EXIT_BAD_INPUT, NAN_MARKER, READY_MARKER

if TYPE_CHECKING:
    from trainyard.config import PipelineConfig, TrainingConfig
    from trainyard.k8s.objects import TrainingObjects
    from trainyard.k8s.profile import ClusterProfile

LOOPBACK = "127.0.0.1"
LOOPBACK_LIBRARY = Path(__file__).with_name("_loopback.so")
"""The ``LD_PRELOAD`` library built from ``_loopback.c`` by ``setup.py`` (``make native``)."""
logger = logging.getLogger("trainyard.training")


@dataclass(frozen=True)
class TrainResult:
    """Outcome of a training run.

    Attributes:
        output_dir: Holds ``model/`` (SavedModel), ``metrics.json``, ``history.json``.
        metrics: Contents of ``metrics.json``.
        history: Contents of ``history.json`` (per-epoch rows, start epoch of each attempt).
        attempts: Attempts used (1 = no retry).
        seconds: Wall-clock time of the whole run.
        tf_config_roles: ``<type>:<index>`` of every task started per attempt.
    """

    output_dir: Path
    metrics: dict[str, Any]
    history: dict[str, Any]
    attempts: int
    seconds: float
    tf_config_roles: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class TaskSpec:
    """One task process: a pod of a rendered training Job, as a local process.

    Attributes:
        name: ``<type>:<index>`` (log prefix).
        argv: Command and arguments.
        env: Its environment (the container's, paths mapped).
        dns: The pod's DNS name on the cluster (``<job>-<index>.<service>``), mapped to a
            fresh loopback port each attempt (:data:`~trainyard.training.spec.ENV_HOSTS`).
    """

    name: str
    argv: list[str]
    env: dict[str, str]
    dns: str


@dataclass
class LaunchSpec:
    """What to launch: the task processes and the liveness limits.

    Attributes:
        tasks: Every task of an attempt.
        start_deadline_s: Every task must print the ready marker within this time.
        attempt_timeout_s: Wall-clock limit of one attempt.
        max_attempts: Attempts before giving up.
        env: Extra environment for every task (tests: ``TRAINYARD_FAULT``).
        success_roles: Task types whose exit 0 completes the attempt (the others are
            servers that are stopped afterwards).
    """

    tasks: list[TaskSpec]
    start_deadline_s: float
    attempt_timeout_s: float
    max_attempts: int
    env: dict[str, str] = field(default_factory=dict)
    success_roles: tuple[str, ...] = ("worker",)


class _NonRetryable(TrainingError):
    """A worker rejected its input or the loss became NaN: no attempt or retry fixes it."""

    retryable = False


def loopback_env(log: Callable[[str], None]) -> dict[str, str]:
    """What keeps the local tasks' listening sockets on loopback: the preload library.

    Args:
        log: Where the warning goes off Linux.

    Returns:
        ``LD_PRELOAD`` and :data:`~trainyard.training.spec.ENV_BIND` for every task (off
        Linux, where there is no such mechanism, only the latter, after a warning).

    Raises:
        TrainingError: On Linux when :data:`LOOPBACK_LIBRARY` is missing (not retryable):
            the workers would be reachable from other machines.
    """
    if not sys.platform.startswith("linux"):
        log(
            f"warning: on {sys.platform} the training workers' gRPC servers listen on every "
            "network interface (loopback only is enforced on Linux)"
        )
        return {spec.ENV_BIND: LOOPBACK}
    if not LOOPBACK_LIBRARY.is_file():
        error = TrainingError(
            f"{LOOPBACK_LIBRARY} is missing, so the training workers' gRPC servers would "
            "listen on every network interface; refusing to start them. Build it with "
            "`make native` (pip install -e .; needs a C compiler)"
        )
        error.retryable = False  # type: ignore[attr-defined]
        raise error
    return {"LD_PRELOAD": str(LOOPBACK_LIBRARY), spec.ENV_BIND: LOOPBACK}


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 (held open together while picked)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class _Task:
    def __init__(
        self, name: str, cmd: list[str], env: dict[str, str], log: Callable[[str], None]
    ) -> None:
        self.name = name
        self.ready = threading.Event()
        self.nan = threading.Event()
        self.tail: list[str] = []
        self.proc = subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pgid = self.proc.pid
        self._reader = threading.Thread(
            target=self._pump, args=(log,), name=f"log-{name}", daemon=True
        )
        self._reader.start()

    def _pump(self, log: Callable[[str], None]) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            if READY_MARKER in line:
                self.ready.set()
            elif NAN_MARKER in line:
                self.nan.set()
            self.tail = [*self.tail[-19:], line]
            if not is_noise(line):
                # the worker names itself in its own lines (a pod's log has no prefix)
                mine = line.startswith(f"[{self.name}] ")
                log(line if mine else f"[{self.name}] {line}")

    def kill(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, sig)

    def finish_logs(self) -> None:
        self._reader.join(timeout=5)


def task_env(
    task: TaskSpec,
    hosts: dict[str, str],
    guard: dict[str, str],
    *,
    attempt: int | None = None,
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """A task process's environment: its pod's, plus the loopback mapping of the cluster.

    Args:
        task: The task (its pod's container environment, paths mapped).
        hosts: Every DNS name of the attempt (``<job>-<index>.<service>``) mapped to a
            loopback ``host:port`` (:data:`~trainyard.training.spec.ENV_HOSTS`).
        guard: :func:`loopback_env` (the preload library that keeps binds on loopback).
        attempt: The attempt number (:data:`~trainyard.training.spec.ENV_ATTEMPT`), if any.
        extra: Variables set after the pod's (tests: ``TRAINYARD_FAULT``).

    Returns:
        The environment; ``TF_CONFIG`` is left out (the worker derives it, as in a pod) and
        the worker watches this process (:data:`~trainyard.training.spec.ENV_PARENT_PID`).
    """
    env = dict(task.env)
    env.pop("TF_CONFIG", None)  # derived by the worker, as in a pod
    env.update(extra or {})
    preload = [guard.get("LD_PRELOAD", ""), env.get("LD_PRELOAD", "")]
    env.update(guard)
    if guard.get("LD_PRELOAD"):
        env["LD_PRELOAD"] = " ".join(p for p in preload if p)
    env.update(
        {
            spec.ENV_HOSTS: json.dumps(hosts, sort_keys=True),
            spec.ENV_PARENT_PID: str(os.getpid()),
            "TF_USE_LEGACY_KERAS": "1",
        }
    )
    if attempt is not None:
        env[spec.ENV_ATTEMPT] = str(attempt)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


class _Attempt:
    """One attempt's processes; stopped (whole groups) on exit, whatever happened."""

    def __init__(
        self,
        launch: LaunchSpec,
        attempt: int,
        log: Callable[[str], None],
        guard: dict[str, str],
    ) -> None:
        self.spec, self.attempt, self.log, self.guard = launch, attempt, log, guard
        self.tasks: list[_Task] = []

    def start(self) -> None:
        ports = free_ports(len(self.spec.tasks))
        hosts = {t.dns: f"{LOOPBACK}:{p}" for t, p in zip(self.spec.tasks, ports, strict=True)}
        for task in self.spec.tasks:
            env = task_env(task, hosts, self.guard, attempt=self.attempt, extra=self.spec.env)
            self.tasks.append(_Task(task.name, task.argv, env, self.log))
        self.log(f"attempt {self.attempt}: started {', '.join(t.name for t in self.tasks)}")
        self.log(f"attempt {self.attempt}: addresses {hosts}")
        self.log(f"attempt {self.attempt}: command {shlex.join(self.spec.tasks[0].argv)}")

    def wait(self) -> None:
        """Block until the attempt succeeds; raise TrainingError (or _NonRetryable) otherwise."""
        t0 = time.monotonic()
        deadline_hit = False
        while True:
            time.sleep(0.1)
            elapsed = time.monotonic() - t0
            codes = {t.name: t.proc.poll() for t in self.tasks}
            for t in self.tasks:
                code = codes[t.name]
                if code is None or code == 0:
                    continue
                t.finish_logs()
                if code == EXIT_BAD_INPUT and t.nan.is_set():
                    raise _NonRetryable(
                        f"loss became NaN (or inf) in {t.name} during attempt {self.attempt}; "
                        "training stopped and no model was exported "
                        "(check the data and the learning rate)"
                    )
                if code == EXIT_BAD_INPUT:
                    raise _NonRetryable(f"{t.name} rejected its input: {self._last_error(t)}")
                why = f"signal {-code}" if code < 0 else f"exit code {code}"
                raise TrainingError(
                    f"{t.name} died ({why}) after {elapsed:.1f}s: {self._last_error(t)}"
                )
            done = [t for t in self.tasks if t.name.split(":")[0] in self.spec.success_roles]
            if all(codes[t.name] == 0 for t in done):
                return
            finished_early = [t.name for t in self.tasks if codes[t.name] == 0 and t not in done]
            if finished_early:
                raise TrainingError(
                    f"server task(s) {finished_early} exited before training finished"
                )
            if not deadline_hit and elapsed > self.spec.start_deadline_s:
                late = [t.name for t in self.tasks if not t.ready.is_set()]
                if late:
                    raise TrainingError(
                        f"{', '.join(late)} not ready within the start deadline "
                        f"of {self.spec.start_deadline_s:g}s"
                    )
                deadline_hit = True
            if elapsed > self.spec.attempt_timeout_s:
                raise TrainingError(
                    f"attempt {self.attempt} exceeded its time limit "
                    f"of {self.spec.attempt_timeout_s:g}s"
                )

    @staticmethod
    def _last_error(task: _Task) -> str:
        lines = [ln for ln in task.tail if ln.strip()]
        return lines[-1] if lines else "(no output)"

    def stop(self) -> None:
        """SIGTERM every group, then SIGKILL what is left after a grace period."""
        for t in self.tasks:
            if t.proc.poll() is None:
                t.kill(signal.SIGTERM)
        end = time.monotonic() + 3
        while time.monotonic() < end and any(t.proc.poll() is None for t in self.tasks):
            time.sleep(0.05)
        for t in self.tasks:
            t.kill(signal.SIGKILL)  # the group: stray grandchildren too
            with contextlib.suppress(subprocess.TimeoutExpired):
                t.proc.wait(timeout=5)
            t.finish_logs()


@contextlib.contextmanager
def _sigterm_stops(attempt_ref: list[_Attempt | None], received: list[int]) -> Iterator[None]:
    """On SIGTERM (a task killed from Airflow), stop the workers and note it in ``received``.

    Training then ends with :class:`~trainyard.errors.TrainingTerminated` (see
    :func:`_stop_if_terminated`) rather than from here: Airflow's own handler, called after
    the workers are stopped, returns, and the launch loop would otherwise count the killed
    workers as a failed attempt and start another one.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum: int, frame: Any) -> None:
        received.append(signum)
        if attempt_ref[0] is not None:
            attempt_ref[0].stop()
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stop_if_terminated(received: list[int]) -> None:
    if received:
        raise TrainingTerminated(
            f"training stopped by {signal.Signals(received[0]).name}: every worker was "
            "killed, no other attempt starts and no model is taken from this run"
        )


def launch(plan: LaunchSpec, log: Callable[[str], None] | None = None) -> int:
    """Run attempts until one succeeds.

    Args:
        plan: Task processes and limits.
        log: Receives every output line (prefixed ``[<type>:<index>]``) and launcher
            messages; defaults to the ``trainyard.training`` logger.

    Returns:
        The number of attempts used.

    Raises:
        TrainingError: NaN loss or bad input (at once), no loopback guard on Linux (before
            any task starts, :func:`loopback_env`), or every attempt failed (the message
            lists each attempt's reason).
        TrainingTerminated: SIGTERM arrived while it ran (not retryable).
    """
    emit = log or logger.info
    guard = loopback_env(emit)
    failures: list[str] = []
    current: list[_Attempt | None] = [None]
    received: list[int] = []
    with _sigterm_stops(current, received):
        for attempt in range(1, plan.max_attempts + 1):
            run = _Attempt(plan, attempt, emit, guard)
            current[0] = run
            try:
                _stop_if_terminated(received)
                run.start()
                run.wait()
                _stop_if_terminated(received)
                emit(f"attempt {attempt}: training finished")
                return attempt
            except TrainingTerminated:
                raise
            except _NonRetryable as e:
                error = TrainingError(str(e))
                error.retryable = False  # type: ignore[attr-defined]
                raise error from None
            except TrainingError as e:
                _stop_if_terminated(received)
                failures.append(f"attempt {attempt}: {e}")
                emit(f"attempt {attempt} failed: {e}; stopping every task")
            finally:
                run.stop()
                current[0] = None
    raise TrainingError(
        f"training failed after {plan.max_attempts} attempt(s):\n  " + "\n  ".join(failures)
    )


def job_tasks(
    objects: TrainingObjects, *, volume_root: Path, scratch: Path, settings: Any
) -> list[TaskSpec]:
    """Every pod of an attempt's rendered Indexed Jobs, as local task processes.

    Pod ``i`` of a Job gets ``JOB_COMPLETION_INDEX=i`` as Kubernetes would set it; its
    container's command, args and environment are the Job's, paths mapped
    (:func:`trainyard.k8s.local.local_process`).

    Args:
        objects: The attempt's Service and Jobs.
        volume_root: The local volume root (``/volumes`` in the pods).
        scratch: A private folder for the pods' ``emptyDir`` mounts.
        settings: Local settings.

    Returns:
        One task per pod, in Job order (ps, chief, worker).
    """
    from trainyard.k8s.local import local_process
    from trainyard.k8s.objects import ROLE_LABEL

    tasks = []
    for job in objects.jobs:
        role = job.metadata.labels[ROLE_LABEL]
        pod = job.spec.template.spec
        for index in range(job.spec.completions):
            proc = local_process(
                pod,
                volume_root=volume_root,
                scratch=scratch / f"{role}-{index}",
                settings=settings,
                extra_env={spec.ENV_INDEX: str(index)},
            )
            dns = f"{job.metadata.name}-{index}.{pod.subdomain}"
            tasks.append(TaskSpec(f"{role}:{index}", proc.argv, proc.env, dns))
    return tasks


def run_jobs(
    objects: TrainingObjects,
    training: TrainingConfig,
    settings: Any,
    log: Callable[[str], None] | None = None,
    *,
    env: dict[str, str] | None = None,
) -> tuple[int, float]:
    """Run a run's rendered training Jobs as local processes until an attempt succeeds.

    Args:
        objects: The run's Service and Jobs (as the cluster would get them).
        training: The run's training config (start deadline, attempt limits, strategy).
        settings: Local settings (volume root, checkout folders).
        log: Line sink (the Airflow task log); defaults to python logging.
        env: Extra environment for the workers (tests: ``TRAINYARD_FAULT``).

    Returns:
        (attempts used, wall-clock seconds).

    Raises:
        TrainingError: See :func:`launch`.
    """
    import tempfile

    emit = log or logger.info
    with tempfile.TemporaryDirectory(prefix="trainyard-pods-") as scratch:
        plan = LaunchSpec(
            tasks=job_tasks(
                objects, volume_root=settings.volume_root, scratch=Path(scratch), settings=settings
            ),
            start_deadline_s=training.start_deadline_s,
            attempt_timeout_s=training.attempt_timeout_s,
            max_attempts=training.max_attempts,
            env=dict(env or {}),
            success_roles=("chief",) if training.strategy == "parameter_server" else ("worker",),
        )
        t0 = time.monotonic()
        attempts = launch(plan, emit)
        return attempts, time.monotonic() - t0


def run_training(
    pipeline: PipelineConfig,
    training: TrainingConfig,
    snapshot_id: str,
    run_id: str,
    log: Callable[[str], None] | None = None,
    *,
    env: dict[str, str] | None = None,
    profile: ClusterProfile | None = None,
    window: Sequence[str] | None = None,
) -> TrainResult:
    """Train on a snapshot by running the run's rendered training Jobs as local processes.

    The Service and Indexed Jobs are the ones the kubernetes runner submits
    (:func:`trainyard.k8s.render.run_training_objects`); here each of their pods is a
    process on a loopback port, under :func:`launch`'s liveness rules.

    Args:
        pipeline: The pipeline config.
        training: The run's effective training config.
        snapshot_id: The validated snapshot to train on.
        run_id: The run; names the checkpoint and output folders (re-running the same
            ``run_id`` resumes from its checkpoint).
        log: Line sink (the Airflow task log); defaults to python logging.
        env: Extra environment for the workers (tests: ``TRAINYARD_FAULT``).
        profile: Cluster profile (default: the settings').
        window: Every snapshot of the run's training window (default: ``snapshot_id``
            alone); all are leased against retention while the workers run.

    Returns:
        The result, read back from what the chief wrote.

    Raises:
        TrainingError: See :func:`launch`; also if the chief reported success but wrote
            no model.
        ConfigError: Unknown strategy, no parameter server for ``parameter_server``, or an
            unknown priority tier.
    """
    from trainyard.k8s.profile import load_cluster_profile
    from trainyard.k8s.render import run_training_objects
    from trainyard.layout import Layout
    from trainyard.settings import get_settings

    settings = get_settings()
    profile = profile or load_cluster_profile(settings.cluster_profile)
    objects = run_training_objects(profile, pipeline, training, snapshot_id, run_id, window=window)
    emit = log or logger.info
    emit("the cluster's plan for these objects (here each pod runs as a process):")
    for line in objects.plan:
        emit(line)
    from trainyard.volumes import lease_window

    with lease_window(
        pipeline.dataset,
        [*(window or ()), snapshot_id],
        purpose=f"train {run_id}",
        volume_root=settings.volume_root,
    ):
        attempts, seconds = run_jobs(objects, training, settings, emit, env=env)
    output_dir = Path(
        spec.run_paths(Layout(settings.volume_root), pipeline, snapshot_id, run_id).output
    )
    if not (output_dir / "model" / "saved_model.pb").is_file():
        raise TrainingError(
            f"{output_dir}: training finished but the chief wrote no model/saved_model.pb"
        )
    return TrainResult(
        output_dir=output_dir,
        metrics=read_json(output_dir / "metrics.json"),
        history=read_json(output_dir / "history.json"),
        attempts=attempts,
        seconds=seconds,
        tf_config_roles=[
            f"{_role(j)}:{i}" for j in objects.jobs for i in range(j.spec.completions)
        ],
    )


def _role(job: Any) -> str:
    from trainyard.k8s.objects import ROLE_LABEL

    return job.metadata.labels[ROLE_LABEL]
