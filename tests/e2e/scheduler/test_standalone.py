"""Airflow for real: standalone Airflow (scheduler, API server, dag-processor) on the
project's PostgreSQL (``trainyard.metadb``, a cluster in the test's folder).

* The UI: headless Chromium logs in, opens the digits DAG, changes a parameter in the
  typed trigger form (epochs), triggers, and the run succeeds with that parameter applied.
* A backfill for a new dataset: created through the API (as the UI's backfill form does)
  while the scheduler and the dag-processor write, answered at once (no "database is
  locked", no retry); over 2 days it stages 2 snapshots, validates each and trains once
  (in its last run); the earlier day cleared alone trains; a second backfill creates no
  snapshot and its earlier run trains nothing.
* Data-aware scheduling: a pipeline with ``trigger_on_dataset`` runs when the backfill
  publishes validated snapshots of its dataset (Asset events), on the event's snapshot.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.support.harness import BROWSER_ARGS, Project
from tests.support.scheduler import Scheduler

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

FORM = "digits_form"
"""The trigger form's pipeline (tests/support/scheduler.py)."""

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def _api(base: str, token: str, path: str) -> dict:
    req = urllib.request.Request(f"{base}{path}", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


@pytest.fixture(scope="module")
def standalone(scheduler: Scheduler) -> tuple[Project, str]:
    return scheduler.project, scheduler.base


def _token(base: str, password: str) -> str:
    req = urllib.request.Request(
        f"{base}/auth/token",
        data=json.dumps({"username": "admin", "password": password}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())["access_token"]


def _password(project: Project) -> str:
    passwords = Path(project.env["AIRFLOW_HOME"]) / "simple_auth_manager_passwords.json.generated"
    for _ in range(60):
        if passwords.exists():
            break
        time.sleep(1)
    return json.loads(passwords.read_text())["admin"]


def _runs(base: str, token: str, dag_id: str) -> list[dict]:
    return _api(base, token, f"/api/v2/dags/{dag_id}/dagRuns?order_by=logical_date")["dag_runs"]


def _wait_runs_done(
    base: str, token: str, dag_id: str, count: int, deadline_s: float
) -> list[dict]:
    end = time.monotonic() + deadline_s
    runs: list[dict] = []
    while time.monotonic() < end:
        runs = _runs(base, token, dag_id)
        done = [r for r in runs if r["state"] in ("success", "failed")]
        if len(runs) >= count and len(done) == len(runs):
            return runs
        time.sleep(1)
    raise TimeoutError(
        f"{dag_id}: runs not done after {deadline_s} s: {[r['state'] for r in runs]}"
    )


@pytest.mark.browser
def test_trigger_form_runs_the_pipeline_with_the_chosen_epochs(
    standalone: tuple[Project, str],
) -> None:
    from playwright.sync_api import sync_playwright

    project, base = standalone
    password = _password(project)
    shots = project.home / "screenshots"
    shots.mkdir(exist_ok=True)

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{base}/")
        page.get_by_label("Username").fill("admin")
        page.get_by_label("Password").fill(password)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(f"{base}/", timeout=30_000)

        for _ in range(60):  # the dag-processor parses the DAG file shortly after start
            page.goto(f"{base}/dags/trainyard_{FORM}")
            if page.get_by_role("button", name="Trigger").count():
                break
            time.sleep(2)
        page.get_by_role("button", name="Trigger").first.click()
        dialog = page.get_by_role("dialog")
        dialog.get_by_role("button", name="Training").click()
        epochs = dialog.locator("input[name=element_epochs]")
        assert epochs.input_value() == "2"
        epochs.fill("1")
        page.screenshot(path=str(shots / "trigger_form.png"))
        dialog.get_by_role("button", name="Trigger").click()

        token = _token(base, password)

        state, run = "none", {}
        deadline = time.monotonic() + 480
        while time.monotonic() < deadline:
            runs = _api(base, token, f"/api/v2/dags/trainyard_{FORM}/dagRuns")["dag_runs"]
            if runs:
                run = runs[-1]
                state = run["state"]
                if state in ("success", "failed"):
                    break
            time.sleep(1)
        page.goto(f"{base}/dags/trainyard_{FORM}/runs/{run.get('dag_run_id', '')}")
        page.wait_for_load_state("networkidle")
        page.screenshot(path=str(shots / "run.png"))
        browser.close()

    assert state == "success", f"run ended {state}; see {project.home}/airflow/logs"
    assert run["conf"]["epochs"] == 1
    meta = json.loads(
        (project.volume_root / "_models" / FORM / "versions" / "1" / "metadata.json").read_text()
    )
    assert meta["training"]["epochs"] == 1


def _create_backfill(base: str, token: str, reprocess: str) -> dict:
    """Create a backfill the way the UI's backfill form does (POST /api/v2/backfills).

    Sent once: on PostgreSQL the create does not meet a database lock while the scheduler
    and the dag-processor write (on SQLite it could answer 503 "database is locked").
    """
    body = {
        "dag_id": "trainyard_transactions",
        "from_date": "2026-11-02T01:30:00Z",
        "to_date": "2026-11-03T01:30:00Z",
        "reprocess_behavior": reprocess,
        "max_active_runs": 1,
    }
    req = urllib.request.Request(
        f"{base}/api/v2/backfills",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    began = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            created = json.loads(resp.read())
    except urllib.error.HTTPError as e:
        raise AssertionError(f"backfill create: {e.code} {e.read()[:2000]!r}") from e
    print(f"POST /api/v2/backfills ({reprocess}): {time.monotonic() - began:.2f} s")
    return created


@pytest.fixture(scope="module")
def backfilled() -> dict:
    """What the first backfill left, for the test that goes on from it."""
    return {}


def test_backfill_new_dataset_stages_each_interval_and_trains_once(
    standalone: tuple[Project, str], backfilled: dict
) -> None:
    project, base = standalone
    token = _token(base, _password(project))
    for dag_id in ("trainyard_transactions", "trainyard_transactions_shadow"):
        out = project.airflow("dags", "unpause", dag_id, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
    first = _create_backfill(base, token, "none")
    # Unpausing also schedules the latest interval (catchup is off): that run is not part
    # of the backfill and is told apart by its run type.
    runs = _wait_runs_done(base, token, "trainyard_transactions", 3, 480)
    backfill = [r for r in runs if r["run_type"] == "backfill"]
    assert len(backfill) == 2, runs
    assert [r["state"] for r in backfill] == ["success"] * 2, backfill

    root = project.volume_root / "transactions"
    days = ("2026-11-02", "2026-11-03")
    intervals = {
        p.name: json.loads(p.read_text())
        for p in (root / "intervals").glob("*.json")
        if p.name.startswith(days)
    }
    assert len(intervals) == 2, sorted(intervals)
    backfill_snapshots = {i["snapshot_id"] for i in intervals.values()}
    assert len(backfill_snapshots) == 2, "one snapshot per interval"
    snapshots = sorted(p.name for p in (root / "snapshots").iterdir())
    assert backfill_snapshots <= set(snapshots)

    versions = root.parent / "_models" / "transactions" / "versions"
    metas = [json.loads((v / "metadata.json").read_text()) for v in versions.iterdir()]
    from_backfill = [m for m in metas if m["run_id"].startswith("backfill__")]
    assert len(from_backfill) == 1, "a backfill trains once, in its last run"
    last_day = intervals[max(intervals)]
    assert from_backfill[0]["snapshot_id"] == last_day["snapshot_id"]

    # Data-aware scheduling: the shadow pipeline ran on validated snapshots of its dataset.
    shadow = _wait_runs_done(base, token, "trainyard_transactions_shadow", 1, 480)
    assert {r["run_type"] for r in shadow} == {"asset_triggered"}
    assert len(shadow) <= 4, "at most one run per new snapshot (no trigger loop)"
    assert all(r["state"] == "success" for r in shadow), shadow
    shadow_meta = [
        json.loads((v / "metadata.json").read_text())
        for v in (root.parent / "_models" / "transactions_shadow" / "versions").iterdir()
    ]
    assert shadow_meta and {m["snapshot_id"] for m in shadow_meta} <= set(snapshots)
    runs = _wait_runs_done(base, token, "trainyard_transactions", 3, 480)
    snapshots = sorted(p.name for p in (root / "snapshots").iterdir())
    backfilled.update(first=first, backfill=backfill, snapshots=snapshots)


def test_a_second_backfill_after_a_cleared_day_overwrites_nothing(
    standalone: tuple[Project, str], backfilled: dict
) -> None:
    """Goes on from the backfill of the test before (one scenario, in two tests so that
    each phase has the suite's 600 s)."""
    if not backfilled:
        pytest.fail("the backfill of the test before did not finish")
    project, base = standalone
    token = _token(base, _password(project))
    first, backfill, snapshots = (
        backfilled["first"],
        backfilled["backfill"],
        backfilled["snapshots"],
    )
    root = project.volume_root / "transactions"

    # A second backfill over the same days re-runs them and overwrites nothing.
    stamps = {p.name: p.stat().st_mtime_ns for p in (root / "intervals").iterdir()}
    first_ends = {r["dag_run_id"]: r["end_date"] for r in backfill}
    end = time.monotonic() + 300  # the scheduler closes a backfill shortly after its runs
    while _api(base, token, f"/api/v2/backfills/{first['id']}").get("completed_at") is None:
        assert time.monotonic() < end, "the first backfill never completed"
        time.sleep(1)
    # The earlier day cleared alone trains (nothing later is queued) on the window as of it.
    earlier = sorted(backfill, key=lambda r: r["logical_date"])[0]
    from trainyard.layout import run_key

    earlier_record = root.parent / "_models" / "transactions" / "runs"
    earlier_record = earlier_record / f"{run_key(earlier['dag_run_id'])}.json"
    when = earlier["logical_date"]
    out = project.airflow(
        "tasks", "clear", "trainyard_transactions", "-s", when, "-e", when, "--yes", timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    end = time.monotonic() + 480
    while (run := _api(base, token, f"/api/v2/dags/trainyard_transactions/dagRuns/"
                       f"{earlier['dag_run_id']}"))["end_date"] in (None, earlier["end_date"]) or (
        run["state"] not in ("success", "failed")
    ):  # fmt: skip
        assert time.monotonic() < end, f"the cleared run never ended: {run}"
        time.sleep(1)
    assert "register" in json.loads(earlier_record.read_text()), "it trained"
    first_ends[earlier["dag_run_id"]] = run["end_date"]

    # this one with the tutorial's command (the CLI), the first as the UI's form does (the
    # API): on PostgreSQL neither meets a lock while the scheduler and dag-processor write
    out = project.airflow(
        "backfill", "create", "--dag-id", "trainyard_transactions",
        "--from-date", "2026-11-02T01:30:00Z", "--to-date", "2026-11-03T01:30:00Z",
        "--reprocess-behavior", "completed", "--max-active-runs", "1", timeout=300,
    )  # fmt: skip
    said = out.stdout + out.stderr
    assert out.returncode == 0 and "locked" not in said.lower(), said[-3000:]
    end = time.monotonic() + 480
    while time.monotonic() < end:
        runs = _wait_runs_done(base, token, "trainyard_transactions", 3, 480)
        backfill = [r for r in runs if r["run_type"] == "backfill"]
        if all(r["end_date"] != first_ends.get(r["dag_run_id"]) for r in backfill):
            break
        time.sleep(1)
    assert all(r["state"] == "success" for r in backfill), backfill
    # reprocessed, the earlier run skipped training: its record names no version (its
    # register result was the cleared try's)
    again = json.loads(earlier_record.read_text())
    assert "register" not in again and "train" not in again, again
    records = {p.name: json.loads(p.read_text()) for p in (root / "intervals").iterdir()}
    assert sorted(p.name for p in (root / "snapshots").iterdir()) == snapshots, records
    assert {p.name: p.stat().st_mtime_ns for p in (root / "intervals").iterdir()} == stamps
    log = (project.home / "standalone.log").read_text(errors="replace").lower()
    assert "database is locked" not in log
