"""Benchmark: parsing ``dags/trainyard_pipelines.py`` at 50, 500 and 2,000 pipelines.

The pipelines are generated: copies of the shipped two (``dags/pipelines/``) under other
names, each with a served model name of its own, in a temporary folder
(``TRAINYARD_PIPELINES_DIR``). Every parse runs in a fresh interpreter with what the
parsing process already has loaded (the Task SDK, the serializer, the dag-processor's
modules, the file's own Airflow imports), through Airflow's own code:

* dag-processor: what its file processor runs for a file
  (``airflow.dag_processing.processor``): ``BundleDagBag`` of the file (its import is what
  ``[core] dagbag_import_timeout`` bounds), then ``_serialize_dags`` (the whole is what
  ``[dag_processor] dag_file_processor_timeout`` bounds);
* task start: the worker's parse (``task_runner.parse``): ``BundleDagBag`` of the file
  inside Airflow's parsing context of one task of one DAG.

The baseline of each is Airflow's floor for the same DAGs: a generated file that declares
the same DAG ids, task ids and edges, every task an ``EmptyOperator``, with no params, no
schedule and no YAML (for the task start: the one DAG the task needs, alone in its file).
Ours and the baseline alternate, run by run. Times are wall and CPU seconds, medians of
``--repeats`` runs with their ranges; the load average is printed with each size. The
import timeout is lifted for the measurement: a run past Airflow's defaults (30 s import,
50 s file processing) is counted and said, as it would have failed.

    python benchmarks/dag_parse.py [--sizes 50,500,2000] [--repeats 3]

Last line: ``BENCH dag_parse ratio=<ours s / baseline s, dag-processor at the largest
size> ours=<s> baseline=<s> ...`` with the import and task-start figures after it. Every
ratio here is ours over the baseline in seconds: 1.0 is Airflow's floor, lower is better.
(Until issue 39 this script printed baseline over ours.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DAG_FILE = ROOT / "dags" / "trainyard_pipelines.py"
SHIPPED = ROOT / "dags" / "pipelines"
BUNDLE = "dags-folder"
IMPORT_TIMEOUT = 30.0
"""Airflow's default ``[core] dagbag_import_timeout``."""
PROCESSOR_TIMEOUT = 50.0
"""Airflow's default ``[dag_processor] dag_file_processor_timeout``."""

BARE_FILE = '''"""Airflow's floor: the DAG ids, task ids and edges of a spec, as EmptyOperators."""
import json
import os

import pendulum
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG

with open(os.environ["BARE_DAG_SPEC"]) as f:
    spec = json.load(f)
for dag_id, edges in spec.items():
    with DAG(dag_id, schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")) as dag:
        tasks = {t: EmptyOperator(task_id=t) for t in edges}
        for t, upstream in edges.items():
            for u in upstream:
                tasks[u] >> tasks[t]
    globals()[dag_id] = dag
'''


def generate(folder: Path, n: int) -> list[str]:
    """Write ``n`` pipeline files (the shipped ones renamed); returns their names."""
    folder.mkdir(parents=True, exist_ok=True)
    sources = sorted(SHIPPED.glob("*.yaml"))
    names = []
    for i in range(n):
        src = sources[i % len(sources)]
        name = f"{src.stem}_{i:05d}"
        text = src.read_text(encoding="utf-8")
        text = text.replace(f"name: {src.stem}\n", f"name: {name}\n", 1)
        text = text.replace(f"model_name: {src.stem}\n", f"model_name: {name}\n", 1)
        (folder / f"{name}.yaml").write_text(text, encoding="utf-8")
        names.append(name)
    return names


# ------------------------------------------------------------------ the probe (child side)


def probe(mode: str, path: str, dag_id: str | None, task_id: str | None) -> dict:
    """Parse ``path`` once as the dag-processor (``processor``) or a worker (``task``) does."""
    import logging

    # loaded in every parsing process before it parses a file
    import airflow.sdk
    import airflow.serialization.serialized_objects  # noqa: F401
    from airflow.dag_processing.dagbag import BundleDagBag
    from airflow.dag_processing.processor import _pre_import_airflow_modules, _serialize_dags
    from airflow.sdk.definitions._internal.dag_parsing_context import (
        _airflow_parsing_context_manager,
    )

    log = logging.getLogger("bench")
    _pre_import_airflow_modules(path, log)  # the dag-processor's pre-import of the file's
    bundle = Path(path).parent
    t0, c0 = time.perf_counter(), time.process_time()
    if mode == "task":
        with _airflow_parsing_context_manager(dag_id=dag_id, task_id=task_id):
            bag = BundleDagBag(
                dag_folder=path,
                safe_mode=False,
                load_op_links=False,
                bundle_path=bundle,
                bundle_name=BUNDLE,
            )
    else:
        bag = BundleDagBag(
            dag_folder=path, bundle_path=bundle, bundle_name=BUNDLE, load_op_links=False
        )
    t1, c1 = time.perf_counter(), time.process_time()
    serialized, errors = ([], {}) if mode == "task" else _serialize_dags(bag, log)
    t2, c2 = time.perf_counter(), time.process_time()
    return {
        "import_s": t1 - t0,
        "import_cpu": c1 - c0,
        "total_s": t2 - t0,
        "total_cpu": c2 - c0,
        "dags": len(bag.dags),
        "serialized": len(serialized),
        "errors": {**bag.import_errors, **errors},
        "edges": {
            d.dag_id: {t.task_id: sorted(t.upstream_task_ids) for t in d.tasks}
            for d in bag.dags.values()
        },
    }


# ------------------------------------------------------------------ the driver


def _env(pipelines: Path, spec: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # a dag-processor's plugins come from bytecode
    env.update(
        PYTHONPATH=os.pathsep.join([str(ROOT / "plugins"), str(ROOT)]),
        AIRFLOW__CORE__DAGS_FOLDER=str(ROOT / "dags"),
        AIRFLOW__CORE__PLUGINS_FOLDER=str(ROOT / "plugins"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        TRAINYARD_PIPELINES_DIR=str(pipelines),
        TRAINYARD_PROJECT_DIR=str(ROOT),
        # measured, not cut off: the lines say which runs the default 30 s would have failed
        AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT="3600",
    )
    if spec is not None:
        env["BARE_DAG_SPEC"] = str(spec)
    return env


def run_probe(
    mode: str,
    path: Path,
    env: dict[str, str],
    dag_id: str | None = None,
    task_id: str | None = None,
) -> dict:
    """One parse in a fresh interpreter; its report."""
    argv = [sys.executable, __file__, "--probe", mode, str(path)]
    if dag_id:
        argv += ["--dag-id", dag_id, "--task-id", task_id or ""]
    proc = subprocess.run(
        argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"{path.name} ({mode}) failed:\n{proc.stderr[-3000:]}")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    if report["errors"]:
        raise SystemExit(f"{path.name} ({mode}) import errors: {report['errors']}")
    return report


def _stats(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def _fmt(label: str, values: list[float]) -> str:
    med, lo, hi = _stats(values)
    return f"{label} {med:.2f} s ({lo:.2f}-{hi:.2f})"


def _side(out: dict[str, list[float]], side: str) -> str:
    over = sum(s > IMPORT_TIMEOUT for s in out[side + "_import"])
    over_all = sum(s > PROCESSOR_TIMEOUT for s in out[side])
    return (
        f"import {_fmt('', out[side + '_import']).strip()} (CPU "
        f"{_fmt('', out[side + '_import_cpu']).strip()}), import + serialize "
        f"{_fmt('', out[side]).strip()} (CPU {_fmt('', out[side + '_cpu']).strip()})"
        + (f", {over} run(s) past the {IMPORT_TIMEOUT:.0f} s import timeout" if over else "")
        + (f", {over_all} past the {PROCESSOR_TIMEOUT:.0f} s processor's" if over_all else "")
    )


def measure(
    size: int, repeats: int, tmp: Path, task_start: bool
) -> tuple[dict[str, list[float]], dict[str, list[float]] | None]:
    """Dag-processor runs of ours and the bare file, alternating; task starts if asked."""
    pipelines = tmp / f"pipelines_{size}"
    names = generate(pipelines, size)
    env = _env(pipelines)
    first = run_probe("processor", DAG_FILE, env)  # warms the bytecode cache
    assert first["dags"] == size == first["serialized"], first["dags"]
    spec = tmp / f"spec_{size}.json"
    spec.write_text(json.dumps(first["edges"]))
    bare_dir = tmp / f"bare_{size}"
    bare_dir.mkdir()
    bare = bare_dir / "bare_pipelines.py"
    bare.write_text(BARE_FILE)
    bare_env = _env(pipelines, spec)
    run_probe("processor", bare, bare_env)
    keys = ("", "_cpu", "_import", "_import_cpu")
    out: dict[str, list[float]] = {f"{side}{k}": [] for side in ("ours", "base") for k in keys}
    for r in range(repeats):
        sides = [("ours", DAG_FILE, env), ("base", bare, bare_env)]
        for side, path, e in sides if r % 2 == 0 else sides[::-1]:
            rep = run_probe("processor", path, e)
            assert rep["dags"] == size, (side, rep["dags"])
            out[side].append(rep["total_s"])
            out[f"{side}_cpu"].append(rep["total_cpu"])
            out[f"{side}_import"].append(rep["import_s"])
            out[f"{side}_import_cpu"].append(rep["import_cpu"])
    load = os.getloadavg()
    print(
        f"{size} pipelines, dag-processor: ours {_side(out, 'ours')}; "
        f"bare Airflow {_side(out, 'base')}; load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}",
        flush=True,
    )
    if not task_start:
        return out, None
    # task start: one task of the last pipeline (sorted last: its file is found last)
    dag_id, task_id = f"trainyard_{names[-1]}", "validate"
    one = tmp / f"spec_one_{size}.json"
    one.write_text(json.dumps({dag_id: first["edges"][dag_id]}))
    one_env = _env(pipelines, one)
    run_probe("task", DAG_FILE, env, dag_id, task_id)
    task: dict[str, list[float]] = {"ours": [], "ours_cpu": [], "base": [], "base_cpu": []}
    for r in range(repeats):
        sides = [("ours", DAG_FILE, env), ("base", bare, one_env)]
        for side, path, e in sides if r % 2 == 0 else sides[::-1]:
            rep = run_probe("task", path, e, dag_id, task_id)
            assert rep["dags"] == 1, (side, rep["dags"])
            task[side].append(rep["import_s"])
            task[f"{side}_cpu"].append(rep["import_cpu"])
    load = os.getloadavg()
    print(
        f"{size} pipelines, task start ({dag_id}.{task_id}, parsing context set): "
        f"{_fmt('ours', task['ours'])}, CPU {_fmt('', task['ours_cpu']).strip()}; "
        f"the DAG alone in a bare file {_fmt('', task['base']).strip()}; "
        f"load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}",
        flush=True,
    )
    return out, task


def main() -> None:
    """Run the benchmark (or, with ``--probe``, one parse) and print the BENCH line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", default="50,500,2000", help="pipeline counts (default %(default)s)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs per side (default 3)")
    parser.add_argument("--probe", nargs=2, metavar=("MODE", "FILE"), help=argparse.SUPPRESS)
    parser.add_argument("--dag-id", help=argparse.SUPPRESS)
    parser.add_argument("--task-id", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        mode, path = args.probe
        print(json.dumps(probe(mode, path, args.dag_id, args.task_id or None)))
        return
    sizes = sorted(int(s) for s in args.sizes.split(","))
    results = {}
    task = None
    with tempfile.TemporaryDirectory(prefix="trainyard-bench-parse-") as tmp:
        for size in sizes:
            last = size == sizes[-1]
            results[size], task_result = measure(size, args.repeats, Path(tmp), last)
            task = task_result or task
    med = statistics.median
    top = results[sizes[-1]]
    ours, base = med(top["ours"]), med(top["base"])
    fields = [
        f"ratio={ours / base:.3f}",
        f"ours={ours:.3f}",
        f"baseline={base:.3f}",
        f"pipelines={sizes[-1]}",
        f"ours_cpu={med(top['ours_cpu']):.3f}",
        f"import={med(top['ours_import']):.3f}",
        f"import_cpu={med(top['ours_import_cpu']):.3f}",
        f"import_ratio={med(top['ours_import']) / med(top['base_import']):.3f}",
    ]
    for size in sizes[:-1]:
        r = results[size]
        fields.append(f"dp{size}={med(r['ours']):.3f}")
        fields.append(f"dp{size}_ratio={med(r['ours']) / med(r['base']):.3f}")
    if task is not None:
        t_ours, t_base = med(task["ours"]), med(task["base"])
        fields += [f"task_start={t_ours:.3f}", f"task_ratio={t_ours / t_base:.3f}"]
    print("BENCH dag_parse " + " ".join(fields))


if __name__ == "__main__":
    main()
