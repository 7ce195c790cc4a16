"""The launcher's liveness rules, driven by small real worker programs (no TensorFlow)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import psutil
import pytest

from trainyard.errors import TrainingError
from trainyard.training import spec
from trainyard.training.launcher import LaunchSpec, TaskSpec, launch

ROOT = Path(__file__).resolve().parents[2]

# A stand-in worker: prints the ready marker and its TF_CONFIG, then follows its script,
# chosen per (task, attempt) by the BEHAVIOUR json: "ok", "crash", "hang", "never_ready",
# "nan", "bad_input", "skip_code" (exit 4), "spawn_and_hang" (leaves a grandchild in its
# process group).
WORKER = r"""
import json, os, subprocess, sys, time
from trainyard.training.worker.tf_config import resolve_tf_config
cfg = resolve_tf_config(os.environ)
name = f"{cfg['task']['type']}:{cfg['task']['index']}"
attempt = os.environ["TRAINYARD_ATTEMPT"]
plan = json.loads(sys.argv[1])
what = plan.get(f"{name}@{attempt}", plan.get(name, "ok"))
if what == "never_ready":
    time.sleep(600)
print("TRAINYARD_WORKER_READY", json.dumps(cfg), flush=True)
if what == "crash":
    time.sleep(0.3); print("boom: simulated crash", flush=True); sys.exit(9)
if what == "nan":
    print("TRAINYARD_LOSS_NAN loss became NaN", flush=True); sys.exit(3)
if what == "bad_input":
    print("SnapshotError: /x/manifest.json: manifest not found", flush=True); sys.exit(3)
if what == "skip_code":
    print("exit 4 is no worker's code", flush=True); sys.exit(4)
if what == "spawn_and_hang":
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print("grandchild", child.pid, flush=True)
    time.sleep(600)
if what == "hang":
    time.sleep(600)
time.sleep(0.2)
print("done", flush=True)
"""


def _tasks(plan: dict[str, str], roles: list[tuple[str, int]]) -> list[TaskSpec]:
    """Tasks as the rendered Jobs give them: the Indexed Job environment, no TF_CONFIG."""
    counts: dict[str, int] = {}
    for role, _ in roles:
        counts[role] = counts.get(role, 0) + 1
    jobs = {r: {"job": f"job-t-{r}", "replicas": n} for r, n in counts.items()}
    tasks = []
    for role, index in roles:
        env = dict(os.environ)
        env.update(
            {
                spec.ENV_TASK_TYPE: role,
                spec.ENV_JOBS: json.dumps(jobs),
                spec.ENV_SERVICE: "t",
                spec.ENV_INDEX: str(index),
                "PYTHONPATH": str(ROOT / "plugins"),
            }
        )
        argv = [sys.executable, "-c", WORKER, json.dumps(plan)]
        tasks.append(TaskSpec(f"{role}:{index}", argv, env, f"job-t-{role}-{index}.t"))
    return tasks


def _spec(plan: dict[str, str], **kw) -> LaunchSpec:  # type: ignore[no-untyped-def]
    roles = kw.pop("roles", [("worker", 0), ("worker", 1)])
    base = dict(
        tasks=_tasks(plan, roles), start_deadline_s=10, attempt_timeout_s=30, max_attempts=3
    )
    base.update(kw)
    return LaunchSpec(**base)


def _no_children() -> None:
    deadline = time.monotonic() + 5
    while psutil.Process().children(recursive=True) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert psutil.Process().children(recursive=True) == []


@pytest.mark.parametrize(
    ("plan", "kw", "attempts"),
    [
        ({}, {}, 1),
        ({"worker:1@1": "crash"}, {}, 2),
        ({"worker:0@1": "crash", "worker:1@2": "crash"}, {}, 3),
        (
            {"chief:0": "ok", "worker:0": "hang", "worker:1": "hang", "ps:0": "hang"},
            {
                "roles": [("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0)],
                "success_roles": ("chief",),
            },
            1,
        ),
    ],
    ids=["clean", "crash-then-ok", "two-crashes-then-ok", "ps-servers-stopped-after-chief"],
)
def test_attempts_until_success(plan: dict[str, str], kw: dict, attempts: int) -> None:
    lines: list[str] = []
    assert launch(_spec(plan, **kw), lines.append) == attempts
    ready = [
        json.loads(ln.split("TRAINYARD_WORKER_READY ", 1)[1])
        for ln in lines
        if "] TRAINYARD_WORKER_READY " in ln
    ]
    # every attempt got its own fresh ports
    per_attempt = {json.dumps(c["cluster"], sort_keys=True) for c in ready}
    assert len(per_attempt) == attempts
    # the Service's DNS names became loopback addresses, derived as in a pod
    assert all(
        a.startswith("127.0.0.1:") for c in ready for addrs in c["cluster"].values() for a in addrs
    )
    assert all(ln.startswith(("[worker:", "[chief:", "[ps:", "attempt ")) for ln in lines)
    _no_children()


@pytest.mark.parametrize(
    ("plan", "kw", "message", "max_seconds"),
    [
        (
            {"worker:1": "crash"},
            {"max_attempts": 2},
            r"failed after 2 attempt\(s\):\n"
            r"  attempt 1: worker:1 died \(exit code 9\) .*boom: simulated crash\n"
            r"  attempt 2: worker:1 died",
            10,
        ),
        (
            {"worker:1": "never_ready"},
            {"max_attempts": 1, "start_deadline_s": 1.5},
            r"attempt 1: worker:1 not ready within the start deadline of 1.5s",
            8,
        ),
        (
            {"worker:0": "hang", "worker:1": "hang"},
            {"max_attempts": 1, "attempt_timeout_s": 2},
            r"attempt 1 exceeded its time limit of 2s",
            9,
        ),
        ({"worker:1": "nan"}, {}, r"^loss became NaN .*worker:1 during attempt 1", 6),
        (
            {"worker:0": "bad_input"},
            {},
            r"^worker:0 rejected its input: SnapshotError: /x/manifest.json",
            6,
        ),
        (
            {"worker:0": "skip_code"},
            {"max_attempts": 2},
            r"attempt 1: worker:0 died \(exit code 4\) .*\n  attempt 2: worker:0 died",
            10,
        ),
    ],
    ids=[
        "too-many-crashes",
        "start-deadline",
        "attempt-timeout",
        "nan-not-retried",
        "bad-input-not-retried",
        "exit-4-is-a-crash",
    ],
)
def test_failures_end_in_one_clear_error(
    plan: dict, kw: dict, message: str, max_seconds: float
) -> None:
    t0 = time.monotonic()
    with pytest.raises(TrainingError, match=message):
        launch(_spec(plan, **kw), lambda _line: None)
    assert time.monotonic() - t0 < max_seconds
    _no_children()


def test_stops_whole_process_groups(tmp_path: Path) -> None:
    lines: list[str] = []
    with pytest.raises(TrainingError, match="time limit"):
        launch(
            _spec(
                {"worker:0": "spawn_and_hang", "worker:1": "hang"},
                max_attempts=1,
                attempt_timeout_s=2,
            ),
            lines.append,
        )
    pids = [int(ln.split()[-1]) for ln in lines if "] grandchild" in ln]
    assert len(pids) == 1
    assert (
        not psutil.pid_exists(pids[0]) or psutil.Process(pids[0]).status() == psutil.STATUS_ZOMBIE
    )
