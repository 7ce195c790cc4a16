"""The scheduler scenarios share one standalone (``tests/support/scheduler.py``), started at
the first test that needs it and stopped after this package's last test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.scheduler import Scheduler, shared_standalone


@pytest.fixture(scope="package")
def scheduler(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scheduler]:
    with shared_standalone(tmp_path_factory.mktemp("scheduler")) as running:
        yield running
