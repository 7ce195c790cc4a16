"""DAG integrity, per DAG file, the way Airflow tests its own examples.

Each file is parsed in a fresh interpreter: it must import, yield DAGs, issue no SQL, look
up no connection or variable, import none of the heavy libraries, and parse within budget.
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
PARSE_BUDGET_S = 0.1


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


def test_parse_time_within_budget(probe: dict) -> None:
    per_dag = probe["seconds"] / max(1, len(probe["dags"]))
    assert probe["seconds"] <= PARSE_BUDGET_S * max(1, len(probe["dags"])), (
        f"parse took {probe['seconds']:.3f} s ({per_dag:.3f} s per DAG)"
    )


def test_one_dag_per_pipeline_config(probe: dict) -> None:
    configs = sorted(p.stem for p in (ROOT / "dags" / "pipelines").glob("*.yaml"))
    assert sorted(probe["dags"]) == [f"trainyard_{c}" for c in configs]


@pytest.mark.parametrize(
    "lookup",
    [
        "from airflow.sdk import BaseHook; BaseHook.get_connection('x')",
        "from airflow.sdk import Variable; Variable.get('x')",
    ],
    ids=["connection", "variable"],
)
def test_parse_time_lookups_are_caught(lookup: str) -> None:
    """The probe's secrets backend really fails a lookup (so the tests above can fail)."""
    code = f"try:\n    {lookup}\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_env(), cwd=ROOT
    )
    assert "looked up at DAG parse time" in proc.stdout + proc.stderr


def test_sql_is_counted(tmp_path: Path) -> None:
    """A DAG file that queries the database is caught by the probe."""
    bad = tmp_path / "bad_dag.py"
    bad.write_text(
        "import datetime as dt\n"
        "from sqlalchemy import create_engine, text\n"
        f"create_engine('sqlite:///{tmp_path}/x.db').connect().execute(text('select 1'))\n"
        "from airflow.sdk import DAG\n"
        "dag = DAG('bad', start_date=dt.datetime(2026, 1, 1), schedule=None)\n"
    )
    assert _probe(bad)["sql_statements"] == ["select 1"]
