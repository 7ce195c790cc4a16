"""``gate.approval: required`` adds Airflow's approval task between gate and deploy."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from tests.support.daily_csv import pipeline as pipeline_dict
from trainyard import runs
from trainyard.config import PipelineConfig


def test_approval_sits_between_gate_and_deploy_and_feeds_deploy_and_summary(
    tmp_path: Path,
) -> None:
    from airflow.providers.standard.operators.hitl import ApprovalOperator

    from trainyard.orchestration.graph import build_dag

    plain = build_dag(PipelineConfig.model_validate(pipeline_dict(tmp_path)))
    assert "approve" not in plain.task_dict
    assert plain.task_dict["deploy"].upstream_task_ids == {"gate"}

    spec = pipeline_dict(
        tmp_path,
        gate={"approval": "required", "approval_timeout_h": 4, "approvers": {"roles": ["op"]}},
    )
    dag = build_dag(PipelineConfig.model_validate(spec))
    approve = dag.task_dict["approve"]
    assert isinstance(approve, ApprovalOperator)
    assert approve.upstream_task_ids == {"gate"}
    assert dag.task_dict["deploy"].upstream_task_ids == {"approve"}
    assert approve.options == ["Approve", "Reject"] and approve.defaults == ["Reject"]
    assert approve.response_timeout == dt.timedelta(hours=4)
    assert "report" in approve.body and "reason" in approve.params
    # no XCom of the approve task is an input anywhere: deploy reads the registry alone
    assert set(dag.task_dict["deploy"].inputs) == {"version", "actor"}
    assert "approve" not in dag.task_dict["summary"].inputs["results"].task_ids


def test_an_answer_becomes_a_plain_record() -> None:
    from trainyard.orchestration.approval import answer_record

    at = dt.datetime(2026, 11, 25, 20, 41, tzinfo=dt.UTC)
    approved = answer_record(
        {
            "chosen_options": ["Approve"],
            "params_input": {"reason": "looks right"},
            "responded_by_user": {"id": "1", "name": "admin"},
            "responded_at": at,
        }
    )
    assert approved == {
        "approved": True,
        "by": "admin",
        "user_id": "1",
        "reason": "looks right",
        "at": "2026-11-25 20:41:00+00:00",
    }
    # nobody answered: the default option (Reject) was taken by the timeout
    timed_out = answer_record({"chosen_options": ["Reject"], "params_input": {}})
    assert timed_out["approved"] is False and timed_out["by"].startswith("timeout")
    assert timed_out["user_id"] is None


def test_a_run_waiting_for_approval_is_not_recorded_as_a_rejection(
    tmp_path: Path, monkeypatch
) -> None:
    """Found in review: a run stopped before deploy with no answer yet was taken by the
    summary for a person's Reject (of a version by "None"). The summary now shows the
    registry's answer, and a candidate nobody answered for is waiting."""
    import yaml

    from trainyard import steps

    shipped = Path(__file__).resolve().parents[2] / "dags" / "pipelines" / "digits.yaml"
    doc = yaml.safe_load(shipped.read_text())
    doc["gate"] |= {"approval": "required", "approvers": {"users": ["alice"]}}
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "pipelines" / "digits.yaml").write_text(yaml.safe_dump(doc))
    monkeypatch.setenv("TRAINYARD_PIPELINES_DIR", str(tmp_path / "pipelines"))
    monkeypatch.setenv("TRAINYARD_VOLUME_ROOT", str(tmp_path / "volumes"))
    forged = {"approved": True, "by": "mallory", "reason": "an edited XCom"}
    results = {"register": {"version": 1}, "evaluate": {"promote": True}, "approve": forged}
    record = steps.summary("digits", "run-1", results)
    assert not list((tmp_path / "volumes").rglob("approval.json"))
    assert not list((tmp_path / "volumes").rglob("history.jsonl"))
    assert record["approve"]["approved"] is None
    assert "approval      waiting for a person" in runs.format_summary(record)
