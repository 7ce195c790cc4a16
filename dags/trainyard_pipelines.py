"""One DAG per pipeline config in ``dags/pipelines/*.yaml``.

The DAGs are built by :func:`trainyard.airflow.build_dags`; add a pipeline by adding a
YAML file (and its dataset's contract in ``data_contracts/``), not by editing this file.
"""

from __future__ import annotations

from trainyard.airflow import build_dags

globals().update(build_dags())
