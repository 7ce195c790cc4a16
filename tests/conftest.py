"""The suite's tiers, its xdist groups, its guard, and an isolated volume root per test.

Tiers, by directory (``make test-fast`` runs the first two, ``make test`` all of them):

* ``tests/unit``, ``tests/dags``: no server, no Airflow scheduler, no training, no browser.
* ``tests/integration``: one real component each (PostgreSQL, MLflow, a model server, an
  API server, compilers, ``trainyard run`` on small data).
* ``tests/reliability``: faults injected into real processes.
* ``tests/e2e``: whole pipelines through real Airflow, TensorFlow and serving; the
  scheduler scenarios share one standalone (``tests/e2e/scheduler``).

Under ``pytest -n 2`` (``make test``) the two e2e groups below each run on one worker, one
test after another: their deadlines assume a training does not share its core with a
second one. A module of ``tests/integration`` or ``tests/reliability`` stays on one worker
(its module fixtures are built once); unit and DAG tests spread over both.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import guard

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TRAINYARD_PROJECT_DIR", str(ROOT))

pytest_plugins = ["tests.support.fixtures"]

SCHEDULER_GROUP = "scheduler"
"""The shared standalone's scenarios (one scheduler, one training pool)."""

E2E_GROUP = "e2e"
"""Whole DAG runs without a scheduler, and trainings with faults injected."""

E2E_RELIABILITY = {
    "tests/reliability/test_training_faults.py",
    "tests/reliability/test_train_sigterm.py",
    "tests/reliability/test_worker_loopback.py",
}
"""Reliability modules that train with several TF workers and tight start deadlines."""


def _module(item: pytest.Item) -> str:
    return Path(str(item.path)).relative_to(ROOT).as_posix()


def xdist_group(nodeid: str) -> str:
    """The group a test runs in under xdist: a group's tests all run on one worker."""
    module = nodeid.split("::", 1)[0]
    if module.startswith("tests/e2e/scheduler/"):
        return SCHEDULER_GROUP
    if module.startswith("tests/e2e/") or module in E2E_RELIABILITY:
        return E2E_GROUP
    if module.startswith(("tests/integration/", "tests/reliability/")):
        return module
    return nodeid


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """xdist's load-by-scope scheduling, the scope being :func:`xdist_group`.

    Not ``xdist_group`` markers: pytest-xdist 3.8's ``--dist loadgroup`` renames a
    grouped test's ``item._nodeid``, which pytest 9 no longer reads, so it groups nothing.
    Largest groups are handed out first.
    """
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid.split("@", 1)[0])

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


@pytest.fixture
def volume_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh volume root for one test (``TRAINYARD_VOLUME_ROOT``).

    A model server started under it (``models promote`` starts one, detached, to serve
    the champion) is stopped afterwards, so none outlives its test and holds the port.
    """
    root = tmp_path / "volumes"
    root.mkdir()
    monkeypatch.setenv("TRAINYARD_VOLUME_ROOT", str(root))
    yield root
    if (root / "_serving").is_dir():
        from trainyard.serving.deploy import stop_local_server

        stop_local_server(root / "_serving")
