"""What a test module may start: its own Airflow scheduler, or a training from scratch.

Both are the suite's most expensive things (a standalone costs about a minute to start
and stop, a training tens of seconds to minutes), so new tests share them instead: the
scheduler scenarios run on the one shared standalone (tests/e2e/scheduler/, the
``scheduler`` fixture), and a test whose subject comes after training checks the one
shared run of the digits DAG (the ``digits_run`` fixture). A module that must start its
own is named below with the reason.

How it is checked (``tests/conftest.py``): while each test runs, a thread looks at the
processes under pytest every half second. An ``airflow standalone`` or ``airflow
scheduler`` counts as a scheduler, a ``python -m trainyard worker`` that has loaded
TensorFlow as a training, a Chromium as a browser; each is attributed to the running
test, unless it or a parent process carries :data:`SHARED_ENV` in its environment (the
session fixtures set it: sharing them is the point). A test of a module that is not
allowed what it started fails at its teardown, naming this file; so does one that
started Chromium without the ``browser`` marker (or has it and started none), and a unit
or DAG test that started any of them.
"""

from __future__ import annotations

import re
import threading
from collections import defaultdict
from collections.abc import Iterable

SHARED_ENV = "TRAINYARD_TEST_SHARED"
"""In the environment of a process a session fixture starts for every test to share."""

SCHEDULER_ALLOWED: dict[str, str] = {
    "tests/e2e/test_standalone_watch.py": "kills the scheduler on purpose",
    "tests/integration/test_standalone_lifecycle.py": "a stand-in `airflow standalone` "
    "(a script that ignores SIGTERM) for the wrapper's stop",
}
"""Modules that start an Airflow scheduler of their own, and why."""

TRAINING_ALLOWED: dict[str, str] = {
    # the real end-to-end runs, one per layer
    "tests/e2e/test_pipeline_e2e.py": "the digits DAG end to end: multi-worker TF, gate, deploy",
    "tests/e2e/test_training_strategies.py": "both strategies, the parameter server included",
    "tests/e2e/test_regression_e2e.py": "a regressor trains and gates on RMSE",
    "tests/e2e/test_image_classes_e2e.py": "an image dataset of another size trains",
    "tests/e2e/test_daily_window_e2e.py": "trains on a window of days, mails each outcome",
    "tests/e2e/test_missing_partition_e2e.py": "a waited-for day trains once it arrives",
    "tests/e2e/test_cli_run_range.py": "a CLI backfill trains once on the whole window",
    "tests/e2e/test_mlflow_tracking.py": "trainings mirrored to MLflow as they happen",
    "tests/e2e/test_kubernetes_runner.py": "both pipelines on the kubernetes runner (localkube)",
    "tests/e2e/test_churn_e2e.py": "categories and missing values trained into the model",
    "tests/e2e/test_cached_training.py": "unchanged runs reuse, forced retrains reproduce",
    # faults injected into training itself
    "tests/reliability/test_training_faults.py": "kills, NaN and deadlines inside training",
    "tests/reliability/test_train_sigterm.py": "SIGTERM of a running training",
    "tests/reliability/test_interrupt.py": "Ctrl-C of make run and trainyard run mid-training",
    "tests/reliability/test_worker_loopback.py": "what a running worker listens on",
    # `trainyard run` over a range, whose last day trains
    "tests/integration/test_missing_partitions.py": "a range run trains once, on its last day",
}
"""Modules that train a model from scratch, and why."""

_SCHEDULER = re.compile(r"(^|[/ ])airflow (standalone|scheduler)\b")
_TRAINING = re.compile(r"(^|[ ])-m trainyard worker\b")
_BROWSER = re.compile(r"(^|/)(chromium|chrome)$")


def classify(cmdline: Iterable[str]) -> str | None:
    """``"scheduler"``, ``"training"``, ``"browser"`` or None for a process's command line."""
    cmdline = list(cmdline)
    if cmdline and _BROWSER.search(cmdline[0]):
        return "browser"
    line = " ".join(cmdline)
    if _SCHEDULER.search(line):
        return "scheduler"
    if _TRAINING.search(line):
        return "training"
    return None


def violations(module: str, kinds: Iterable[str]) -> list[str]:
    """What ``module`` (a path from the project root) started without being allowed to."""
    allowed = {"scheduler": SCHEDULER_ALLOWED, "training": TRAINING_ALLOWED}
    share = {
        "scheduler": "the shared standalone (the scheduler fixture, tests/support/scheduler.py)",
        "training": "the shared trained run (the digits_run fixture, tests/support/digits_run.py)",
    }
    out = []
    for kind in sorted(set(kinds)):
        if module not in allowed[kind]:
            what = "an Airflow scheduler" if kind == "scheduler" else "a training from scratch"
            out.append(
                f"{module} started {what} of its own: use {share[kind]}, or add the module "
                f"with its reason to {kind.upper()}_ALLOWED in tests/support/guard.py"
            )
    return out


class Watcher:
    """Polls pytest's descendant processes and records what each test started."""

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self.current: str | None = None
        self.seen: dict[str, set[str]] = defaultdict(set)
        self._known: set[tuple[int, float]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-guard", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def poll(self) -> None:
        """One look at the processes under pytest (also called at each test's end)."""
        import time

        import psutil

        test = self.current
        if test is None:
            return
        try:
            children = psutil.Process().children(recursive=True)
        except psutil.Error:
            return
        now = time.time()
        for proc in children:
            try:
                key = (proc.pid, proc.create_time())
                if key in self._known:
                    continue
                kind = classify(proc.cmdline())
                if kind == "training" and not _loaded_tensorflow(proc.pid):
                    continue  # not yet, or never: a usage error exits before it trains
                if kind is None:
                    # a fork shows its parent's command line until it execs: look again
                    # until it is old enough to have done so
                    if now - key[1] > 2:
                        self._known.add(key)
                    continue
                self._known.add(key)
                if kind == "browser" or not _shared(proc):
                    self.seen[test].add(kind)
            except psutil.Error:
                continue

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()


def _loaded_tensorflow(pid: int) -> bool:
    """Whether the process has TensorFlow's library mapped (it trains, or is about to)."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as maps:
            return any(b"libtensorflow" in line for line in maps)
    except OSError:
        return False


def _shared(proc: object) -> bool:
    """Whether ``proc`` or one of its ancestors below pytest came from a session fixture."""
    import os

    import psutil

    me = os.getpid()
    while proc is not None and proc.pid != me:  # type: ignore[attr-defined]
        try:
            if SHARED_ENV in proc.environ():  # type: ignore[attr-defined]
                return True
            proc = proc.parent()  # type: ignore[attr-defined]
        except psutil.Error:
            return False
    return False
