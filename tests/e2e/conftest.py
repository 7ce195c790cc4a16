"""The e2e modules share one real run of the digits DAG (``tests/support/digits_run.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.digits_run import DigitsRun, digits_dags_test


@pytest.fixture(scope="session")
def digits_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DigitsRun]:
    with digits_dags_test(tmp_path_factory.mktemp("digits-run")) as run:
        yield run
