"""``gate.approval: required``: a person approves or rejects a candidate, for real.

One ``airflow standalone`` (scheduler, API server) with three accounts of the simple auth
manager: ``admin`` (triggers the runs), ``alice`` (role ``op``: the pipeline's approvers
are ``roles: [op]``) and ``mallory`` (Airflow's ordinary ``user`` role). Each run waits in
the ``approve`` task (Airflow's human-in-the-loop ``ApprovalOperator``, awaiting input)
showing the gate report; alice answers in a real browser (Chromium via Playwright: the
task's Required Action page, the reason typed in, the Approve button clicked), and through
Airflow's own API as that page does (``PATCH .../hitlDetails``). Neither mallory nor the
run's triggerer may answer (four-eyes). Approve ships the model with alice as the
promotion's actor; Reject skips the deploy, and mallory editing the approve task's XComs
and clearing ``deploy`` ships nothing: deploy reads the registry, written only from
Airflow's record of the answer. Clearing ``approve`` after a shipped version is rejected
rolls it back, in registry and serving alike. Both answers are mailed (``notify:``, a real
SMTP server on loopback).
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.support.harness import (
    BROWSER_ARGS,
    CHROMIUM,
    Project,
    StandaloneEnv,
    admin_password,
    sign_in,
)
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


def _hitl(run_id: str) -> str:
    return f"/api/v2/dags/{DAG}/dagRuns/{quote(run_id, safe='')}/taskInstances/approve/-1"


def _as(env: StandaloneEnv, user: str, run_id: str, option: str, reason: str) -> int:
    """Answer as ``user`` does through the UI's page: ``PATCH .../hitlDetails``."""
    body = {"chosen_options": [option], "params_input": {"reason": reason}}
    return env.api_as(user, f"{_hitl(run_id)}/hitlDetails", "PATCH", body)[0]


def _through_the_api(env: StandaloneEnv, run_id: str, option: str, reason: str) -> None:
    """Answer as alice, after the triggerer and an ordinary user were turned away."""
    assert _as(env, "admin", run_id, option, "my own run") == 403  # four-eyes
    assert _as(env, "mallory", run_id, option, "not an approver") == 403
    assert _as(env, "alice", run_id, option, reason) == 200


def _in_the_browser(env: StandaloneEnv, run_id: str, option: str, reason: str) -> None:
    """Answer as a person does: the task's Required Action page, the reason, the button."""
    from playwright.sync_api import sync_playwright

    shots = Path(env.project.home) / "screenshots"
    shots.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        sign_in(page, env.base, admin_password(env.project, "alice"), "alice")
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


def _wait_for_request(env: StandaloneEnv, run_id: str, handled: int = 1) -> dict[str, Any]:
    """Wait until the run's approve task asks (for the ``handled``-th time); the request."""
    run_path = f"/api/v2/dags/{DAG}/dagRuns/{quote(run_id, safe='')}"
    end = time.monotonic() + 480
    while True:
        status, body, _ = env.get(f"{_hitl(run_id)}/hitlDetails")
        # Airflow 3.3 shows a waiting human-in-the-loop task as awaiting_input (deferred before)
        waiting = ("awaiting_input", "deferred")
        if status == 200 and json.loads(body)["task_instance"]["state"] in waiting:
            break
        state = env.api(run_path)["state"]
        assert state in ("queued", "running"), f"the run ended {state} before asking for approval"
        assert time.monotonic() < end, "no approval request within 600 s"
        time.sleep(2)
    # Airflow 3.3 races an answer that lands before the scheduler has handled the pausing
    # workload's exit (6 s late on this busy machine): it then marks the rescheduled task
    # failed. A person takes longer; the test waits for the scheduler's own log line.
    while _finished(env, run_id) < handled:
        assert time.monotonic() < end, "the scheduler never handled the paused approve task"
        time.sleep(1)
    return json.loads(body)


def _finished(env: StandaloneEnv, run_id: str) -> int:
    """How many times the scheduler logged the run's approve task finished (a pause counts)."""
    finished = f"TaskInstance Finished: dag_id={DAG}, task_id=approve, run_id={run_id}"
    return (env.project.home / "standalone.log").read_text(errors="replace").count(finished)


def _wait_for_run(env: StandaloneEnv, run_id: str) -> dict[str, Any]:
    run_path = f"/api/v2/dags/{DAG}/dagRuns/{quote(run_id, safe='')}"
    end = time.monotonic() + 600
    while (run := env.api(run_path))["state"] not in ("success", "failed"):
        assert time.monotonic() < end, f"run still {run['state']} after the answer"
        time.sleep(2)
    return run


def _answer(
    env: StandaloneEnv, option: str, reason: str, answer: Answer = _through_the_api
) -> tuple[dict, dict[str, Any]]:
    """Trigger a run as admin, wait for its approval request, answer it, wait for the end."""
    # each asks about a new candidate: unchanged inputs would reuse the champion and ask nothing
    conf = {"force_retrain": True}
    run = env.api(f"/api/v2/dags/{DAG}/dagRuns", "POST", {"logical_date": None, "conf": conf})
    request = _wait_for_request(env, run["dag_run_id"])
    answer(env, run["dag_run_id"], option, reason)
    return _wait_for_run(env, run["dag_run_id"]), request


def _clear(env: StandaloneEnv, user: str, run_id: str, task: str) -> int:
    body = {
        "dry_run": False,
        "dag_run_id": run_id,
        "task_ids": [task],
        "only_failed": False,
        "include_downstream": False,
        "include_upstream": False,
    }
    return env.api_as(user, f"/api/v2/dags/{DAG}/clearTaskInstances", "POST", body)[0]


def _task_end(env: StandaloneEnv, run_id: str, task: str, before: set[str]) -> str:
    """Wait for a cleared task to run again and end; its final state."""
    end = time.monotonic() + 600
    seen_running = False
    while True:
        state = env.task_states(run_id, DAG).get(task)
        seen_running = seen_running or state not in before
        if seen_running and state in ("success", "failed", "skipped", "upstream_failed"):
            return state
        assert time.monotonic() < end, f"{task} still {state}"
        time.sleep(2)


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
    asked, approval, promote = history[-3:]
    assert (asked["event"], asked["approved"]) == ("approval", None)
    assert (approval["event"], approval["approved"]) == ("approval", True)
    assert approval["actor"] == "alice"
    assert promote["event"] == "promote" and promote["actor"] == "alice"
    assert promote["reason"] == "approved by alice: curves and gate look right"
    version = env.project.volume_root / "_models" / PIPELINE / "versions" / "1"
    assert json.loads((version / "approval.json").read_text())["approved"] is True
    inbox = env.inbox  # type: ignore[attr-defined]
    assert inbox.subjects() == [f"[trainyard] {PIPELINE}: version 1 promoted and served"]
    assert "alice: curves and gate look right" in inbox.body(0)


def test_a_rejected_candidate_is_not_deployed_and_the_reason_is_kept(env: StandaloneEnv) -> None:
    run, request = _answer(env, "Reject", "wait for the relabelled batch")
    env.runs["rejected"] = run
    assert run["state"] == "success"  # a person's "no" is an answer, not a failure
    assert request["subject"] == f"Ship {PIPELINE} version 2?"
    states = env.task_states(run["dag_run_id"], DAG)
    assert states["approve"] == "success"
    assert states["deploy"] == "skipped" and states["summary"] == "success"
    champion, history = _registry(env.project)
    assert champion["version"] == 1
    last = history[-1]
    assert (last["event"], last["approved"], last["version"]) == ("approval", False, 2)
    assert (last["actor"], last["reason"]) == ("alice", "wait for the relabelled batch")
    version = env.project.volume_root / "_models" / PIPELINE / "versions" / "2"
    assert json.loads((version / "approval.json").read_text())["reason"] == (
        "wait for the relabelled batch"
    )
    inbox = env.inbox  # type: ignore[attr-defined]
    assert inbox.subjects()[1:] == [f"[trainyard] {PIPELINE}: version 2 rejected by alice"]
    assert "wait for the relabelled batch" in inbox.body(1) and "Gate: PROMOTE" in inbox.body(1)

    # the bypass found by a hostile pass: an ordinary user edits the approve task's skip
    # marker (and its answer) and clears deploy; deploy runs, reads the registry, refuses
    xcoms = f"{_hitl(run['dag_run_id']).removesuffix('/-1')}/xcomEntries"
    for key, value in (
        ("skipmixin_key", {"skipped": []}),
        ("return_value", {"approved": True, "by": "alice", "reason": "forged"}),
    ):
        status, _ = env.api_as("mallory", f"{xcoms}/{key}", "PATCH", {"value": value})
        assert status == 200, f"the user role could not edit {key}: the attack changed"
    assert _clear(env, "mallory", run["dag_run_id"], "deploy") == 200
    assert _task_end(env, run["dag_run_id"], "deploy", {"skipped"}) == "failed"
    champion, history = _registry(env.project)
    assert champion["version"] == 1
    assert not [e for e in history if e.get("approved") is True and e.get("version") == 2]

    # found by a new user: the deploy step shipped the rejected version when run by hand
    by_hand = env.project.trainyard("deploy", "--pipeline", PIPELINE, "--version", "2")
    assert by_hand.returncode == 3, by_hand.stderr[-2000:]
    assert "needs a person's approval" in by_hand.stderr
    assert "alice rejected it: wait for the relabelled batch" in by_hand.stderr
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


def test_a_shipped_version_rejected_on_a_second_ask_is_rolled_back(env: StandaloneEnv) -> None:
    """Clearing ``approve`` after the version shipped left serving and ``approval.json``
    disagreeing; now the request is asked again, the earlier answer stops counting, and a
    Reject rolls the champion back, in the registry and in what the server answers."""
    assert _registry(env.project)[0]["version"] == 2  # shipped by the previous test
    run_id = env.runs["rejected"]["dag_run_id"]
    before = _finished(env, run_id)  # its first ask: paused, then answered
    assert _clear(env, "admin", run_id, "approve") == 200
    _wait_for_request(env, run_id, handled=before + 1)
    version = env.project.volume_root / "_models" / PIPELINE / "versions" / "2"
    assert json.loads((version / "approval.json").read_text())["approved"] is None
    assert _as(env, "alice", run_id, "Reject", "the relabelled batch was wrong") == 200
    assert _task_end(env, run_id, "approve", {"awaiting_input"}) == "success"
    champion, history = _registry(env.project)
    assert champion["version"] == 1
    assert (history[-1]["event"], history[-1]["from"], history[-1]["version"]) == (
        "rollback",
        2,
        1,
    )
    assert history[-1]["reason"] == (
        "rejected by alice after it shipped: the relabelled batch was wrong"
    )
    port = env.project.port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models/{PIPELINE}", timeout=10) as r:
        served = json.loads(r.read())["model_version_status"]
    assert [s["version"] for s in served if s["state"] == "AVAILABLE"] == ["1"]
    page = env.api(f"/trainyard/api/runs/{DAG}/{quote(run_id, safe='')}")
    assert page["record"]["approve"]["approved"] is False
    assert page["record"]["approve"]["by"] == "alice"
