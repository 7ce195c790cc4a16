"""Benchmark: the digits DAG under ``airflow dags test`` against its own training time.

Each round runs ``airflow dags test trainyard_digits`` as ``make run`` does (a PostgreSQL
of the project's kind, the local runner: every step the very command its pod runs), on a
fresh volume (a first run: staging from the raw files, no champion, the model server
started by deploy, then stopped), and then the same command on a DAG of Airflow's own:
the same nine task ids and edges as ``EmptyOperator``s (what ``airflow dags test`` itself
costs for this shape, nothing of ours). Rounds alternate the order of the two. The
benchmark has a database and an Airflow home of its own in a temporary folder (the
project's ``.trainyard/`` is not touched), stopped at the end.

From each digits run's log: the run's duration (Airflow's ``run_duration``), its training
seconds (the train task's result: the Jobs' pods from start to the last exit), each task's
wall time, and each step process's start-up as the step logs it (``<step>: started after
X s (python and trainyard ..., great_expectations ...)``: from the process's start to its
work, its heavy libraries imported).

    python benchmarks/orchestration_tax.py [--rounds 3]

Last line: ``BENCH orchestration_tax ratio=<DAG run s / training s> ours=<DAG run s>
baseline=<training s> airflow_floor=<the EmptyOperator DAG's run s> startup_max=<s> ...``
(medians over the rounds; lower is better, 1.0 would be a DAG that costs nothing beyond
its training).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DAG_ID = "trainyard_digits"
FLOOR_DAG_ID = "airflow_floor"

FLOOR_FILE = '''"""Airflow's floor: the digits DAG's task ids and edges as EmptyOperators."""
import json
import os

import pendulum
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG

with open(os.environ["FLOOR_DAG_SPEC"]) as f:
    edges = json.load(f)
with DAG("airflow_floor", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
    tasks = {t: EmptyOperator(task_id=t) for t in edges}
    for t, upstream in edges.items():
        for u in upstream:
            tasks[u] >> tasks[t]
'''

RUN_DURATION = re.compile(r"DagRun Finished: dag_id=(\S+?),.*?run_duration=([\d.]+).*?state=(\w+)")
TRAIN_SECONDS = re.compile(r"-m trainyard register .*--seconds ([\d.]+)")
STARTED = re.compile(r"trainyard\.steps: (\w+): started after ([\d.]+) s \((.*?)\)")
STAMP = r"^(\S+Z) .*"
TASK_START = re.compile(STAMP + r"\[DAG TEST\] starting task_id=(\w+)")
TASK_END = re.compile(STAMP + r"\[DAG TEST\] end task task_id=(\w+)")


def _env(tmp: Path, dags_folder: Path | None = None) -> dict[str, str]:
    """The benchmark's own volume, PostgreSQL and Airflow home, in ``tmp``."""
    env = dict(os.environ)
    env.update(
        TRAINYARD_VOLUME_ROOT=str(tmp / "volumes"),
        TRAINYARD_POSTGRES_DIR=str(tmp / "postgres"),
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"postgresql+psycopg2://airflow@/airflow?host={tmp}/postgres",
        AIRFLOW_HOME=str(tmp / "airflow"),
    )
    if dags_folder is not None:
        env["AIRFLOW__CORE__DAGS_FOLDER"] = str(dags_folder)
    return env


def _run(argv: list[str], env: dict[str, str]) -> None:
    proc = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")


def _stamp(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def dags_test(dag_id: str, env: dict[str, str], log_path: Path) -> float:
    """Run ``airflow dags test dag_id``; its log goes to ``log_path``; returns its wall time."""
    t0 = time.perf_counter()
    with log_path.open("w") as log:
        proc = subprocess.run(
            ["airflow", "dags", "test", dag_id],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
            timeout=3600,
            check=False,
        )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-40:])
        raise SystemExit(f"airflow dags test {dag_id} failed ({log_path}):\n{tail}")
    return wall


def read_run(log_path: Path) -> dict:
    """The run's duration, training seconds, task wall times and step start-ups."""
    text = log_path.read_text(errors="replace")
    runs = RUN_DURATION.findall(text)
    if not runs or runs[-1][2] != "success":
        raise SystemExit(f"{log_path}: the run did not succeed: {runs}")
    out: dict = {"run_s": float(runs[-1][1]), "tasks": {}, "startup": {}}
    if m := TRAIN_SECONDS.search(text):
        out["train_s"] = float(m.group(1))
    starts: dict[str, float] = {}
    for line in text.splitlines():
        if m := TASK_START.match(line):
            starts[m.group(2)] = _stamp(m.group(1))
        elif (m := TASK_END.match(line)) and m.group(2) in starts:
            out["tasks"][m.group(2)] = _stamp(m.group(1)) - starts[m.group(2)]
        elif m := STARTED.search(line):
            out["startup"][m.group(1)] = (float(m.group(2)), m.group(3))
    return out


def floor_spec(folder: Path) -> Path:
    """The digits DAG's task ids and edges, as the floor DAG file reads them."""
    code = (
        "import json, runpy; ns = runpy.run_path('dags/trainyard_pipelines.py'); "
        f"d = ns['{DAG_ID}']; "
        "print(json.dumps({t.task_id: sorted(t.upstream_task_ids) for t in d.tasks}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    spec = folder / "floor_spec.json"
    spec.write_text(out.stdout.strip().splitlines()[-1])
    return spec


def stop_server(env: dict[str, str]) -> None:
    """Stop the model server the run's deploy started (its serving root is the volume's)."""
    code = (
        "from trainyard.serving.deploy import stop_local_server; "
        "from trainyard.settings import get_settings; "
        "stop_local_server(get_settings().serving_root)"
    )
    subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, check=False, timeout=60)


def _med(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} s ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    """Run the rounds and print the BENCH line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--keep", type=Path, help="keep the logs in this folder")
    args = parser.parse_args()
    import socket

    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", 8501)) == 0:
            raise SystemExit("127.0.0.1:8501 is taken (a model server of make run?): make stop")
    runs: list[dict] = []
    floors: list[float] = []
    with tempfile.TemporaryDirectory(prefix="trainyard-bench-tax-") as tmp_name:
        tmp = args.keep or Path(tmp_name)
        tmp.mkdir(parents=True, exist_ok=True)
        env = _env(tmp)
        floor_dags = tmp / "floor_dags"
        floor_dags.mkdir(exist_ok=True)
        (floor_dags / "airflow_floor.py").write_text(FLOOR_FILE)
        floor_env = {**_env(tmp, floor_dags), "FLOOR_DAG_SPEC": str(floor_spec(tmp))}
        # what `make airflow-init` makes, in the benchmark's own folder
        _run([sys.executable, "-m", "trainyard.metadb", "start"], env)
        try:
            _run(["airflow", "db", "migrate"], env)
            _run(["airflow", "pools", "set", "trainyard_training", "1", "training"], env)
            for r in range(args.rounds):
                for side in ["ours", "floor"] if r % 2 == 0 else ["floor", "ours"]:
                    if side == "floor":
                        log_path = tmp / f"floor_{r}.log"
                        dags_test(FLOOR_DAG_ID, floor_env, log_path)
                        floors.append(read_run(log_path)["run_s"])
                        print(f"round {r + 1}: Airflow's floor {floors[-1]:.1f} s", flush=True)
                        continue
                    shutil.rmtree(tmp / "volumes", ignore_errors=True)  # a first run each time
                    log_path = tmp / f"digits_{r}.log"
                    try:
                        wall = dags_test(DAG_ID, env, log_path)
                    finally:
                        stop_server(env)
                    run = read_run(log_path)
                    run["wall_s"] = wall
                    runs.append(run)
                    ups = ", ".join(f"{s} {v[0]:.2f}" for s, v in run["startup"].items())
                    print(
                        f"round {r + 1}: digits run {run['run_s']:.1f} s (command "
                        f"{wall:.1f} s), training {run['train_s']:.1f} s, "
                        f"ratio {run['run_s'] / run['train_s']:.2f}; start-ups: {ups}; "
                        f"load {' '.join(f'{x:.1f}' for x in os.getloadavg())}",
                        flush=True,
                    )
        finally:
            _run([sys.executable, "-m", "trainyard.metadb", "stop"], env)
    ratios = [r["run_s"] / r["train_s"] for r in runs]
    run_s = [r["run_s"] for r in runs]
    train_s = [r["train_s"] for r in runs]
    print(f"digits DAG run {_med(run_s)}, training {_med(train_s)}, floor {_med(floors)}")
    tasks = list(runs[0]["tasks"])
    print(
        "task wall (median): "
        + ", ".join(
            f"{t} {statistics.median([r['tasks'][t] for r in runs if t in r['tasks']]):.1f}"
            for t in tasks
        )
    )
    steps = sorted({s for r in runs for s in r["startup"]})
    startup = {s: statistics.median([r["startup"][s][0] for r in runs]) for s in steps}
    for s in steps:
        detail = runs[-1]["startup"][s][1]
        values = [r["startup"][s][0] for r in runs]
        print(f"start-up {s}: {_med(values)}; last run: {detail}")
    fields = [
        f"ratio={statistics.median(ratios):.3f}",
        f"ours={statistics.median(run_s):.1f}",
        f"baseline={statistics.median(train_s):.1f}",
        f"airflow_floor={statistics.median(floors):.1f}",
        f"ratio_range={min(ratios):.2f}-{max(ratios):.2f}",
        f"startup_max={max(startup.values()):.2f}",
        *(f"startup_{s}={v:.2f}" for s, v in startup.items()),
    ]
    print("BENCH orchestration_tax " + " ".join(fields))


if __name__ == "__main__":
    main()
