"""``python -m trainyard <command> ...``: one entry point for every step and tool.

The pipeline steps come from the step table (:data:`trainyard.steps.STEPS`), so every
command a pod runs is a command of this CLI; the tools live with their stage as a
``cli_main(argv) -> int`` function, imported only when that command runs, so ``--help``
and unrelated commands stay fast.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import logging
import os
import sys
import threading
from typing import Any, NoReturn

from trainyard.errors import TrainyardError
from trainyard.lognoise import quiet_libraries

TOOLS: dict[str, tuple[str, str, str]] = {
    "worker": (
        "trainyard.training.worker.main",
        "main",
        "One training worker (the container of every training Job's pod).",
    ),
    "run": ("trainyard.cli.run", "run_cli_main", "Run every step of a pipeline, in order."),
    "dag-test": (
        "trainyard.orchestration.dagtest",
        "cli_main",
        "Run a pipeline's DAG once under Airflow, as make run does (one at a time, a log of "
        "its own, Ctrl-C stops it for good).",
    ),
    "snapshots": (
        "trainyard.cli.snapshots",
        "cli_main",
        "list | show | verify | mirror | gc dataset snapshots.",
    ),
    "contracts": (
        "trainyard.cli.contracts",
        "cli_main",
        "check data contracts; export and import them as ODCS (Open Data Contract Standard).",
    ),
    "pipelines": (
        "trainyard.pods",
        "pipelines_main",
        "check pipeline configs (schema, models, contracts, metrics); print their JSON schema.",
    ),
    "models": (
        "trainyard.cli.models",
        "models_main",
        "list, show, promote, roll back, approve or reject versions; their history; serve "
        "the champion (serving follows it).",
    ),
    "tensorboard": (
        "trainyard.training.tensorboard",
        "cli_main",
        "Open a pipeline's training curves in TensorBoard (every version, runs in progress).",
    ),
    "serve": ("trainyard.serving.server", "cli_main", "Run the TF-Serving-compatible server."),
    "score-stream": (
        "trainyard.streaming.score_stream",
        "cli_main",
        "Score a pipeline's input stream with the served champion (scoring.stream).",
    ),
    "render": ("trainyard.pods", "cli_main", "Render a pipeline's Kubernetes objects as YAML."),
    "check-manifests": (
        "trainyard.k8s.manifests",
        "cli_main",
        "Check the cluster's manifests (deploy/k8s) against the schemas and the profile.",
    ),
    "pools": (
        "trainyard.k8s.profile",
        "pools_main",
        "The Airflow pools training needs (per GPU tier on a cluster), for pools import.",
    ),
}
"""Tools: command → (module, function, help)."""


def _steps() -> Any:
    from trainyard import steps

    return steps


def commands() -> dict[str, str]:
    """Every command with its one-line help: the steps (table order), then the tools."""
    table = {name: step.help for name, step in _steps().STEPS.items()}
    return {**table, **{name: tool[2] for name, tool in TOOLS.items()}}


def _usage() -> str:
    rows = commands()
    width = max(len(c) for c in rows)
    body = "\n".join(f"  {c.ljust(width)}  {h}" for c, h in rows.items())
    return f"usage: python -m trainyard <command> [args]\n\ncommands:\n{body}\n"


def parse_command(argv: list[str]) -> dict[str, Any]:
    """Parse a command line as :func:`main` would, without running it.

    Used to prove that every rendered pod's command line is accepted by this CLI.

    Args:
        argv: Arguments without the program name (``["validate", "--pipeline", ...]``).

    Returns:
        The parsed arguments.

    Raises:
        SystemExit: With code 2 on an unknown command or a usage error, as the CLI would.
    """
    if not argv:
        raise SystemExit(2)
    command, rest = argv[0], argv[1:]
    steps = _steps()
    if command in steps.STEPS:
        return steps.STEPS[command].parse(rest)
    if command == "worker":
        from trainyard.training.worker.main import parse_args

        return vars(parse_args(rest))
    raise SystemExit(2)


def main(argv: list[str] | None = None) -> int:
    """Dispatch to a step of the table or a tool's ``cli_main``.

    Args:
        argv: Arguments without the program name (defaults to ``sys.argv[1:]``).

    Returns:
        The process exit code: 0 success, 1 a failure a retry may fix, 2 usage, 3 a
        failure no retry fixes (steps and tools alike), 130 interrupted (Ctrl-C).
    """
    os.umask(0o077)  # what a step or tool writes (snapshots, models, logs) is its owner's only
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        sys.stdout.write(_usage())
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command not in commands():
        sys.stderr.write(f"unknown command {command!r}\n\n{_usage()}")
        return 2
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    quiet_libraries()
    steps = _steps()
    if command in steps.STEPS:
        return steps.run_step(command, rest)
    module, function, _ = TOOLS[command]
    try:
        return int(getattr(importlib.import_module(module), function)(rest))
    except TrainyardError as e:
        sys.stderr.write(f"trainyard {command}: {type(e).__name__}: {e}\n")
        return steps.EXIT_DETERMINISTIC if steps.deterministic(e) else steps.EXIT_FAILED
    except KeyboardInterrupt:
        from trainyard.errors import INTERRUPTED

        sys.stderr.write(f"trainyard {command}: {INTERRUPTED}\n")
        return steps.EXIT_INTERRUPTED


def is_pod_command(command: str) -> bool:
    """Whether ``command`` is what a pod runs: a step of the table or a training worker.

    Such a process writes its results durably before it returns, so it ends by
    :func:`finish`; the tools exit normally.
    """
    return command == "worker" or command in _steps().STEPS


def finish(code: int) -> NoReturn:
    """End a pod's process (a step, a training worker) as an exit would, minus the teardown.

    Python's finalisation frees every imported module's objects one by one: after
    TensorFlow or Great Expectations were imported that took 3-4 s on two busy cores
    (0.05-0.1 s without it), longer than many steps' work. Everything else a normal exit
    does is done first: non-daemon threads are joined, ``atexit`` handlers run (logging
    flushes its handlers, ``weakref.finalize`` removes temporary directories), stdout and
    stderr are flushed. The steps write their results with ``atomic_write_*`` (closed and
    synced), so no buffer is left behind.

    Args:
        code: The exit code.
    """
    main_thread = threading.main_thread()
    for thread in threading.enumerate():
        if thread is not main_thread and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or gone: nothing to flush
            stream.flush()
    os._exit(code)
