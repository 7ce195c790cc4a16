"""One Airflow DAG per pipeline config in ``dags/pipelines/*.yaml``.

The DAGs are built by :func:`trainyard.orchestration.graph.build_dags`; add a pipeline by
adding a YAML file (and its dataset's contract in ``data_contracts/``), not by editing this
file. (Airflow's safe mode parses only files that mention "airflow" and "dag".)

A task's parse (a worker starting it, ``airflow tasks test``, ``airflow dags test``) has a
parsing context naming its DAG: then only that pipeline's DAG is built. The dag-processor
has none and builds every pipeline's (docs/architecture.md, "Parsing").
"""

from __future__ import annotations

from airflow.sdk import get_parsing_context

from trainyard.orchestration.graph import build_dags

context = get_parsing_context()
globals().update(build_dags(dag_id=context.dag_id, task_id=context.task_id))
