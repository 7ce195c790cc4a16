"""Parse one DAG file in a fresh interpreter and report what parsing did, as JSON.

Run as ``python parse_probe.py <dag file>``: counts SQL statements issued, records heavy
modules imported, records each DAG's tasks and edges, and times the file's import on
top of an already imported Airflow.
"""

from __future__ import annotations

import json
import sys
import time

# Airflow itself is not part of a DAG file's budget: a dag-processor has the SDK, the
# standard provider's decorators and the serializer loaded before it parses any file.
import airflow.sdk
import airflow.serialization.serialized_objects  # noqa: F401
from airflow.providers.standard.decorators.short_circuit import short_circuit_task  # noqa: F401
from sqlalchemy import event
from sqlalchemy.engine import Engine

statements: list[str] = []


@event.listens_for(Engine, "before_cursor_execute")
def _count(conn, cursor, statement, parameters, context, executemany):
    statements.append(statement)


def main(path: str) -> None:
    import runpy

    heavy = ("tensorflow", "pandas", "great_expectations", "tf_keras", "keras", "pyarrow")
    before = set(sys.modules)
    start = time.perf_counter()
    namespace = runpy.run_path(path)
    seconds = time.perf_counter() - start
    from airflow.sdk import DAG

    found = [v for v in namespace.values() if isinstance(v, DAG)]
    dags = {d.dag_id: d.task_ids for d in found}
    edges = {d.dag_id: {t.task_id: sorted(t.upstream_task_ids) for t in d.tasks} for d in found}
    print(
        json.dumps(
            {
                "seconds": seconds,
                "dags": dags,
                "edges": edges,
                "sql_statements": statements,
                "heavy_modules": sorted(m for m in heavy if m in sys.modules and m not in before),
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
