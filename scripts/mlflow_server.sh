#!/usr/bin/env bash
# The MLflow tracking server in a venv of its own (.trainyard/tools/mlflow): mlflow's pins
# conflict with Airflow's, so it cannot live in .venv (trainyard itself speaks MLflow's REST
# API, plugins/trainyard/tracking.py). The tracking tests start a real `mlflow server` from
# it on loopback. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.trainyard/tools/mlflow
version=3.17.2
if [ -x "$venv/bin/mlflow" ] && "$venv/bin/python" -c "import importlib.metadata as m; print(m.version('mlflow'))" 2>/dev/null | grep -qx "$version"; then
  exit 0
fi
rm -rf "$venv"
python3 -m venv "$venv"
# (this machine's pip config names local indexes that may be absent: their warnings go)
# pip byte-compiles on one core, compileall on every core
"$venv/bin/pip" install --quiet --no-compile "mlflow==$version" 2> >(grep -v "is ignored" >&2)
"$venv/bin/python" -m compileall -q -j 0 "$venv/lib" >/dev/null || true  # (as pip: a file that does not compile fails at its import)
