"""The suite's tiers, its xdist groups, its guard, and an isolated volume root per test.

Tiers, by directory (``make test-fast`` runs the first two, ``make test`` all of them):

* ``tests/unit``, ``tests/dags``: no server, no Airflow scheduler, no training, no browser.
* ``tests/integration``: one real component each (PostgreSQL, MLflow, a model server, an
  API server, compilers, ``trainyard run`` on small data).
* ``tests/reliability``: faults injected into real processes.
* ``tests/e2e``: whole pipelines through real Airflow, TensorFlow and serving; the
  scheduler scenarios share one standalone (``tests/e2e/scheduler``).

Under ``pytest -n 2`` (``make test``) a module of ``tests/e2e``, ``tests/integration`` or
``tests/reliability`` stays on one worker (its module fixtures are built once), and so do
the shared standalone's scenarios and the modules that check the shared digits run
(their session fixtures are built once); unit and DAG tests spread over both. At most
two trainings run at once, one per worker: the deadlines of the e2e and training tests
(60 to 600 s for a worker to start, 480 s for a run) leave room for that.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import guard

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TRAINYARD_PROJECT_DIR", str(ROOT))

pytest_plugins = ["tests.support.fixtures"]

SCHEDULER_GROUP = "tests/e2e/scheduler"
"""The shared standalone's scenarios: one scheduler, one training pool, one after another."""

DIGITS_RUN_GROUP = "digits_run"
"""The modules that check the one shared run of the digits DAG (trained once per worker)."""

DIGITS_RUN_MODULES = {"tests/e2e/test_lineage.py", "tests/e2e/test_pipeline_e2e.py"}

HEAVY = {
    "tests/e2e/test_daily_window_e2e.py": 250,
    "tests/e2e/test_kubernetes_runner.py": 202,
    "tests/reliability/test_serving_hardening.py": 164,
    "tests/reliability/test_training_faults.py": 150,
    "tests/e2e/test_cached_training.py": 130,
    "tests/reliability/test_interrupt.py": 125,
    "tests/e2e/test_mlflow_tracking.py": 98,
    "tests/e2e/test_regression_e2e.py": 87,
    "tests/reliability/test_stream_scoring.py": 84,
    "tests/e2e/test_missing_partition_e2e.py": 72,
    "tests/e2e/test_training_strategies.py": 68,
    "tests/integration/test_missing_partitions.py": 64,
    "tests/integration/test_tracking.py": 64,
    "tests/e2e/test_image_classes_e2e.py": 53,
    "tests/e2e/test_cli_run_range.py": 48,
    "tests/e2e/test_standalone_watch.py": 48,
    "tests/reliability/test_train_sigterm.py": 47,
    "tests/integration/test_registry.py": 45,
    "tests/e2e/test_churn_e2e.py": 42,
    "tests/integration/test_serving_server.py": 41,
}
"""The modules outside those groups that take 40 s or more, by their seconds in a fresh
clone's ``make test`` (2026-11-28, two cores): handed out longest first, so that no long
module starts last."""


def _module(item: pytest.Item) -> str:
    return Path(str(item.path)).relative_to(ROOT).as_posix()


def xdist_group(nodeid: str) -> str:
    """The group a test runs in under xdist: a group's tests all run on one worker."""
    module = nodeid.split("::", 1)[0]
    if module.startswith(SCHEDULER_GROUP + "/"):
        return SCHEDULER_GROUP
    if module in DIGITS_RUN_MODULES:
        return DIGITS_RUN_GROUP
    if module.startswith(("tests/e2e/", "tests/integration/", "tests/reliability/")):
        return module  # its module fixtures are built once
    return nodeid


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """xdist's load-by-scope scheduling, the scope being :func:`xdist_group`.

    Not ``xdist_group`` markers: pytest-xdist 3.8's ``--dist loadgroup`` renames a
    grouped test's ``item._nodeid``, which pytest 9 no longer reads, so it groups nothing.
    The longest groups are handed out first (the shared standalone's, the shared run's,
    then :data:`HEAVY`, longest first), then the rest, most tests first: a worker takes
    the next group when it has two tests or fewer left.
    """
    from xdist.scheduler import LoadScopeScheduling

    first = {SCHEDULER_GROUP: 850, DIGITS_RUN_GROUP: 190, **HEAVY}

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid.split("@", 1)[0])

        def _assign_work_unit(self, node: Any) -> None:
            scope = max(self.workqueue, key=lambda s: first.get(s, 0))
            self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return GroupScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse a test under tests/e2e without the ``e2e`` marker."""
    unmarked = [
        item.nodeid
        for item in items
        if _module(item).startswith("tests/e2e/") and item.get_closest_marker("e2e") is None
    ]
    if unmarked:
        raise pytest.UsageError(f"tests under tests/e2e without the e2e marker: {unmarked}")


# ----------------------------------------------------------------------------- the guard

_watcher = guard.Watcher()


def pytest_sessionstart(session: pytest.Session) -> None:
    _watcher.start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    _watcher.stop()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _watcher.current = item.nodeid


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """At a test's last report: what it started must match its module and its markers."""
    report = yield
    if call.when == "call":
        item.stash[_passed] = report.passed
    if call.when != "teardown":
        return report
    _watcher.poll()
    started = _watcher.seen.pop(item.nodeid, set())
    _watcher.current = None
    module = _module(item)
    problems = guard.violations(module, started - {"browser"})
    if module.startswith(("tests/unit/", "tests/dags/")):
        problems += [
            f"{module} started {kind}: a process-starting test belongs in tests/integration"
            for kind in sorted(started & {"scheduler", "training", "browser"})
        ]
    browser = item.get_closest_marker("browser") is not None
    if "browser" in started and not browser:
        problems.append(f"{item.nodeid} started Chromium: mark it browser")
    if browser and item.stash.get(_passed, False) and "browser" not in started:
        problems.append(f"{item.nodeid} is marked browser but started no Chromium")
    if problems and report.passed:
        report.outcome = "failed"
        report.longrepr = "tests/support/guard.py:\n" + "\n".join(problems)
    return report


_passed = pytest.StashKey[bool]()


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(autouse=True)
def _no_resource_tracker_left() -> Iterator[None]:
    """Stop the multiprocessing resource tracker a test started (test_registry's concurrent
    registrations do): it would outlive the test as a child of the xdist worker, and the
    tests that check that a launch leaves no child process behind would count it."""
    yield
    from multiprocessing import resource_tracker

    if resource_tracker._resource_tracker._pid is not None:
        resource_tracker._resource_tracker._stop()


@pytest.fixture
def volume_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh volume root for one test (``TRAINYARD_VOLUME_ROOT``), and the shipped
    pipelines served on a free port of the test's own (``TRAINYARD_PIPELINES_DIR``).

    Found in a fresh clone where ``make run`` had just run (as the README says): a test's
    ``summary`` asked the model server that ``make run`` left on the shipped port, 8501,
    and printed its answer. A model server started under the root (``models promote``
    starts one, detached, to serve the champion) is stopped afterwards, so none outlives
    its test and holds the port.
    """
    import yaml

    from tests.support.ports import free_port

    root = tmp_path / "volumes"
    root.mkdir()
    monkeypatch.setenv("TRAINYARD_VOLUME_ROOT", str(root))
    pipelines, port = tmp_path / "shipped-pipelines", free_port()
    pipelines.mkdir()
    for shipped in sorted((ROOT / "dags" / "pipelines").glob("*.yaml")):
        raw = yaml.safe_load(shipped.read_text())
        raw["serving"] = {**raw.get("serving", {}), "port": port}
        (pipelines / shipped.name).write_text(yaml.safe_dump(raw, sort_keys=False))
    monkeypatch.setenv("TRAINYARD_PIPELINES_DIR", str(pipelines))
    yield root
    if (root / "_serving").is_dir():
        from trainyard.serving.deploy import stop_local_server

        stop_local_server(root / "_serving")
