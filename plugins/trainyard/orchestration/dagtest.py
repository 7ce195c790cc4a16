"""``make run``: one run of a pipeline's DAG under Airflow (``airflow dags test``), from a shell.

* One at a time per pipeline, with ``trainyard run`` (the same lock,
  :func:`trainyard.cli.run.the_only_run`): a second is refused at once, naming the first.
* Each run writes its own log, ``dags_test/<pipeline>-<time>.log`` next to ``AIRFLOW_HOME``
  (``.trainyard/`` for ``make run``); ``last_dags_test.log`` links to the newest.
* Ctrl-C (SIGINT) or SIGTERM stops the run: the run's stop file appears (the local runner
  then starts no step, and a step that ends fails for good: ``interrupted by the user``, no
  retry, :func:`.runners.recording_failure`), Airflow's process gets SIGINT and every
  step process under it SIGTERM (each runs in a session of its own, as its pod would).
  If Airflow has not ended within :data:`STOP_GRACE_S`, it and every process under it are
  killed and the run is marked failed here. Only then does one line say what the run left
  (nothing registered or deployed, or what was), and the exit code is 130.
* A run that succeeds prints its summary, what serves asked from the model server.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from trainyard import argtypes
from trainyard.errors import INTERRUPTED, ConfigError

STOP_GRACE_S = 5.0
"""How long Airflow gets to end an interrupted run itself before its processes are killed."""


def _preload_airflow() -> None:
    """Import what marking a run failed needs, while the run goes on.

    After a Ctrl-C the one line then comes within seconds, not after Airflow's import time.
    """
    import logging

    for name in ("airflow", "alembic", "sqlalchemy"):
        logging.getLogger(name).setLevel(logging.WARNING)
    with contextlib.suppress(Exception):
        import airflow.models.dagrun
        import airflow.utils.session  # noqa: F401


def logs_dir() -> Path:
    """Where each ``make run`` writes its log: ``dags_test/`` beside ``AIRFLOW_HOME``."""
    from trainyard.settings import get_settings

    home = os.environ.get("AIRFLOW_HOME")
    root = Path(home).parent if home else get_settings().project_dir / ".trainyard"
    return root / "dags_test"


def _tail(path: Path, lines: int = 80) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def mark_interrupted(dag_id: str, since: dt.datetime) -> tuple[str | None, bool]:
    """Mark the DAG's run started since ``since`` failed if it still runs (Airflow was killed).

    A task still running is marked failed, one that never started ``upstream_failed``, and
    the run's note says it was interrupted (unless a person wrote one).

    Returns:
        ``(run id or None when no such run, whether it had to be marked here)``.
    """
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState, State, TaskInstanceState
    from sqlalchemy import select

    from trainyard.orchestration.ui import NOTE_MARK

    with create_session() as session:
        run = session.scalars(
            select(DagRun)
            .where(DagRun.dag_id == dag_id, DagRun.run_after >= since)
            .order_by(DagRun.id.desc())
            .limit(1)
        ).first()
        if run is None:
            return None, False
        marked = run.state not in State.finished_dr_states
        if marked:
            for ti in run.get_task_instances(session=session):
                if ti.state == TaskInstanceState.RUNNING:
                    ti.state = TaskInstanceState.FAILED
                elif ti.state not in State.finished:  # never started: its upstream failed
                    ti.state = TaskInstanceState.UPSTREAM_FAILED
            run.set_state(DagRunState.FAILED)
        if not run.note:
            run.note = f"{NOTE_MARK}{INTERRUPTED}"
        session.commit()
        return run.run_id, marked


def cli_main(argv: list[str]) -> int:
    """``python -m trainyard dag-test --pipeline P [--conf JSON]`` (what ``make run`` runs)."""
    from trainyard.cli.run import interrupted_line, registry_state, the_only_run
    from trainyard.config import load_pipeline
    from trainyard.layout import Layout
    from trainyard.runs import format_summary, record_failure, since
    from trainyard.serving.status import server_answer
    from trainyard.settings import get_settings

    p = argtypes.ArgumentParser(
        prog="python -m trainyard dag-test",
        description="Run a pipeline's DAG once under Airflow (airflow dags test), as make run "
        "does: one at a time, its own log, Ctrl-C stops it for good.",
    )
    p.add_argument("--pipeline", required=True)
    p.add_argument("--conf", type=json.loads, default=None, help="the run's conf (JSON)")
    args = p.parse_args(argv)
    try:
        cfg = load_pipeline(args.pipeline)
    except ConfigError as e:
        sys.stderr.write(f"make run: {e}\n")
        return 3
    dag_id = f"trainyard_{cfg.name}"
    folder = logs_dir()
    folder.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    log_path = folder / f"{cfg.name}-{stamp}-{os.getpid()}.log"
    what = (
        f"`make run` (airflow dags test {dag_id}), pid {{pid}} since {{since}}, log "
        f"{_shown(log_path)}"
    )
    with the_only_run(cfg.name, what) as holder:
        if holder is not None:
            sys.stderr.write(
                f"make run: pipeline {cfg.name!r} is being run already ({holder}): wait for it "
                "to end; nothing was run\n"
            )
            return 1
        before = registry_state(cfg.name)
        started = dt.datetime.now(dt.UTC)
        argv_test = ["airflow", "dags", "test", dag_id]
        if args.conf is not None:
            argv_test += ["--conf", json.dumps(args.conf)]
        stop_file = folder / f".stop-{os.getpid()}"
        stop_file.unlink(missing_ok=True)
        with log_path.open("wb") as out:
            child = subprocess.Popen(
                argv_test,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # the terminal's Ctrl-C reaches Airflow through here
                env={**os.environ, "TRAINYARD_STOP_FILE": str(stop_file)},
                # SIGINT as a terminal gives it, even when this ran with it ignored (a shell
                # ignores it for a background job): Airflow must see the interrupt
                preexec_fn=_default_sigint,
            )
        _link_last(folder.parent / "last_dags_test.log", log_path)
        preload = threading.Thread(target=_preload_airflow, name="preload", daemon=True)
        preload.start()
        runs = Layout(get_settings().volume_root).runs(cfg.name)
        try:
            code, interrupted = _wait(child, lambda t: _interrupt_recorded(runs, t), stop_file)
        finally:
            stop_file.unlink(missing_ok=True)
    if interrupted:
        run_id, marked = None, False
        preload.join(timeout=10)
        try:
            run_id, marked = mark_interrupted(dag_id, started)
        except Exception as e:  # the database is gone too: say so, the run stays as it was
            sys.stderr.write(f"make run: could not mark the run failed: {e}\n")
        if run_id and marked and not _interrupt_recorded(runs, started.timestamp()):
            record_failure(cfg.name, run_id, "run", INTERRUPTED)
        left = interrupted_line(cfg.name, before)
        sys.stderr.write(
            f"make run: {INTERRUPTED}: run {run_id or '(not started)'} of {dag_id} stopped and "
            f"failed; {left} (log: {_shown(log_path)})\n"
        )
        return 130
    if code != 0:
        sys.stdout.write(_tail(log_path) + "\n")
        sys.stdout.write(f"airflow dags test failed (full log: {_shown(log_path)})\n")
        return 1
    path = Layout(get_settings().volume_root).last_run(cfg.name)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        sys.stdout.write(f"the run recorded no summary ({path}: {e}; log: {log_path})\n")
        return 1
    sys.stdout.write(format_summary(record, server_answer(cfg.name)) + "\n" + since(record))
    return 0


def _shown(path: Path) -> str:
    """A path as a person in the checkout types it (relative when below the cwd)."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _link_last(link: Path, target: Path) -> None:
    """Point ``last_dags_test.log`` at the newest run's log (replacing an older file)."""
    tmp = link.with_name(f".{link.name}.{os.getpid()}")
    try:
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(os.path.relpath(target, link.parent))
        os.replace(tmp, link)
    except OSError:
        tmp.unlink(missing_ok=True)


def _interrupt_recorded(runs: Path, since: float) -> bool:
    """Whether a task of the run recorded its interrupt since ``since`` (epoch seconds).

    That is ``runs/<run>.failed.json``: by then its step's process or its workers are
    stopped.
    """
    try:
        found = [p for p in runs.glob("*.failed.json") if p.stat().st_mtime >= since]
        return any(INTERRUPTED in p.read_text(encoding="utf-8") for p in found)
    except OSError:
        return False


def _wait(
    child: subprocess.Popen[bytes],
    stopped: Any = lambda since: False,
    stop_file: Path | None = None,
) -> tuple[int, bool]:
    """Wait for ``airflow dags test``; on SIGINT or SIGTERM, stop it (see the module doc).

    After the signal, Airflow's process is given :data:`STOP_GRACE_S` to stop the running
    task; once that task recorded the interrupt (``stopped(since)``: its processes are
    gone), what is left is Airflow marking the rest of the run, a second per task level:
    it and every process under it are killed and the run is marked failed here instead.

    Returns:
        Its exit code and whether the run was interrupted.
    """
    received: list[int] = []
    deadline: list[float] = []
    when: list[float] = []

    def stop(signum: int, frame: Any) -> None:
        received.append(signum)
        if len(received) == 1:
            if stop_file is not None:
                stop_file.touch()
            when.append(time.time() - 1)
            deadline.append(time.monotonic() + STOP_GRACE_S)
            _signal_tree(child.pid, signal.SIGINT, signal.SIGTERM)
        else:  # asked twice: no more grace
            _signal_tree(child.pid, signal.SIGKILL, signal.SIGKILL)

    main = threading.current_thread() is threading.main_thread()
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
    for sig in previous:
        signal.signal(sig, stop)
    try:
        while True:
            try:
                return child.wait(timeout=0.2), bool(received)
            except subprocess.TimeoutExpired:
                pass
            if deadline and (time.monotonic() > deadline[0] or stopped(when[0])):
                _signal_tree(child.pid, signal.SIGKILL, signal.SIGKILL)
                return child.wait(), True
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _signal_tree(pid: int, own: int, others: int) -> None:
    """``own`` to the process group of ``pid``; ``others`` to each other group under it.

    The local runner starts each step in a session of its own (as its pod), so a signal to
    Airflow's group alone left a running step to finish, and the line saying what the run
    left was written before it registered or deployed.
    """
    import psutil

    groups: set[int] = set()
    with contextlib.suppress(psutil.Error):
        for proc in psutil.Process(pid).children(recursive=True):
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                groups.add(os.getpgid(proc.pid))
    groups.discard(pid)
    _signal_group(pid, own)
    for pgid in groups:
        _signal_group(pgid, others)
