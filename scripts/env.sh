# Source me: the project's Airflow home and its metadata database, PostgreSQL in
# .trainyard/postgres (`make postgres` starts it, `make stop` stops it), inside the
# checkout (no global state).
# Usage: . scripts/env.sh
_root="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/.." && pwd)"
# owner-only: .trainyard/ holds Airflow's generated passwords, the database, models, data
# and logs; every process started from here creates its files for this account alone
umask 077
mkdir -p "$_root/.trainyard" && chmod 700 "$_root/.trainyard"
export TRAINYARD_PROJECT_DIR="$_root"
export TRAINYARD_VOLUME_ROOT="${TRAINYARD_VOLUME_ROOT:-$_root/.trainyard/volumes}"
export TRAINYARD_RUNNER="${TRAINYARD_RUNNER:-local}"
export AIRFLOW_HOME="${AIRFLOW_HOME:-$_root/.trainyard/airflow}"
# the project's PostgreSQL (plugins/trainyard/metadb.py), reached over its Unix socket
# in that folder; a caller's own database URL wins
export TRAINYARD_POSTGRES_DIR="${TRAINYARD_POSTGRES_DIR:-$_root/.trainyard/postgres}"
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="${AIRFLOW__DATABASE__SQL_ALCHEMY_CONN:-postgresql+psycopg2://airflow@/airflow?host=$TRAINYARD_POSTGRES_DIR}"
export AIRFLOW__CORE__DAGS_FOLDER="$_root/dags"
export AIRFLOW__CORE__PLUGINS_FOLDER="$_root/plugins"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__EXECUTOR=LocalExecutor
# LocalExecutor starts one worker process per slot: Airflow's 32 took 4.6 GB RSS on a laptop
export AIRFLOW__CORE__PARALLELISM="${AIRFLOW__CORE__PARALLELISM:-8}"
# the embedded API server (make standalone) listens on loopback unless the caller says otherwise
export AIRFLOW__API__HOST="${AIRFLOW__API__HOST:-127.0.0.1}"
export AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION=True
export AIRFLOW__SCHEDULER__CATCHUP_BY_DEFAULT=False
export AIRFLOW__LOGGING__LOGGING_LEVEL="${AIRFLOW__LOGGING__LOGGING_LEVEL:-INFO}"
export PYTHONPATH="$_root/plugins${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$_root/.venv/bin:$PATH"
unset _root
