"""trainyard: stage, validate, train, evaluate and serve TensorFlow models from Airflow 3.

The package imports nothing heavy at import time; every stage lives in its own module
and is reachable as ``python -m trainyard <step>``.
"""

from __future__ import annotations

__version__ = "0.1.0"
