"""trainyard in the Airflow UI, for real: one ``airflow standalone`` runs the digits pipeline
twice (a promotion, then a 0-epoch candidate the gate rejects) and every test looks at it.

* The plugin's pages in headless Chromium, logged in through Airflow's login: the run page
  (gate reason, candidate vs champion metrics, the training curves as ``<svg>``, the Data
  Docs link, which opens) and the pipeline page (versions, champion, chart); also the
  plugin's tab inside Airflow's own run view. Screenshots go to ``<tmp>/screenshots``.
* The plugin's API: refused without credentials (401) or with a forged token (403), served
  with a real JWT from ``/auth/token``; its file route serves nothing outside the snapshot's
  report (``..``, encoded ``..``, links out of the folder and out of the volume root).
* Run state: the rejected run's ``gate`` task is ``skipped`` with the reason in its log and
  ``deploy`` skipped; each run's note is its one-line summary.
"""

from __future__ import annotations

import json
import os
import time
from urllib.parse import quote

import pytest

from tests.support.harness import BROWSER_ARGS, CHROMIUM, sign_in
from tests.support.harness import StandaloneEnv as Env
from tests.support.scheduler import Scheduler

# four pipeline runs on the shared standalone are set up for the first test
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PIPELINE = "digits_ui"  # its dataset is "digits"
DAG = f"trainyard_{PIPELINE}"
STRICT = "trainyard_digits_strict"


@pytest.fixture(scope="module")
def env(scheduler: Scheduler) -> Env:
    e = scheduler.env()
    for dag in (DAG, STRICT):
        scheduler.wait_for_dag(dag)
        e.api(f"/api/v2/dags/{dag}", "PATCH", {"is_paused": False})
    invalid = e.trigger({}, dag=STRICT)  # another DAG: it runs beside the three below
    e.runs["promoted"] = e.trigger_and_wait({}, dag=DAG)
    e.runs["rejected"] = e.trigger_and_wait({"epochs": 0}, dag=DAG)
    e.runs["typo"] = e.trigger_and_wait({"epoch": 3}, dag=DAG)  # fails at its first step
    e.runs["invalid"] = e.wait_for_run(invalid, dag=STRICT)
    return e


def _run_id(env: Env, which: str) -> str:
    run = env.runs[which]
    assert run["state"] == "success", f"{which} run ended {run['state']}; see {env.project.home}"
    return run["dag_run_id"]


def _snapshot(env: Env) -> str:
    last = env.project.volume_root / "_models" / PIPELINE / "last_run.json"
    return json.loads(last.read_text())["stage"]["snapshot_id"]


# ----------------------------------------------------------------------------- run state


def test_gate_rejection_shows_as_skipped_with_the_reason(env: Env) -> None:
    promoted, rejected = _run_id(env, "promoted"), _run_id(env, "rejected")
    states = env.task_states(promoted, DAG)
    assert states["gate"] == "success" and states["deploy"] == "success", states
    states = env.task_states(rejected, DAG)
    assert states["gate"] == "skipped", states
    assert states["deploy"] == "skipped", states
    assert states["summary"] == "success", states
    log = env.api(
        f"/api/v2/dags/{DAG}/dagRuns/{quote(rejected, safe='')}/taskInstances/gate/logs/1"
    )
    text = json.dumps(log)
    assert "gate rejected the candidate" in text and "accuracy" in text


def _note(env: Env, dag: str, run: dict) -> str:
    """The run's note, once the scheduler's listener has set it (30 s at most)."""
    end = time.monotonic() + 30
    while not run.get("note") and time.monotonic() < end:
        time.sleep(1)
        run = env.api(f"/api/v2/dags/{dag}/dagRuns/{quote(run['dag_run_id'], safe='')}")
    return run.get("note") or ""


def test_each_run_note_is_its_summary(env: Env) -> None:
    snapshot = _snapshot(env)
    notes = {}
    for which in ("promoted", "rejected"):
        run_id = _run_id(env, which)
        end = time.monotonic() + 30
        while True:
            run = env.api(f"/api/v2/dags/{DAG}/dagRuns/{quote(run_id, safe='')}")
            if run.get("note") or time.monotonic() > end:
                break
            time.sleep(1)
        notes[which] = run.get("note") or ""
    promoted, rejected = notes["promoted"], notes["rejected"]
    assert promoted.startswith("trainyard: snapshot " + snapshot), promoted
    assert "validation passed" in promoted and " v1 " in promoted, promoted
    assert "accuracy=" in promoted and "loss=" in promoted, promoted
    assert "gate promote" in promoted and promoted.endswith("serving v1"), promoted
    assert "(reused, 1797 rows)" in rejected and " v2 " in rejected, rejected
    assert "gate reject" in rejected and rejected.endswith("serving unchanged (v1)"), rejected

    run = env.runs["invalid"]
    assert run["state"] == "failed", run
    states = env.task_states(run["dag_run_id"], STRICT)
    assert states["validate"] == "failed" and states["train"] == "upstream_failed", states
    note = _note(env, STRICT, run)
    assert note.startswith("trainyard: snapshot ") and "(new, 1797 rows)" in note, note
    assert "validation failed" in note and "gate not run" in note, note
    assert "failed: validate (trainyard validate: ValidationFailed:" in note, note
    assert "row_count : 1797 rows, the contract allows [1000000, None]" in note, note

    # found by a cold user: a run that failed at stage got no note at all
    run = env.runs["typo"]
    assert run["state"] == "failed", run
    states = env.task_states(run["dag_run_id"], DAG)
    assert states["stage"] == "failed" and states["validate"] == "upstream_failed", states
    note = _note(env, DAG, run)
    assert note.startswith("trainyard: validation not run"), note
    assert "failed: stage (unknown key(s) in the run's conf: 'epoch'" in note, note
    log = env.api(
        f"/api/v2/dags/{DAG}/dagRuns/{quote(run['dag_run_id'], safe='')}/taskInstances/stage/logs/1"
    )
    assert "unknown key(s) in the run's conf: 'epoch'" in json.dumps(log)


# ----------------------------------------------------------------------------- API + auth


def test_plugin_api_refuses_anonymous_and_forged_requests(env: Env) -> None:
    run = quote(_run_id(env, "rejected"), safe="")
    paths = [
        f"/trainyard/api/pipelines/{DAG}",
        f"/trainyard/api/runs/{DAG}/{run}",
        f"/trainyard/runs/{DAG}/{run}",
        f"/trainyard/pipelines/{DAG}",
        f"/trainyard/datadocs/{DAG}/{_snapshot(env)}/data_docs/index.html",
    ]
    forged = env.token[:-6] + ("AAAAAA" if not env.token.endswith("AAAAAA") else "BBBBBB")
    for path in paths:
        status, body, _ = env.get(path, token=None)
        assert status == 401, (path, status, body[:200])
        status, body, _ = env.get(path, token=forged)
        assert status == 403, (path, status, body[:200])


def test_plugin_api_serves_an_authenticated_user(env: Env) -> None:
    rejected = _run_id(env, "rejected")
    status, body, _ = env.get(f"/trainyard/api/runs/{DAG}/{quote(rejected, safe='')}")
    assert status == 200, body[:500]
    story = json.loads(body)
    assert story["gate"]["verdict"] == "reject"
    assert "accuracy" in story["gate"]["reason"]
    assert story["gate"]["champion_version"] == 1
    assert story["version"]["version"] == 2
    assert story["snapshot"]["reused"] is True and story["snapshot"]["data_docs"] is True
    assert story["champion"]["version"] == 1
    status, body, _ = env.get(f"/trainyard/api/pipelines/{DAG}")
    assert status == 200
    pipe = json.loads(body)
    assert [v["version"] for v in pipe["versions"]] == [1, 2]
    assert [e["event"] for e in pipe["history"]] == ["promote"]
    # not a trainyard DAG, or a run it never recorded: one clear 404
    status, body, _ = env.get("/trainyard/api/pipelines/example_bash_operator")
    assert status == 404 and b"not a trainyard pipeline" in body
    status, body, _ = env.get(f"/trainyard/api/runs/{DAG}/manual__nope")
    assert status == 404 and b"no record of run" in body
    # the page of a run that does not exist is a page, not JSON (found by a cold user)
    status, body, _ = env.get(f"/trainyard/runs/{DAG}/manual__nope")
    assert status == 404 and body.startswith(b"<!doctype html>") and b"no such run" in body
    # a NUL in a run id was a 500 (the database refuses the string): no such run
    for path in (f"/trainyard/api/runs/{DAG}/manual%00x", f"/trainyard/runs/{DAG}/a%00"):
        status, body, _ = env.get(path)
        assert status == 404, (path, status, body[:300])


def test_plugin_serves_files_only_from_inside_the_report(env: Env) -> None:
    snapshot = _snapshot(env)
    root = env.project.volume_root
    report = root / "digits" / "snapshots" / snapshot / "validation"
    docs = f"/trainyard/datadocs/{DAG}/{snapshot}"
    status, body, headers = env.get(f"{docs}/data_docs/index.html")
    assert status == 200 and b"<html" in body.lower()
    assert headers["Content-Security-Policy"].startswith("sandbox")
    status, body, _ = env.get(f"{docs}/summary.json")
    assert status == 200 and json.loads(body)["snapshot_id"] == snapshot

    outside = env.project.home / "secret.json"
    outside.write_text('{"secret": true}')
    (report / "data_docs" / "out_of_root.json").symlink_to(outside)
    (report / "data_docs" / "out_of_report.json").symlink_to(report.parent / "manifest.json")
    os.symlink(report.parent, report / "data_docs" / "up")
    try:
        for path, expected in [
            (f"{docs}/../manifest.json", (404,)),
            (f"{docs}/data_docs/..%2F..%2Fmanifest.json", (404,)),
            (f"{docs}/%2E%2E/%2E%2E/%2E%2E/_models/{PIPELINE}/champion.json", (404,)),
            (f"{docs}/data_docs/out_of_root.json", (404,)),
            (f"{docs}/data_docs/out_of_report.json", (404,)),
            (f"{docs}/data_docs/up/manifest.json", (404,)),
            (f"/trainyard/datadocs/{DAG}/..%2F..%2F_models/champion.json", (400, 404)),
            (f"/trainyard/datadocs/{DAG}/%2E%2E/digits/snapshots", (400, 404)),
        ]:
            status, body, _ = env.get(path)
            assert status in expected, (path, status, body[:300])
            assert b"secret" not in body and b"shards" not in body, path
    finally:
        for name in ("out_of_root.json", "out_of_report.json", "up"):
            (report / "data_docs" / name).unlink()


# ----------------------------------------------------------------------------- browser


@pytest.mark.browser
def test_browser_shows_run_and_pipeline_pages(env: Env) -> None:
    from playwright.sync_api import sync_playwright

    promoted, rejected = _run_id(env, "promoted"), _run_id(env, "rejected")
    shots = env.project.home / "screenshots"
    shots.mkdir(exist_ok=True)
    base = env.base
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        sign_in(page, base, env.password)

        # the rejected run: reason, both models' metrics, curves, Data Docs
        page.goto(f"{base}/trainyard/runs/{DAG}/{quote(rejected, safe='')}")
        assert page.locator(".verdict").first.inner_text() == "reject"
        reason = page.locator(".gate-reason").inner_text()
        assert "accuracy" in reason, reason
        metrics = page.locator("table.gate-metrics").inner_text()
        assert "candidate v2" in metrics and "champion v1" in metrics, metrics
        assert "accuracy" in metrics and "loss" in metrics
        assert page.locator("table.snapshot").inner_text().count("reused") == 1
        assert "no per-epoch history recorded" in page.inner_text("body")  # 0 epochs
        assert "serving now: version 1" in page.inner_text("body")
        assert "(answering at 127.0.0.1:" in page.inner_text("body")  # the server was asked
        link = page.locator("a.datadocs")
        assert link.get_attribute("href", timeout=5_000).endswith("/data_docs/index.html")
        page.screenshot(path=str(shots / "run_rejected.png"), full_page=True)
        link.click()
        page.wait_for_load_state("domcontentloaded")
        assert "/datadocs/" in page.url
        assert "expectation" in page.content().lower()
        page.screenshot(path=str(shots / "data_docs.png"))

        # the promoted run: reason, metrics, its training curves drawn, Data Docs link
        page.goto(f"{base}/trainyard/runs/{DAG}/{quote(promoted, safe='')}")
        assert page.locator(".verdict").first.inner_text() == "promote"
        assert "first run" in page.locator(".gate-reason").inner_text()
        metrics = page.locator("table.gate-metrics").inner_text()
        assert "candidate v1" in metrics and "accuracy" in metrics, metrics
        assert "accuracy" in page.locator("table.train-metrics").inner_text()
        assert page.locator("svg.chart").count() == 2  # loss, accuracy per epoch
        assert page.locator("svg.chart polyline").count() == 2
        # the holdout's confusion matrix: 10 digits, true by predicted, with recall
        assert page.locator("table.confusion tr").count() == 11
        assert page.locator("a.datadocs").count() == 1
        assert "this run deployed version 1" in page.inner_text("body")
        page.screenshot(path=str(shots / "run_promoted.png"), full_page=True)

        # a run whose snapshot validation rejected: the failed rule, the Data Docs
        invalid = env.runs["invalid"]["dag_run_id"]
        page.goto(f"{base}/trainyard/runs/{STRICT}/{quote(invalid, safe='')}")
        assert page.locator(".validation").inner_text() == "REJECTED"
        failed = page.locator("table.failed-rules").inner_text()
        assert "row_count" in failed, failed
        assert "not summarised" in page.inner_text("body")
        state = page.locator(".summary-state").inner_text()
        assert "the run failed at validate: " in state, state
        assert page.locator("a.datadocs").count() == 1
        page.screenshot(path=str(shots / "run_validation_rejected.png"), full_page=True)

        # a run that failed before any step recorded a result: where, not raw JSON
        typo = env.runs["typo"]["dag_run_id"]
        page.goto(f"{base}/trainyard/runs/{DAG}/{quote(typo, safe='')}")
        body = page.inner_text("body")
        assert "state: failed" in body and "It failed at stage" in body, body
        assert "unknown key(s) in the run's conf: 'epoch'" in body, body

        # the pipeline page
        page.goto(f"{base}/trainyard/pipelines/{DAG}")
        versions = page.locator("table.versions").inner_text()
        assert "champion" in versions and "reject" in versions and "promote" in versions
        assert _snapshot(env) in versions
        assert page.locator("svg.chart").count() >= 1
        page.screenshot(path=str(shots / "pipeline.png"), full_page=True)

        # the plugin's tab in Airflow's own run view (an iframe of the run page): the grid
        # shows gate and deploy skipped, the header the run's note
        page.goto(f"{base}/dags/{DAG}/runs/{quote(rejected, safe='')}")
        page.get_by_role("link", name="trainyard run").click()
        frame = page.frame_locator("iframe")
        frame.locator(".gate-reason").wait_for(timeout=30_000)
        assert "accuracy" in frame.locator(".gate-reason").inner_text()
        assert page.get_by_text("trainyard: snapshot").count() >= 1
        page.screenshot(path=str(shots / "airflow_run_tab.png"))
        frame.locator("a.datadocs").click()
        frame.get_by_text("Expectation Validation Result").wait_for(timeout=30_000)
        page.screenshot(path=str(shots / "airflow_run_tab_data_docs.png"))

        # the pipeline's tab in Airflow's DAG view
        page.goto(f"{base}/dags/{DAG}")
        page.get_by_role("link", name="trainyard versions").click()
        page.frame_locator("iframe").locator("table.versions").wait_for(timeout=30_000)
        page.screenshot(path=str(shots / "airflow_dag_tab.png"))
        browser.close()
    assert all((shots / n).stat().st_size > 0 for n in ("run_rejected.png", "pipeline.png"))
    print(f"screenshots: {shots}")
