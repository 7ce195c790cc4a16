"""A person approves a candidate before it ships (``gate.approval: required``).

``ModelApproval`` is Airflow's ``ApprovalOperator`` (human-in-the-loop, providers-standard)
between ``gate`` and ``deploy``: it shows the gate report in the UI's Required Actions and
waits (task state ``awaiting_input``) for Approve or Reject with a reason, or rejects when
``gate.approval_timeout_h`` passes unanswered.

Only the pipeline's approvers may answer (``gate.approvers``: users, and roles of Airflow's
simple auth manager), never the person who triggered the run unless the pipeline allows it:
they are the request's assigned users, which Airflow enforces when the answer is given, and
the answer is checked against them again here. The answer Airflow recorded is written to
the registry by the ``approval`` step (:func:`trainyard.steps.approval`) when the request is
made (``pending``: an earlier answer no longer counts) and when it is answered; ``deploy``
reads only the registry. XComs and skip markers are never evidence of an approval.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import Param
from airflow.sdk.exceptions import AirflowFailException

from trainyard.config import ApproversConfig, PipelineConfig
from trainyard.errors import ConfigError
from trainyard.orchestration.inputs import FromXCom, resolve

if TYPE_CHECKING:
    from airflow.sdk import Context

SIMPLE_AUTH_MANAGER = "SimpleAuthManager"


class ModelApproval(ApprovalOperator):
    """``ApprovalOperator`` limited to the pipeline's approvers, its answer kept in the registry.

    Args:
        pipeline: The pipeline (its ``gate.approvers``).
        **kwargs: ``ApprovalOperator`` arguments.
    """

    def __init__(self, *, pipeline: PipelineConfig, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline = pipeline

    def execute(self, context: Context) -> None:
        """Ask the pipeline's approvers; first withdraw any earlier answer in the registry."""
        approvers = self._approvers(context)
        self.assigned_users = [{"id": user, "name": user} for user in approvers]
        self.log.info("asking %s (gate.approvers)", ", ".join(approvers))
        self._record(context, "pending", None, "asked: " + ", ".join(approvers))
        super().execute(context)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Check who answered, record the answer, then let the base skip ``deploy`` on Reject.

        The result is pushed before the base runs: on Reject it skips the downstream tasks
        by raising (Airflow 3's ``DownstreamTasksSkipped``), so a returned value would be lost.

        Raises:
            AirflowFailException: If someone who is not an approver answered.
        """
        answer = answer_record(event)
        user = answer.pop("user_id")
        if user is not None and user not in self._approvers(context):
            raise AirflowFailException(
                f"{answer['by']} answered the approval request of {self.pipeline.name} but is "
                "not one of its approvers (gate.approvers); nothing was recorded"
            )
        decision = "approved" if answer["approved"] else "rejected"
        self._record(context, decision, answer["by"], answer["reason"])
        context["ti"].xcom_push(key="return_value", value=answer)
        super().execute_complete(context=context, event=event)
        return answer

    def _approvers(self, context: Context) -> list[str]:
        try:
            return allowed_approvers(self.pipeline.gate.approvers, _triggerer(context))
        except ConfigError as e:
            raise AirflowFailException(f"{self.pipeline.name}: {e}") from None

    def _record(self, context: Context, decision: str, by: str | None, reason: str) -> None:
        from trainyard.orchestration.runners import launch_step

        version = resolve(FromXCom("evaluate", "version"), context)
        values = {
            "pipeline": self.pipeline.name,
            "version": version,
            "decision": decision,
            "by": by,
            "reason": reason,
            "run_id": context["run_id"],
        }
        launch_step(self.pipeline, "approval", values, context)


def _triggerer(context: Context) -> str | None:
    """Who triggered the run (None for a scheduled run)."""
    run = context.get("dag_run")
    return getattr(run, "triggering_user_name", None) or None


def allowed_approvers(
    approvers: ApproversConfig | None,
    triggerer: str | None,
    config_users: list[tuple[str, str]] | None = None,
) -> list[str]:
    """The accounts that may answer a run's approval request.

    Args:
        approvers: The pipeline's ``gate.approvers``.
        triggerer: Who triggered the run (left out unless ``allow_triggerer``).
        config_users: ``(user, role)`` pairs of the simple auth manager (default: read
            from Airflow's config when roles are named).

    Returns:
        Account ids, sorted.

    Raises:
        ConfigError: If roles are named but the auth manager cannot list them, or nobody
            is left to answer.
    """
    if approvers is None:
        raise ConfigError("gate.approvers names nobody: no one may approve")
    allowed = set(approvers.users)
    if approvers.roles:
        pairs = config_users if config_users is not None else _simple_auth_manager_users()
        roles = {r.lower() for r in approvers.roles}
        allowed |= {user for user, role in pairs if role.lower() in roles}
    if triggerer and not approvers.allow_triggerer:
        allowed.discard(triggerer)
    if not allowed:
        left_out = (
            f"; {triggerer} triggered the run and may not approve it (four-eyes; "
            "gate.approvers.allow_triggerer: true lifts that)"
            if triggerer and not approvers.allow_triggerer
            else ""
        )
        raise ConfigError(
            f"nobody may answer the approval request: gate.approvers names users "
            f"{approvers.users or 'none'} and roles {approvers.roles or 'none'}{left_out}"
        )
    return sorted(allowed)


def _simple_auth_manager_users() -> list[tuple[str, str]]:
    """``(user, role)`` of Airflow's simple auth manager; other managers cannot list roles.

    Raises:
        ConfigError: If another auth manager is configured, or every visitor is an
            anonymous admin (``simple_auth_manager_all_admins``): nobody can be told apart.
    """
    from airflow.configuration import conf

    manager = conf.get("core", "auth_manager", fallback="") or SIMPLE_AUTH_MANAGER
    if not manager.endswith(SIMPLE_AUTH_MANAGER):
        raise ConfigError(
            f"gate.approvers.roles: the auth manager {manager} does not list its users' roles "
            "to tasks; name the approvers under gate.approvers.users"
        )
    if conf.getboolean("core", "simple_auth_manager_all_admins", fallback=False):
        raise ConfigError(
            "approval needs named accounts, and simple_auth_manager_all_admins makes every "
            "visitor an anonymous admin: turn it off and list the users"
        )
    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

    return [(u.username, str(u.role or "")) for u in SimpleAuthManager.get_users()]


def answer_record(event: dict[str, Any]) -> dict[str, Any]:
    """A human-in-the-loop answer (the resumed task's event) as a plain record.

    Returns:
        ``approved``, ``by`` (the name, or that the timeout answered), ``user_id`` (None
        when nobody answered), ``reason``, ``at``.
    """
    chosen = list(event.get("chosen_options") or [])
    user = event.get("responded_by_user")
    name = (user.get("name") or user.get("id")) if isinstance(user, dict) else None
    user_id = (user.get("id") or user.get("name")) if isinstance(user, dict) else None
    return {
        "approved": chosen[:1] == [ApprovalOperator.APPROVE],
        "by": str(name) if name else "timeout (nobody answered in time)",
        "user_id": str(user_id) if user_id else None,
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
        pipeline=cfg,
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
