"""One Airflow DAG per pipeline config in ``dags/pipelines/*.yaml``.

The DAGs are built by :func:`trainyard.orchestration.graph.build_dags`; add a pipeline by
adding a YAML file (and its dataset's contract in ``data_contracts/``), not by editing this
file. (Airflow's safe mode parses only files that mention "airflow" and "dag".)
"""

from __future__ import annotations

from trainyard.orchestration.graph import build_dags

globals().update(build_dags())
