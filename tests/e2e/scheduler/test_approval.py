"""``gate.approval: required``: a person approves or rejects a candidate, for real.

One ``airflow standalone`` (scheduler, triggerer, API server) runs the digits pipeline
twice. Each run waits in the ``approve`` task (Airflow's human-in-the-loop
``ApprovalOperator``, awaiting input) showing the gate report; the test answers
in a real browser (Chromium via Playwright: the task's Required Action page, the reason
typed in, the Approve button clicked), and through Airflow's own API as that page does
(``PATCH .../hitlDetails`` with the option and a reason). Approve ships the model with
the approver as the promotion's actor and reason; Reject skips the deploy, keeps the
champion and records the approver's reason in the registry. Both answers are mailed
(``notify:``, a real SMTP server on loopback). The deploy step refuses the rejected
version when called by hand, until ``models approve`` records a person's yes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.support.harness import BROWSER_ARGS, CHROMIUM, Project, StandaloneEnv, sign_in
from tests.support.scheduler import Scheduler

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PIPELINE = "digits_approval"  # tests/support/scheduler.py
DAG = f"trainyard_{PIPELINE}"


@pytest.fixture(scope="module")
def env(scheduler: Scheduler) -> StandaloneEnv:
    e = scheduler.env()
    e.inbox = scheduler.inbox  # type: ignore[attr-defined]
    scheduler.wait_for_dag(DAG)
    e.api(f"/api/v2/dags/{DAG}", "PATCH", {"is_paused": False})
    return e


Answer = Callable[[StandaloneEnv, str, str, str], None]


def _through_the_api(env: StandaloneEnv, run_id: str, option: str, reason: str) -> None:
    """Answer as the UI's page does: ``PATCH .../hitlDetails``."""
    hitl = f"/api/v2/dags/{DAG}/dagRuns/{quote(run_id, safe='')}/taskInstances/approve/-1"
    env.api(
        f"{hitl}/hitlDetails",
        "PATCH",
        {"chosen_options": [option], "params_input": {"reason": reason}},
    )


def _in_the_browser(env: StandaloneEnv, run_id: str, option: str, reason: str) -> None:
    """Answer as a person does: the task's Required Action page, the reason, the button."""
    from playwright.sync_api import sync_playwright

    shots = Path(env.project.home) / "screenshots"
    shots.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        sign_in(page, env.base, env.password)
        page.goto(
            f"{env.base}/dags/{DAG}/runs/{quote(run_id, safe='')}/tasks/approve/required_actions"
        )
        page.get_by_text("Gate: PROMOTE").first.wait_for(timeout=60_000)
        page.locator("#element_reason").fill(reason)  # the form's field for the "reason" param
        page.screenshot(path=str(shots / "approval_form.png"), full_page=True)
        page.get_by_role("button", name=option, exact=True).click()
        page.get_by_text("approve response successful").first.wait_for(timeout=60_000)
        page.get_by_text("Response received at").first.wait_for(timeout=60_000)
        page.screenshot(path=str(shots / "approval_answered.png"), full_page=True)
        browser.close()


def _answer(
    env: StandaloneEnv, option: str, reason: str, answer: Answer = _through_the_api
) -> tuple[dict, dict[str, Any]]:
    """Trigger a run, wait for its approval request, answer it, wait for the run's end."""
    run = env.api(f"/api/v2/dags/{DAG}/dagRuns", "POST", {"logical_date": None, "conf": {}})
    run_path = f"/api/v2/dags/{DAG}/dagRuns/{quote(run['dag_run_id'], safe='')}"
    hitl = f"{run_path}/taskInstances/approve/-1/hitlDetails"
    end = time.monotonic() + 480
    while True:
        status, body, _ = env.get(hitl)
        # Airflow 3.3 shows a waiting human-in-the-loop task as awaiting_input (deferred before)
        waiting = ("awaiting_input", "deferred")
        if status == 200 and json.loads(body)["task_instance"]["state"] in waiting:
            break
        state = env.api(run_path)["state"]
        assert state in ("queued", "running"), f"the run ended {state} before asking for approval"
        assert time.monotonic() < end, "no approval request within 480 s"
        time.sleep(1)
    request = json.loads(body)
    # Airflow 3.3 races an answer that lands before the scheduler has handled the pausing
    # workload's exit (6 s late on this busy machine): it then marks the rescheduled task
    # failed. A person takes longer; the test waits for the scheduler's own log line.
    finished = f"TaskInstance Finished: dag_id={DAG}, task_id=approve, run_id={run['dag_run_id']}"
    log = env.project.home / "standalone.log"
    while finished not in log.read_text(errors="replace"):
        assert time.monotonic() < end, "the scheduler never handled the paused approve task"
        time.sleep(1)
    answer(env, run["dag_run_id"], option, reason)
    while (run := env.api(run_path))["state"] not in ("success", "failed"):
        assert time.monotonic() < end + 100, f"run still {run['state']} after the answer"
        time.sleep(1)
    return run, request


def _registry(project: Project) -> tuple[dict, list[dict]]:
    root = project.volume_root / "_models" / PIPELINE
    champion = json.loads((root / "champion.json").read_text())
    history = [json.loads(line) for line in (root / "history.jsonl").read_text().splitlines()]
    return champion, history


@pytest.mark.browser
def test_an_approved_candidate_ships_with_the_approver_recorded(env: StandaloneEnv) -> None:
    run, request = _answer(env, "Approve", "curves and gate look right", _in_the_browser)
    assert run["state"] == "success"
    # the request showed the gate's report and named the version
    assert request["subject"] == f"Ship {PIPELINE} version 1?"
    assert "Gate: PROMOTE" in request["body"] and "threshold:accuracy" in request["body"]
    assert request["options"] == ["Approve", "Reject"]
    states = env.task_states(run["dag_run_id"], DAG)
    assert states["approve"] == "success" and states["deploy"] == "success"
    champion, history = _registry(env.project)
    assert champion["version"] == 1
    approval, promote = history[-2:]
    assert (approval["event"], approval["approved"]) == ("approval", True)
    assert approval["actor"] == "admin"
    assert promote["event"] == "promote" and promote["actor"] == "admin"
    assert promote["reason"] == "approved by admin: curves and gate look right"
    version = env.project.volume_root / "_models" / PIPELINE / "versions" / "1"
    assert json.loads((version / "approval.json").read_text())["approved"] is True
    inbox = env.inbox  # type: ignore[attr-defined]
    assert inbox.subjects() == [f"[trainyard] {PIPELINE}: version 1 promoted and served"]
    assert "admin: curves and gate look right" in inbox.body(0)


def test_a_rejected_candidate_is_not_deployed_and_the_reason_is_kept(env: StandaloneEnv) -> None:
    run, request = _answer(env, "Reject", "wait for the relabelled batch")
    assert run["state"] == "success"  # a person's "no" is an answer, not a failure
    assert request["subject"] == f"Ship {PIPELINE} version 2?"
    states = env.task_states(run["dag_run_id"], DAG)
    assert states["approve"] == "success"
    assert states["deploy"] == "skipped" and states["summary"] == "success"
    champion, history = _registry(env.project)
    assert champion["version"] == 1
    last = history[-1]
    assert (last["event"], last["approved"], last["version"]) == ("approval", False, 2)
    assert (last["actor"], last["reason"]) == ("admin", "wait for the relabelled batch")
    version = env.project.volume_root / "_models" / PIPELINE / "versions" / "2"
    assert json.loads((version / "approval.json").read_text())["reason"] == (
        "wait for the relabelled batch"
    )
    inbox = env.inbox  # type: ignore[attr-defined]
    assert inbox.subjects()[1:] == [f"[trainyard] {PIPELINE}: version 2 rejected by admin"]
    assert "wait for the relabelled batch" in inbox.body(1) and "Gate: PROMOTE" in inbox.body(1)

    # found by a new user: the deploy step shipped the rejected version when run by hand
    by_hand = env.project.trainyard("deploy", "--pipeline", PIPELINE, "--version", "2")
    assert by_hand.returncode == 3, by_hand.stderr[-2000:]
    assert "needs a person's approval" in by_hand.stderr
    assert "admin rejected it: wait for the relabelled batch" in by_hand.stderr
    assert _registry(env.project)[0]["version"] == 1
    # a person's yes from the CLI, then the deploy step ships it
    yes = env.project.trainyard(
        "models", "approve", "--pipeline", PIPELINE, "2", "--reason", "batch relabelled",
        "--actor", "alice",
    )  # fmt: skip
    assert yes.returncode == 0, yes.stderr[-2000:]
    shipped = env.project.trainyard("deploy", "--pipeline", PIPELINE, "--version", "2")
    assert shipped.returncode == 0, shipped.stderr[-2000:]
    champion, history = _registry(env.project)
    assert champion["version"] == 2
    assert history[-1]["reason"] == "approved by alice: batch relabelled"
