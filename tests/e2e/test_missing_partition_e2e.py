"""A day whose file does not exist yet, through real Airflow (``dags test``).

``when_missing: skip``: the run succeeds with its tasks skipped and the reason logged.
``when_missing: wait``: a sensor waits (reschedule mode) until the file appears, then the
run stages and validates it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.support.daily_csv import pipeline as pipeline_dict
from tests.support.daily_csv import use_contracts, write_days
from tests.support.harness import ROOT, Project, init_airflow, make_project

# each test runs a few whole DAG runs; on a shared 2-core machine one takes minutes
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DAY, RUN = "2026-11-02", "2026-11-03T03:00:00+00:00"  # the 03:00 run covers the day before


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Project:
    tmp = tmp_path_factory.mktemp("missing")
    proj = make_project(tmp)
    use_contracts(proj.env, tmp / "contracts")
    for mode, extra in (("skip", {}), ("wait", {"wait_poke_s": 2, "wait_timeout_s": 600})):
        cfg = pipeline_dict(tmp / f"raw_{mode}", source={"when_missing": mode, **extra})
        cfg["name"] = cfg["serving"]["model_name"] = f"cancer_{mode}"
        cfg["serving"]["port"] = proj.port
        (tmp / "pipelines" / f"cancer_{mode}.yaml").write_text(yaml.safe_dump(cfg))
    init_airflow(proj)
    return proj


def _states(project: Project, pipeline: str) -> dict[str, str]:
    record = json.loads((project.volume_root / "_models" / pipeline / "last_run.json").read_text())
    out = project.airflow(
        "tasks", "states-for-dag-run", f"trainyard_{pipeline}", record["run_id"], "-o", "json"
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return {t["task_id"]: t["state"] for t in json.loads(out.stdout)}


def test_skip_shows_the_run_skipped_not_failed(project: Project) -> None:
    out = project.airflow("dags", "test", "trainyard_cancer_skip", RUN)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    assert f"{DAY}.csv: source does not exist: nothing to stage" in text
    states = _states(project, "cancer_skip")
    assert states["stage"] == "skipped"
    assert {states[t] for t in ("validate", "train", "register", "evaluate", "deploy")} == {
        "skipped"
    }
    assert states["summary"] == "success"
    assert not (project.volume_root / "cancer" / "snapshots").exists()


def test_wait_stages_the_file_once_it_appears(project: Project) -> None:
    exe = str(Path(sys.executable).with_name("airflow"))
    argv = [exe, "dags", "test", "trainyard_cancer_wait", RUN, "--conf", '{"dry_run": true}']
    proc = subprocess.Popen(
        argv, env=project.env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []
    waiting = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "is not there yet" in line:
                waiting.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert waiting.wait(600), "".join(lines)[-4000:]
        time.sleep(3)  # at least one more poke finds nothing
        write_days(project.home / "raw_wait", [DAY])
        assert proc.wait(900) == 0, "".join(lines)[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(10)
    text = "".join(lines)
    assert text.count("is not there yet") >= 2
    assert "is there" in text
    states = _states(project, "cancer_wait")
    assert states["wait_for_source"] == "success" and states["stage"] == "success"
    assert states["validate"] == "success"
    record = json.loads(
        (project.volume_root / "_models" / "cancer_wait" / "last_run.json").read_text()
    )
    assert record["stage"]["rows"] == 569 and record["validate"]["success"] is True
