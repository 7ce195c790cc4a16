"""E-mail a pipeline's outcomes (``notify:`` in its YAML) with Airflow's SMTP notifier.

Three task callbacks, wired by ``graph.build_dag``/``graph.wire``:

* ``failure``: every task's ``on_failure_callback`` (a task failed for good, after its
  retries): which task, the error, the run;
* ``rejection``: the ``gate`` task's ``on_skipped_callback`` (its ``on_failure_callback``
  with ``gate.fail_run_on_reject``): the gate's reason and the candidate's and champion's
  metrics (from the ``evaluate`` XCom); and the ``approve`` task's ``on_success_callback``
  when a person answered Reject (who and why, with the gate report);
* ``promotion``: the ``deploy`` task's ``on_success_callback``: the version now served,
  where, its metrics, and who approved it.

The mail goes through ``SmtpNotifier`` of ``apache-airflow-providers-smtp`` and the
pipeline's Airflow connection (``notify.smtp_conn_id``). Subject and body are built here,
every value escaped, and handed over finished (no Jinja rendering of reasons or errors). A
mail that cannot be sent is logged, never turned into a task failure.
"""

from __future__ import annotations

import html
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from trainyard.config import NotifyConfig

if TYPE_CHECKING:
    from airflow.sdk import Context

log = logging.getLogger("trainyard.notify")


class OutcomeMail:
    """A task callback that e-mails one outcome of a pipeline run.

    Args:
        event: ``failure``, ``rejection`` or ``promotion``.
        notify: The pipeline's ``notify`` section.
        pipeline: The pipeline's name (in the subject).
    """

    def __init__(self, event: str, notify: NotifyConfig, pipeline: str) -> None:
        self.event, self.notify, self.pipeline = event, notify, pipeline

    def __call__(self, context: Mapping[str, Any]) -> None:
        """Send the mail for this task's outcome (Airflow calls it with the task context).

        A gate that skipped because the candidate is the champion itself (``keep``: a run
        that reused it) rejected nothing: no mail.
        """
        try:
            if self.event == "rejection":
                decision = context["ti"].xcom_pull(task_ids="evaluate") or {}
                if decision.get("verdict") == "keep":
                    return
            subject, rows, text = self.message(context)
            from airflow.providers.smtp.notifications.smtp import SmtpNotifier

            SmtpNotifier(
                to=list(self.notify.email),
                from_email=self.notify.from_email,
                subject=subject,
                html_content=render_html(subject, rows, text),
                smtp_conn_id=self.notify.smtp_conn_id,
            ).notify(cast("Context", context))
            log.info("notify: e-mailed %s to %s", subject, ", ".join(self.notify.email))
        except Exception:  # a mail server being down must not change the task's outcome
            log.exception("notify: could not e-mail the %s of %s", self.event, self.pipeline)

    def message(self, context: Mapping[str, Any]) -> tuple[str, list[tuple[str, str]], str]:
        """Subject, (field, value) rows and a free text for this outcome."""
        ti = context["ti"]
        run = [("pipeline", self.pipeline), ("run", str(context.get("run_id")))]
        if self.event == "failure":
            error = context.get("exception")
            text = f"{type(error).__name__}: {error}" if error is not None else "(no error given)"
            rows = [*run, ("task", ti.task_id), ("try", str(getattr(ti, "try_number", "?")))]
            return f"[trainyard] {self.pipeline}: task {ti.task_id} failed", rows, text
        decision = ti.xcom_pull(task_ids="evaluate") or {}
        version = decision.get("version")
        metrics = _metrics_rows(decision)
        # the reason, then the gate report: every check, candidate and champion side by side
        text = f"{decision.get('reason')}\n\n{decision.get('report') or ''}".strip()
        answer = _answer(ti, self.pipeline) if ti.task_id in ("approve", "deploy") else None
        person = (
            [("approval", f"{answer.get('by')}: {answer.get('reason') or '(no reason)'}")]
            if isinstance(answer, dict)
            else []
        )
        if self.event == "rejection" and person and answer is not None:
            subject = f"[trainyard] {self.pipeline}: version {version} rejected by {answer['by']}"
            return subject, [*run, ("verdict", "rejected by a person"), *person, *metrics], text
        if self.event == "rejection":
            subject = f"[trainyard] {self.pipeline}: gate rejected version {version}"
            return subject, [*run, ("verdict", "reject"), *metrics], text
        deployed = ti.xcom_pull(task_ids="deploy") or {}
        served = deployed.get("version", version)
        subject = f"[trainyard] {self.pipeline}: version {served} promoted and served"
        rows = [
            *run,
            ("served", str(served)),
            ("url", str(deployed.get("url"))),
            *person,
            *metrics,
        ]
        return subject, rows, text


def _answer(ti: Any, pipeline: str) -> dict[str, Any] | None:
    """The registry's answer to the run's approval request (never the ``approve`` XCom)."""
    from trainyard.runview import approval_of
    from trainyard.settings import get_settings

    registered = ti.xcom_pull(task_ids="register") or {}
    return approval_of(get_settings().volume_root, pipeline, {"register": registered})


def _metrics_rows(decision: Mapping[str, Any]) -> list[tuple[str, str]]:
    candidate = decision.get("metrics") or {}
    champion = decision.get("champion_metrics") or {}
    rows = []
    for name in sorted(k for k in candidate if "@" not in k):
        value = f"{candidate[name]:.4f}" if isinstance(candidate[name], float) else candidate[name]
        champ = champion.get(name)
        if isinstance(champ, float):
            value = f"{value} (champion {champ:.4f})"
        rows.append((name, str(value)))
    return rows


def render_html(subject: str, rows: list[tuple[str, str]], text: str) -> str:
    """The mail body: a heading, a table of the rows and the text, every value escaped."""
    cells = "".join(
        f"<tr><th align='left'>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows
    )
    return (
        f"<h3>{html.escape(subject)}</h3><table>{cells}</table>"
        f"<pre style='white-space:pre-wrap'>{html.escape(text)}</pre>"
    )


def callbacks(notify: NotifyConfig | None, pipeline: str) -> dict[str, OutcomeMail]:
    """The pipeline's mail callbacks by event (none without ``notify``)."""
    if notify is None:
        return {}
    return {event: OutcomeMail(event, notify, pipeline) for event in notify.events}


class PersonRejectedMail(OutcomeMail):
    """The ``approve`` task's success callback: mails only when the answer was Reject."""

    def __init__(self, notify: NotifyConfig, pipeline: str) -> None:
        super().__init__("rejection", notify, pipeline)

    def __call__(self, context: Mapping[str, Any]) -> None:
        """Send the rejection mail if the person (or the timeout) said Reject."""
        answer = _answer(context["ti"], self.pipeline)
        if isinstance(answer, dict) and answer.get("approved") is False:
            super().__call__(context)
