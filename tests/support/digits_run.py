"""One real ``airflow dags test`` of the digits DAG, shared by the modules that check it.

``tests/e2e/test_pipeline_e2e.py`` checks what the run did (stage, validate, 2 TF workers,
gate, deploy, an HTTP prediction) and goes on from it (a second run, promote and
rollback); ``tests/e2e/test_lineage.py`` checks the OpenLineage events the same run wrote.
Training digits once more for the events alone cost about a minute.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.guard import SHARED_ENV
from tests.support.harness import Project, init_airflow, make_project, openlineage_to_file

OL_NAMESPACE = "trainyard-e2e"
"""The OpenLineage namespace of the shared run's project."""


@dataclass
class DigitsRun:
    """The run's project, its ``airflow dags test`` output, and what it wrote at its end."""

    project: Project
    out: subprocess.CompletedProcess[str]
    events: list[dict[str, Any]]
    last: dict[str, Any]


@contextmanager
def digits_dags_test(tmp: Path) -> Iterator[DigitsRun]:
    """``airflow dags test trainyard_digits`` (3 epochs, the shipped gate) on SQLite in
    ``tmp``, with the OpenLineage provider's file transport on; the model server it started
    is stopped at the end of the block."""
    project = make_project(tmp, {"training": {"epochs": 3}})
    project.env[SHARED_ENV] = "digits_run"  # its training is the one the guard allows all
    events_file = openlineage_to_file(project, OL_NAMESPACE)
    init_airflow(project)
    try:
        out = project.airflow("dags", "test", "trainyard_digits")
        events = [
            json.loads(line)
            for line in (events_file.read_text().splitlines() if events_file.is_file() else [])
            if line
        ]
        last_run = project.volume_root / "_models" / "digits" / "last_run.json"
        last = json.loads(last_run.read_text()) if last_run.is_file() else {}
        yield DigitsRun(project, out, events, last)
    finally:
        project.stop_server()
