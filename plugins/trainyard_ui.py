"""Airflow's plugin loader entry: trainyard's UI plugin (``trainyard.orchestration.ui``).

``plugins/.airflowignore`` keeps the loader out of the ``trainyard`` package; this file is
the one module it imports from ``plugins/``.
"""

from trainyard.orchestration.ui import TrainyardUIPlugin

__all__ = ["TrainyardUIPlugin"]
