"""Policy every generated DAG follows, and the typed trigger form."""

from __future__ import annotations

import datetime as dt
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dags(tmp_path_factory: pytest.TempPathFactory) -> dict:
    mp = pytest.MonkeyPatch()
    mp.setenv("TRAINYARD_VOLUME_ROOT", str(tmp_path_factory.mktemp("volumes")))
    mp.setenv("TRAINYARD_RUNNER", "local")
    try:
        namespace = runpy.run_path(str(ROOT / "dags" / "trainyard_pipelines.py"))
    finally:
        mp.undo()
    from airflow.sdk import DAG

    return {k: v for k, v in namespace.items() if isinstance(v, DAG)}


def test_dag_ids_are_sorted_pipeline_names(dags: dict) -> None:
    names = [p.stem for p in sorted((ROOT / "dags" / "pipelines").glob("*.yaml"))]
    assert list(dags) == [f"trainyard_{n}" for n in names]


def test_dag_level_policy(dags: dict) -> None:
    for dag in dags.values():
        assert dag.max_active_runs == 1
        assert dag.doc_md and dag.dag_id.removeprefix("trainyard_") in dag.doc_md
        assert "trainyard" in dag.tags
        assert dag.start_date == dt.datetime.combine(
            dag.start_date.date(), dt.time(), tzinfo=dt.UTC
        )
        assert dag.catchup is False
        assert dag.dagrun_timeout is not None
        assert sorted(dag.task_ids) == sorted(
            [
                "stage",
                "validate",
                "publish_snapshot",
                "train",
                "register",
                "evaluate",
                "gate",
                "deploy",
                "summary",
            ]
        )


@pytest.mark.parametrize(
    ("task_id", "retries"),
    [
        ("stage", 2),
        ("validate", 1),
        ("publish_snapshot", 0),
        ("train", 1),
        ("register", 1),
        ("evaluate", 0),
        ("gate", 0),
        ("deploy", 1),
    ],
)
def test_retries_only_for_transient_steps(dags: dict, task_id: str, retries: int) -> None:
    for dag in dags.values():
        assert dag.get_task(task_id).retries == retries


def test_tasks_have_owner_timeouts_and_training_pool(dags: dict) -> None:
    for dag in dags.values():
        for task in dag.tasks:
            assert task.owner and task.owner != "airflow"
            if task.task_id not in ("gate", "summary", "publish_snapshot"):
                assert task.execution_timeout is not None, task.task_id
        assert dag.get_task("train").pool == "trainyard_training"


def test_schedules(dags: dict) -> None:
    from airflow.sdk import CronDataIntervalTimetable

    for dag in dags.values():
        assert isinstance(dag.timetable, CronDataIntervalTimetable)


def test_trigger_form_params_are_typed_with_sections(dags: dict) -> None:
    for dag in dags.values():
        params = dag.params
        schema = {k: params.get_param(k).schema for k in params}
        assert schema["epochs"]["type"] == "integer"
        assert schema["workers"]["minimum"] == 1
        assert schema["strategy"]["enum"] == ["multi_worker_mirrored", "parameter_server"]
        assert schema["priority"]["enum"] == ["high", "low"]
        assert schema["force_promote"]["type"] == "boolean"
        assert schema["dry_run"]["type"] == "boolean"
        assert {s["section"] for s in schema.values()} == {"Data", "Training", "Promotion", "Run"}
        assert all(s.get("description") or s.get("title") for s in schema.values())


@pytest.mark.parametrize(
    ("value", "ok"),
    [(3, True), (0, True), (-1, False), ("3", False), (5000, False)],
    ids=["three", "zero", "negative", "string", "too-many"],
)
def test_epochs_param_validates(dags: dict, value: object, ok: bool) -> None:
    from airflow.sdk.definitions.param import ParamValidationError

    param = dags["trainyard_digits"].params.get_param("epochs")
    if ok:
        assert param.resolve(value) == value
    else:
        with pytest.raises(ParamValidationError):
            param.resolve(value)


@pytest.mark.parametrize(
    ("policy", "run_type", "queued", "trains"),
    [
        ("last", "scheduled", 0, True),
        ("last", "manual", 3, True),
        ("last", "backfill", 2, False),
        ("last", "backfill", 0, True),
        ("each", "backfill", 5, True),
        ("none", "backfill", 0, False),
    ],
)
def test_backfill_training_policy(policy: str, run_type: str, queued: int, trains: bool) -> None:
    from trainyard.orchestration.run_conf import should_train

    decision, reason = should_train(policy, run_type, queued)
    assert decision is trains
    assert reason
