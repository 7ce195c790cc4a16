"""Benchmark: parsing ``dags/trainyard_pipelines.py`` vs bare Airflow DAGs of the same shape.

The dag-processor re-parses every DAG file on a loop, so what the pipeline factory adds to
a parse is paid again and again. Both sides run in fresh interpreters through
``tests/dags/parse_probe.py`` (Airflow, the SDK and the serializer already imported, the
bytecode cache warm):

* ours: the real DAG file (pipeline YAML read, contracts checked, the step graph built);
* baseline: a generated file that declares the same DAG ids and task ids, each task an
  ``EmptyOperator`` with the same upstream edges: the floor Airflow itself costs.

    python benchmarks/dag_parse.py --repeats 7

Last line: ``BENCH dag_parse ratio=<baseline s / ours s> ours=<s> baseline=<s> tasks=<n>``
(above 1 would mean ours parses faster than the bare file).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DAG_FILE = ROOT / "dags" / "trainyard_pipelines.py"
PROBE = ROOT / "tests" / "dags" / "parse_probe.py"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # a dag-processor imports the plugins from cached bytecode (images compile them)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(
        PYTHONPATH=os.pathsep.join([str(ROOT / "plugins"), str(ROOT)]),
        AIRFLOW__CORE__DAGS_FOLDER=str(ROOT / "dags"),
        AIRFLOW__CORE__PLUGINS_FOLDER=str(ROOT / "plugins"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
    )
    return env


def probe(path: Path) -> dict:
    """Parse ``path`` once in a fresh interpreter and return the probe's report."""
    proc = subprocess.run(
        [sys.executable, str(PROBE), str(path)],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{path.name} failed to parse:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bare_file(report: dict, folder: Path) -> Path:
    """Write a DAG file with the same DAG ids, task ids and edges, all ``EmptyOperator``."""
    lines = [
        "import pendulum",
        "from airflow.sdk import DAG",
        "from airflow.providers.standard.operators.empty import EmptyOperator",
        "",
    ]
    for n, (dag_id, edges) in enumerate(sorted(report["edges"].items())):
        lines.append(
            f"with DAG({dag_id!r}, schedule=None, "
            f"start_date=pendulum.datetime(2026, 1, 1, tz='UTC')) as dag_{n}:"
        )
        lines.append("    t = {}")
        for task_id in report["dags"][dag_id]:
            lines.append(f"    t[{task_id!r}] = EmptyOperator(task_id={task_id!r})")
        for task_id, upstream in edges.items():
            for up in upstream:
                lines.append(f"    t[{up!r}] >> t[{task_id!r}]")
        lines.append("")
    path = folder / "bare_pipelines.py"
    path.write_text("\n".join(lines))
    return path


def median_seconds(path: Path, repeats: int) -> tuple[float, float, float]:
    """Median, min and max parse seconds of ``path`` over ``repeats`` warm parses."""
    probe(path)  # warms the bytecode cache
    times = [probe(path)["seconds"] for _ in range(repeats)]
    return statistics.median(times), min(times), max(times)


def main() -> None:
    """Run the benchmark and print the BENCH line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="parses per side (default 7)")
    args = parser.parse_args()
    report = probe(DAG_FILE)
    tasks = sum(len(t) for t in report["dags"].values())
    with tempfile.TemporaryDirectory() as tmp:
        bare = bare_file(report, Path(tmp))
        bare_report = probe(bare)
        assert bare_report["dags"] == report["dags"], "the bare file must declare the same tasks"
        ours, ours_lo, ours_hi = median_seconds(DAG_FILE, args.repeats)
        base, base_lo, base_hi = median_seconds(bare, args.repeats)
    print(
        f"ours {ours * 1000:.1f} ms ({ours_lo * 1000:.1f}-{ours_hi * 1000:.1f}), "
        f"bare Airflow {base * 1000:.1f} ms ({base_lo * 1000:.1f}-{base_hi * 1000:.1f}), "
        f"{len(report['dags'])} DAGs, {tasks} tasks"
    )
    print(
        f"BENCH dag_parse ratio={base / ours:.3f} ours={ours:.4f} baseline={base:.4f} "
        f"dags={len(report['dags'])} tasks={tasks}"
    )


if __name__ == "__main__":
    main()
