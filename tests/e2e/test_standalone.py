"""The Airflow UI for real: standalone Airflow, headless Chromium, the typed trigger form.

Logs in, opens the digits DAG, changes a parameter in the trigger form (epochs), triggers,
and waits for the run to succeed with that parameter applied to the trained model.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.harness import ROOT, Project, free_port, make_project

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.slow]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
BROWSER_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _wait_http(url: str, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1)
    raise TimeoutError(f"{url} did not answer within {deadline_s} s")


def _api(base: str, token: str, path: str) -> dict:
    req = urllib.request.Request(f"{base}{path}", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


@pytest.fixture
def standalone(tmp_path: Path) -> tuple[Project, str]:
    api_port = free_port()
    # manual runs only: unpausing from the form must not add a scheduled run
    project = make_project(
        tmp_path, {"training": {"epochs": 2}, "schedule": None}, api_port=api_port
    )
    project.env["AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION"] = "True"
    log = (tmp_path / "standalone.log").open("w")
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("airflow")), "standalone"],
        env=project.env,
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{api_port}"
    try:
        _wait_http(f"{base}/api/v2/monitor/health", 240)
        pool = project.airflow("pools", "set", "trainyard_training", "1", "training", timeout=120)
        assert pool.returncode == 0, pool.stderr[-2000:]
        yield project, base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        # LocalExecutor workers may linger after the supervisor exits.
        subprocess.run(["pkill", "-9", "-f", str(project.home)], check=False)
        project.stop_server()
        log.close()


def test_trigger_form_runs_the_pipeline_with_the_chosen_epochs(
    standalone: tuple[Project, str],
) -> None:
    from playwright.sync_api import sync_playwright

    project, base = standalone
    passwords = Path(project.env["AIRFLOW_HOME"]) / "simple_auth_manager_passwords.json.generated"
    for _ in range(60):
        if passwords.exists():
            break
        time.sleep(1)
    password = json.loads(passwords.read_text())["admin"]
    shots = project.home / "screenshots"
    shots.mkdir()

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{base}/")
        page.get_by_label("Username").fill("admin")
        page.get_by_label("Password").fill(password)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(f"{base}/", timeout=30_000)

        for _ in range(60):  # the dag-processor parses the DAG file shortly after start
            page.goto(f"{base}/dags/trainyard_digits")
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

        req = urllib.request.Request(
            f"{base}/auth/token",
            data=json.dumps({"username": "admin", "password": password}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            token = json.loads(resp.read())["access_token"]

        state, run = "none", {}
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            runs = _api(base, token, "/api/v2/dags/trainyard_digits/dagRuns")["dag_runs"]
            if runs:
                run = runs[-1]
                state = run["state"]
                if state in ("success", "failed"):
                    break
            time.sleep(5)
        page.goto(f"{base}/dags/trainyard_digits/runs/{run.get('dag_run_id', '')}")
        page.wait_for_load_state("networkidle")
        page.screenshot(path=str(shots / "run.png"))
        browser.close()

    assert state == "success", f"run ended {state}; see {project.home}/airflow/logs"
    assert run["conf"]["epochs"] == 1
    meta = json.loads(
        (
            project.volume_root / "_models" / "digits" / "versions" / "1" / "metadata.json"
        ).read_text()
    )
    assert meta["training"]["epochs"] == 1
