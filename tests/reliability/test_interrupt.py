"""Ctrl-C stops a run for good (issue 38).

Found by a new user: Ctrl-C during ``make run``'s training became a failed try, Airflow
retried it 30 s later, and the retry trained, passed the gate and deployed; nothing was
printed after ``^C``. Here SIGINT goes to the whole foreground process group, as a
terminal sends it, mid-training, to ``make run``'s command (``python -m trainyard
dag-test``, real Airflow) and to ``python -m trainyard run``: each exits within 10 s with
one line saying so, the workers are gone, nothing is registered or deployed, and the
Airflow run is failed, its train task not retried. A second ``make run`` meanwhile is
refused at once, naming the first.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.support.harness import ROOT, Project, init_airflow, make_project

pytestmark = [pytest.mark.slow]

EPOCHS = 40


def _start(project: Project, *argv: str) -> subprocess.Popen[str]:
    """A command in a process group of its own: the terminal's foreground group."""
    return subprocess.Popen(
        [sys.executable, "-m", "trainyard", *argv],
        env=project.env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        # as a terminal's shell starts it: SIGINT not ignored (make test may run where a
        # shell ignores it, as for a background job, and children inherit that)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _workers() -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if (p.info["cmdline"] or [])[1:4] == ["-m", "trainyard", "worker"]:
                found.append(p)
        except (psutil.Error, IndexError):
            continue
    return found


def _mine(workers: list[psutil.Process], volume_root: Path) -> list[psutil.Process]:
    """The training workers of this test's project (other projects may train meanwhile)."""
    out = []
    for w in workers:
        try:
            if str(volume_root) in " ".join(w.cmdline()):
                out.append(w)
        except psutil.Error:
            continue
    return out


def _wait_for_training(log: Path, proc: subprocess.Popen[str], deadline_s: float = 600) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            pytest.fail(f"ended before training ({proc.returncode}): {proc.stdout.read()[-3000:]}")
        text = log.read_text(errors="replace") if log.is_file() else ""
        if f"Epoch 2/{EPOCHS}" in text:
            return
        time.sleep(0.5)
    pytest.fail("training never reached its second epoch")


def _interrupt(proc: subprocess.Popen[str]) -> tuple[int, str, float]:
    """SIGINT to the command's process group, as Ctrl-C; its exit code, output, seconds."""
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"still running 60 s after SIGINT: {out[-3000:]}")
    return proc.returncode, out, time.monotonic() - t0


def _json(stdout: str) -> list[dict]:
    """The JSON list an ``airflow ... -o json`` command printed after its warnings."""
    return json.loads(next(line for line in reversed(stdout.splitlines()) if line[:1] == "["))


def _nothing_left(project: Project, workers: list[psutil.Process]) -> None:
    _gone, alive = psutil.wait_procs(workers, timeout=5)
    assert alive == [], f"training workers outlived the interrupt: {[p.pid for p in alive]}"
    models = project.volume_root / "_models" / "digits"
    assert not list(models.glob("versions/*")), "a version was registered"
    assert not (models / "champion.json").exists(), "something was deployed"


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Project:
    proj = make_project(tmp_path_factory.mktemp("interrupt"))
    init_airflow(proj)
    yield proj
    proj.stop_server()


def test_ctrl_c_stops_make_run_for_good(project: Project) -> None:
    logs = project.home / "dags_test"
    first = _start(project, "dag-test", "--pipeline", "digits", "--conf", f'{{"epochs": {EPOCHS}}}')
    deadline = time.monotonic() + 120
    while not list(logs.glob("digits-*.log")) and time.monotonic() < deadline:
        time.sleep(0.2)
    (log,) = logs.glob("digits-*.log")
    assert (project.home / "last_dags_test.log").resolve() == log.resolve()
    _wait_for_training(log, first)
    workers = _mine(_workers(), project.volume_root)
    assert len(workers) == 2, workers

    # a second make run meanwhile: refused at once, naming the first
    t0 = time.monotonic()
    second = subprocess.run(
        [sys.executable, "-m", "trainyard", "dag-test", "--pipeline", "digits"],
        env=project.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode == 1, second
    holder = f"`make run` (airflow dags test trainyard_digits), pid {first.pid}"
    assert f"is being run already ({holder}" in second.stderr
    assert str(log) in second.stderr and time.monotonic() - t0 < 15
    assert list(logs.glob("digits-*.log")) == [log], "the refused run wrote a log"

    code, out, seconds = _interrupt(first)
    assert code == 130, out[-3000:]
    assert seconds <= 10, f"{seconds:.1f} s after SIGINT"
    said = [line for line in out.splitlines() if "interrupted by the user" in line]
    assert len(said) == 1 and said[0].startswith("make run: interrupted by the user: run "), out
    assert "nothing was registered or deployed" in said[0]
    _nothing_left(project, workers)

    run_id = said[0].split(" run ", 1)[1].split(" of ", 1)[0]
    states = project.airflow(
        "tasks", "states-for-dag-run", "trainyard_digits", run_id, "-o", "json"
    )
    assert states.returncode == 0, states.stderr[-2000:]
    by_task = {t["task_id"]: t for t in _json(states.stdout)}
    assert by_task["train"]["state"] == "failed"
    assert by_task["register"]["state"] in ("upstream_failed", None)
    assert by_task["deploy"]["state"] in ("upstream_failed", None)
    runs = project.airflow("dags", "list-runs", "trainyard_digits", "-o", "json")
    assert {r["run_id"]: r["state"] for r in _json(runs.stdout)}[run_id] == "failed"
    failure = project.volume_root / "_models/digits/runs"
    assert any("interrupted by the user" in p.read_text() for p in failure.glob("*.failed.json"))
    # the log says why the train task failed, and that no retry followed
    text = log.read_text(errors="replace")
    assert "interrupted by the user during train: not retried" in text
    assert "up_for_retry" not in text.lower()


def test_ctrl_c_stops_trainyard_run(project: Project) -> None:
    proc = _start(project, "run", "--pipeline", "digits", "--overrides", f'{{"epochs": {EPOCHS}}}')
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            pytest.fail("trainyard run ended before training:\n" + "".join(lines[-40:]))
        lines.append(line)
        if f"Epoch 2/{EPOCHS}" in line:
            break
    workers = _mine(_workers(), project.volume_root)
    assert len(workers) == 2, workers
    code, out, seconds = _interrupt(proc)
    assert code == 130, out[-3000:]
    assert seconds <= 10, f"{seconds:.1f} s after SIGINT"
    said = [line for line in out.splitlines() if "interrupted by the user" in line]
    assert said[-1].startswith("trainyard run: interrupted by the user: the run stopped"), out
    assert "nothing was registered or deployed" in said[-1]
    _nothing_left(project, workers)
    records = list((project.volume_root / "_models/digits/runs").glob("cli__*.failed.json"))
    assert [json.loads(p.read_text())["reason"] for p in records] == [
        "interrupted by the user (during train)"
    ]


def test_ctrl_c_during_a_step_stops_it_and_starts_nothing_after(project: Project) -> None:
    """Found by a new user: Ctrl-C while ``validate`` ran (a step process in a session of
    its own, as its pod) left it running; Airflow went on to train, register and evaluate
    after ``make run`` had printed that nothing was registered."""
    logs = project.home / "dags_test"
    before = set(logs.glob("digits-*.log"))
    proc = _start(project, "dag-test", "--pipeline", "digits", "--conf", '{"force_retrain": true}')
    deadline = time.monotonic() + 300
    log = None
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        log = next(iter(set(logs.glob("digits-*.log")) - before), None)
        if log is not None and "-m trainyard validate" in log.read_text(errors="replace"):
            break
        time.sleep(0.2)
    else:
        pytest.fail("validate never started")
    code, out, seconds = _interrupt(proc)
    assert code == 130, out[-3000:]
    assert seconds <= 10, f"{seconds:.1f} s after SIGINT"
    assert "nothing was registered or deployed" in out, out
    time.sleep(10)  # what a step left running would do meanwhile
    left = []
    for p in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if str(project.volume_root) in " ".join(p.info["cmdline"] or []) and "serve" not in (
                p.info["cmdline"] or []
            ):
                left.append(p.info["cmdline"])
    assert left == [], left
    _nothing_left(project, [])
    launched = set(re.findall(r"-m trainyard (\w+)", log.read_text(errors="replace")))
    assert launched <= {"stage", "validate"}, launched
