"""Local launcher: the same worker command N times on loopback ports, owning liveness.

Every attempt gets fresh ports and a fresh ``TF_CONFIG`` per task. Each task runs in its
own process group; its output is streamed line by line, prefixed with its role, into the
``log`` callback (the Airflow task log). The attempt fails when a task has not printed
:data:`~trainyard.training.worker.main.READY_MARKER` by the start deadline, when any task exits
non-zero, or at the per-attempt wall-clock limit; then every group is stopped and the whole
attempt is retried, resuming from the ``BackupAndRestore`` checkpoint. NaN loss and bad
input are deterministic and end the run at once. No task outlives the launcher: groups are
killed on success, failure, timeout, exception and SIGTERM, and the workers watch the
launcher's pid (``PR_SET_PDEATHSIG``) in case it is SIGKILLed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainyard.errors import TrainingError
from trainyard.fsutil import read_json
from trainyard.training.worker.main import EXIT_BAD_INPUT, EXIT_NAN, READY_MARKER
from trainyard.training.worker.tf_config import cluster_roles, make_tf_config

_PLUGINS_DIR = Path(__file__).resolve().parents[2]
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


@dataclass
class LaunchSpec:
    """What to launch: the worker arguments and the liveness limits.

    Attributes:
        worker_args: Arguments after ``python -m trainyard.training.worker``.
        roles: (task type, index) of every task.
        start_deadline_s: Every task must print the ready marker within this time.
        attempt_timeout_s: Wall-clock limit of one attempt.
        max_attempts: Attempts before giving up.
        env: Extra environment for every task.
        success_roles: Task types whose exit 0 completes the attempt (the others are
            servers that are stopped afterwards).
        command: The program before ``worker_args`` (default: this interpreter running
            ``-m trainyard.training.worker``).
    """

    worker_args: list[str]
    roles: list[tuple[str, int]]
    start_deadline_s: float
    attempt_timeout_s: float
    max_attempts: int
    env: dict[str, str] = field(default_factory=dict)
    success_roles: tuple[str, ...] = ("worker",)
    command: list[str] | None = None


class _NonRetryable(TrainingError):
    pass


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
            self.tail = [*self.tail[-19:], line]
            log(f"[{self.name}] {line}")

    def kill(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, sig)

    def finish_logs(self) -> None:
        self._reader.join(timeout=5)


class _Attempt:
    """One attempt's processes; stopped (whole groups) on exit, whatever happened."""

    def __init__(self, spec: LaunchSpec, attempt: int, log: Callable[[str], None]) -> None:
        self.spec, self.attempt, self.log = spec, attempt, log
        self.tasks: list[_Task] = []

    def start(self) -> None:
        ports = free_ports(len(self.spec.roles))
        cluster: dict[str, list[str]] = {}
        for (ttype, _i), port in zip(self.spec.roles, ports, strict=True):
            cluster.setdefault(ttype, []).append(f"127.0.0.1:{port}")
        base = dict(os.environ)
        base.update(self.spec.env)
        base["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(_PLUGINS_DIR), base.get("PYTHONPATH", "")) if p
        )
        base["TRAINYARD_PARENT_PID"] = str(os.getpid())
        base["TRAINYARD_ATTEMPT"] = str(self.attempt)
        base["TF_USE_LEGACY_KERAS"] = "1"
        base.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        base.setdefault("PYTHONUNBUFFERED", "1")
        for key in (
            "JOB_COMPLETION_INDEX",
            "TRAINYARD_TF_JOBS",
            "TRAINYARD_TF_SERVICE",
            "TRAINYARD_TF_TASK_TYPE",
        ):
            base.pop(key, None)
        program = self.spec.command or [sys.executable, "-m", "trainyard.training.worker"]
        cmd = [*program, *self.spec.worker_args]
        for ttype, index in self.spec.roles:
            env = dict(base, TF_CONFIG=json.dumps(make_tf_config(cluster, ttype, index)))
            self.tasks.append(_Task(f"{ttype}:{index}", cmd, env, self.log))
        self.log(
            f"attempt {self.attempt}: started {', '.join(t.name for t in self.tasks)} on {cluster}"
        )

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
                if code == EXIT_NAN:
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
def _sigterm_stops(attempt_ref: list[_Attempt | None]) -> Iterator[None]:
    """On SIGTERM (a task killed from Airflow), stop the workers, then defer to the old handler."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum: int, frame: Any) -> None:
        if attempt_ref[0] is not None:
            attempt_ref[0].stop()
        if callable(previous):
            previous(signum, frame)
        else:
            raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def launch(spec: LaunchSpec, log: Callable[[str], None] | None = None) -> int:
    """Run attempts until one succeeds.

    Args:
        spec: Command, roles and limits.
        log: Receives every output line (prefixed ``[<type>:<index>]``) and launcher
            messages; defaults to the ``trainyard.training`` logger.

    Returns:
        The number of attempts used.

    Raises:
        TrainingError: NaN loss or bad input (at once), or every attempt failed (the
            message lists each attempt's reason).
    """
    emit = log or logger.info
    failures: list[str] = []
    current: list[_Attempt | None] = [None]
    with _sigterm_stops(current):
        for attempt in range(1, spec.max_attempts + 1):
            run = _Attempt(spec, attempt, emit)
            current[0] = run
            try:
                run.start()
                run.wait()
                emit(f"attempt {attempt}: training finished")
                return attempt
            except _NonRetryable as e:
                raise TrainingError(str(e)) from None
            except TrainingError as e:
                failures.append(f"attempt {attempt}: {e}")
                emit(f"attempt {attempt} failed: {e}; stopping every task")
            finally:
                run.stop()
                current[0] = None
    raise TrainingError(
        f"training failed after {spec.max_attempts} attempt(s):\n  " + "\n  ".join(failures)
    )


def run_training(
    pipeline: Any,
    snapshot_dir: Path,
    output_dir: Path,
    params: Any,
    run_id: str,
    log: Callable[[str], None] | None = None,
    *,
    env: dict[str, str] | None = None,
) -> TrainResult:
    """Train ``pipeline``'s model on a snapshot with local worker processes.

    Args:
        pipeline: The ``PipelineConfig`` (its ``dataset`` names the contract).
        snapshot_dir: The validated snapshot to train on.
        output_dir: Receives ``model/``, ``metrics.json``, ``history.json`` (chief only).
        params: ``TrainingConfig`` (strategy, workers, epochs, limits, ...).
        run_id: Names the checkpoint folder ``<checkpoints_root>/<pipeline>/<run_id>``;
            re-running the same ``run_id`` resumes from its checkpoint.
        log: Line sink (the Airflow task log); defaults to python logging.
        env: Extra environment for the workers (tests: ``TRAINYARD_FAULT``).

    Returns:
        The result, read back from what the chief wrote.

    Raises:
        TrainingError: See :func:`launch`; also if the chief reported success but wrote
            no model.
        ConfigError: Unknown strategy or no parameter server for ``parameter_server``.
    """
    from trainyard.settings import get_settings

    settings = get_settings()
    contract = settings.contracts_dir / f"{pipeline.dataset}.yaml"
    checkpoint_dir = settings.checkpoints_root / pipeline.name / run_id
    output_dir = Path(output_dir)
    roles = cluster_roles(params.strategy, params.workers, params.parameter_servers)
    worker_args = [
        "--snapshot-dir", str(snapshot_dir),
        "--contract", str(contract),
        "--model", params.model,
        "--strategy", params.strategy,
        "--epochs", str(params.epochs),
        "--batch-size", str(params.batch_size),
        "--learning-rate", repr(params.learning_rate),
        "--checkpoint-dir", str(checkpoint_dir),
        "--output-dir", str(output_dir),
        "--steps-per-execution", str(params.steps_per_execution),
        "--seed", str(params.seed),
    ]  # fmt: skip
    spec = LaunchSpec(
        worker_args=worker_args,
        roles=roles,
        start_deadline_s=params.start_deadline_s,
        attempt_timeout_s=params.attempt_timeout_s,
        max_attempts=params.max_attempts,
        env=dict(env or {}),
        success_roles=("chief",) if params.strategy == "parameter_server" else ("worker",),
    )
    t0 = time.monotonic()
    attempts = launch(spec, log)
    seconds = time.monotonic() - t0
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
        tf_config_roles=[f"{t}:{i}" for t, i in roles],
    )
