"""DAG integrity, per DAG file, the way Airflow tests its own examples.

Each file is parsed in a fresh interpreter: it must import, yield DAGs, issue no SQL, look
up no connection or variable, import none of the heavy libraries, and build the DAGs they
declare. How long a parse takes is measured in benchmarks/dag_parse.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DAG_FILES = sorted((ROOT / "dags").glob("*.py"))


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join([str(ROOT / "plugins"), str(ROOT)]),
        AIRFLOW__CORE__DAGS_FOLDER=str(ROOT / "dags"),
        AIRFLOW__CORE__PLUGINS_FOLDER=str(ROOT / "plugins"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__SECRETS__BACKEND="tests.dags.raising_secrets.RaisingSecretsBackend",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="sqlite:////nonexistent/dir/airflow.db",
        TRAINYARD_PROJECT_DIR=str(ROOT),
    )
    return env


def _probe(path: Path) -> dict:
    # The first run warms the bytecode cache; the budget applies to a warm parse, as in
    # a long-running dag-processor.
    runs = []
    for _ in range(2):
        proc = subprocess.run(
            [sys.executable, str(Path(__file__).with_name("parse_probe.py")), str(path)],
            capture_output=True,
            text=True,
            env=_env(),
            cwd=ROOT,
            timeout=120,
        )
        assert proc.returncode == 0, f"{path.name} failed to parse:\n{proc.stderr[-3000:]}"
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return runs[-1]


@pytest.fixture(scope="module", params=DAG_FILES, ids=[p.name for p in DAG_FILES])
def probe(request: pytest.FixtureRequest) -> dict:
    return _probe(request.param)


def test_there_are_dag_files() -> None:
    assert DAG_FILES, "no DAG files under dags/"


def test_yields_dags(probe: dict) -> None:
    assert probe["dags"], "the DAG file defines no DAG"
    for dag_id, task_ids in probe["dags"].items():
        assert task_ids, f"{dag_id} has no tasks"


def test_no_sql_at_parse(probe: dict) -> None:
    assert probe["sql_statements"] == []


def test_no_heavy_imports_at_parse(probe: dict) -> None:
    assert probe["heavy_modules"] == []
