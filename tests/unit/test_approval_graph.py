"""``gate.approval: required`` adds Airflow's approval task between gate and deploy."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from tests.support.daily_csv import pipeline as pipeline_dict
from trainyard.config import PipelineConfig


def test_approval_sits_between_gate_and_deploy_and_feeds_deploy_and_summary(
    tmp_path: Path,
) -> None:
    from airflow.providers.standard.operators.hitl import ApprovalOperator

    from trainyard.orchestration.graph import build_dag

    plain = build_dag(PipelineConfig.model_validate(pipeline_dict(tmp_path)))
    assert "approve" not in plain.task_dict
    assert plain.task_dict["deploy"].upstream_task_ids == {"gate"}

    spec = pipeline_dict(tmp_path, gate={"approval": "required", "approval_timeout_h": 4})
    dag = build_dag(PipelineConfig.model_validate(spec))
    approve = dag.task_dict["approve"]
    assert isinstance(approve, ApprovalOperator)
    assert approve.upstream_task_ids == {"gate"}
    assert dag.task_dict["deploy"].upstream_task_ids == {"approve"}
    assert approve.options == ["Approve", "Reject"] and approve.defaults == ["Reject"]
    assert approve.response_timeout == dt.timedelta(hours=4)
    assert "report" in approve.body and "reason" in approve.params
    deploy_inputs = dag.task_dict["deploy"].inputs
    assert {"approved_by", "approval_reason"} <= set(deploy_inputs)
    assert "approve" in dag.task_dict["summary"].inputs["results"].task_ids


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
        "reason": "looks right",
        "at": "2026-11-25 20:41:00+00:00",
    }
    # nobody answered: the default option (Reject) was taken by the timeout
    timed_out = answer_record({"chosen_options": ["Reject"], "params_input": {}})
    assert timed_out["approved"] is False and timed_out["by"].startswith("timeout")


def test_a_run_waiting_for_approval_is_not_recorded_as_a_rejection(
    tmp_path: Path, monkeypatch
) -> None:
    """Found in review: ``run`` stops before deploy with ``approved: None`` (waiting), and the
    summary step took that for a person's Reject (of a version by "None")."""
    from trainyard import steps

    monkeypatch.setenv("TRAINYARD_VOLUME_ROOT", str(tmp_path / "volumes"))
    waiting = {"approved": None, "by": None, "reason": "waiting"}
    record = steps.summary("digits", "run-1", {"register": {"version": 1}, "approve": waiting})
    assert not list((tmp_path / "volumes").rglob("approval.json"))
    assert not list((tmp_path / "volumes").rglob("history.jsonl"))
    assert "approval      waiting for a person" in steps.format_summary(record)
