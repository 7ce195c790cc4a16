"""A person approves a candidate before it ships (``gate.approval: required``).

``ModelApproval`` is Airflow's ``ApprovalOperator`` (human-in-the-loop, providers-standard)
between ``gate`` and ``deploy``: it shows the gate report in the UI's Required Actions and
waits (task state ``awaiting_input``) for Approve or Reject with a reason, or rejects when
``gate.approval_timeout_h`` passes unanswered. Reject skips ``deploy``; the ``summary`` step
records the answer in the registry (``approval.json`` next to the version, an ``approval``
event in ``history.jsonl``), and an approval becomes the promotion's actor and reason.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import Param

from trainyard.config import PipelineConfig


class ModelApproval(ApprovalOperator):
    """``ApprovalOperator`` whose result is a plain record: approved, by, reason, at."""

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        """Record the answer as the task's result, then let the base skip ``deploy`` on Reject.

        The result is pushed before the base runs: on Reject it skips the downstream tasks
        by raising (Airflow 3's ``DownstreamTasksSkipped``), so a returned value would be lost.
        """
        answer = answer_record(event)
        context["ti"].xcom_push(key="return_value", value=answer)
        super().execute_complete(context=context, event=event)
        return answer


def answer_record(event: dict[str, Any]) -> dict[str, Any]:
    """A human-in-the-loop answer (the trigger's event) as ``approved, by, reason, at``."""
    chosen = list(event.get("chosen_options") or [])
    user = event.get("responded_by_user")
    by = (user.get("name") or user.get("id")) if isinstance(user, dict) else None
    return {
        "approved": chosen[:1] == [ApprovalOperator.APPROVE],
        "by": str(by) if by else "timeout (nobody answered in time)",
        "reason": str((event.get("params_input") or {}).get("reason") or ""),
        "at": str(event.get("responded_at") or ""),
    }


def approval_task(cfg: PipelineConfig, on_answer: Any = None) -> ModelApproval:
    """The ``approve`` task of a pipeline with ``gate.approval: required``.

    Args:
        cfg: The pipeline.
        on_answer: Its success callback (the rejection mail), if any.
    """
    return ModelApproval(
        on_success_callback=on_answer,
        task_id="approve",
        subject=(
            f"Ship {cfg.name} version {{{{ ti.xcom_pull(task_ids='evaluate')['version'] }}}}?"
        ),
        body="{{ ti.xcom_pull(task_ids='evaluate')['report'] }}",
        defaults="Reject",
        params={
            "reason": Param(
                "",
                type="string",
                title="Reason",
                description="Why you approve or reject (recorded in the model registry).",
            )
        },
        response_timeout=dt.timedelta(hours=cfg.gate.approval_timeout_h),
    )
