"""The suite's guard (tests/support/guard.py): what counts as a scheduler, a training, a
browser, and the allow-lists it checks modules against."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import guard

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("cmdline", "kind"),
    [
        (["/venv/bin/python3.11", "/venv/bin/airflow", "standalone"], "scheduler"),
        (["/venv/bin/python3.11", "/venv/bin/airflow", "scheduler"], "scheduler"),
        (["airflow scheduler -- DagFileProcessorManager"], "scheduler"),
        (["/venv/bin/python3.11", "-m", "trainyard", "worker", "--epochs", "2"], "training"),
        (["/usr/lib/chromium/chromium", "--type=renderer"], "browser"),
        # what the guard must not count
        (["/venv/bin/python3.11", "-m", "trainyard.standalone", "run"], None),
        (["/venv/bin/python3.11", "/venv/bin/airflow", "dags", "test", "x"], None),
        (["/venv/bin/python3.11", "/venv/bin/airflow", "api-server"], None),
        (["/venv/bin/python3.11", "-m", "trainyard", "train", "--pipeline", "d"], None),
        (["/venv/bin/python3.11", "-c", "print('-m trainyard worker')"], None),
    ],
)
def test_processes_are_classified_by_their_command_line(cmdline: list[str], kind: str) -> None:
    assert guard.classify(cmdline) == kind


def test_every_allowed_module_exists() -> None:
    for module in [*guard.SCHEDULER_ALLOWED, *guard.TRAINING_ALLOWED]:
        assert (ROOT / module).is_file(), f"{module} is allowed but does not exist"


def test_a_module_off_the_lists_is_named_with_the_fixture_to_use() -> None:
    assert guard.violations("tests/e2e/test_pipeline_e2e.py", {"training"}) == []
    (problem,) = guard.violations("tests/e2e/test_new.py", {"scheduler", "browser"} - {"browser"})
    assert "tests/e2e/test_new.py started an Airflow scheduler" in problem
    assert "tests/support/scheduler.py" in problem and "SCHEDULER_ALLOWED" in problem
    (problem,) = guard.violations("tests/integration/test_new.py", {"training"})
    assert "digits_run" in problem and "TRAINING_ALLOWED" in problem
