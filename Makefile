# trainyard: `make run` sets everything up and runs the digits pipeline end to end on the
# embedded default (Airflow on the project's own PostgreSQL in .trainyard/postgres, local
# TensorFlow workers); `make test` runs the tests.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
STAMP := $(VENV)/.installed
ENV := . scripts/env.sh &&
PIPELINE ?= digits

.PHONY: run setup native postgres airflow-init test tool-datacontract tool-mlflow test-checks test-fast lint docs bench standalone standalone-check stop clean

# one run at a time per pipeline, a log of its own in .trainyard/dags_test/
# (.trainyard/last_dags_test.log links to the newest); Ctrl-C stops it for good (plugins/trainyard/orchestration/dagtest.py)
run: airflow-init native
	@$(ENV) python -m trainyard dag-test --pipeline $(PIPELINE)

setup: $(STAMP) native

# trainyard as a package (pyproject.toml) installed editable: pip builds its C extensions
# (setup.py: staging packer, loopback preload library) in place,
# next to their sources; again when a source or the build files change. The extensions are
# optional: a failed build is a warning and `python -m trainyard.native` names what is missing.
# The sources are byte-compiled too, as pip does for site-packages: under PYTHONDONTWRITEBYTECODE
# (CI images set it) every Airflow task, step and worker process compiled them again.
NATIVE_STAMP := .trainyard/native.built
native: $(NATIVE_STAMP)

$(NATIVE_STAMP): $(STAMP) pyproject.toml setup.py $(wildcard plugins/trainyard/*/*.c)
	$(VENV)/bin/pip install --quiet --no-deps --no-build-isolation -e .
	@$(VENV)/bin/python -m compileall -q plugins dags >/dev/null
	@$(ENV) python -m trainyard.native
	@mkdir -p $(dir $@) && touch $@

# pip byte-compiles on one core, compileall on every core (fresh clones: the venv in 142 s, 167 with
# pip compiling)
$(STAMP): requirements.txt requirements-airflow.txt requirements-tensorflow.txt requirements-dev.txt constraints.txt
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) is required"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet --no-compile -r requirements-dev.txt -c constraints.txt
	@$(VENV)/bin/python -m compileall -q -j 0 $(VENV)/lib >/dev/null || true
	touch $(STAMP)

# Airflow's metadata database: PostgreSQL in .trainyard/postgres, made on first use, reused
# after (plugins/trainyard/metadb.py); it keeps running until `make stop`
postgres: $(STAMP)
	@$(ENV) python -m trainyard.metadb start

airflow-init: $(STAMP) postgres
	@mkdir -p .trainyard
	$(ENV) airflow db migrate > .trainyard/airflow_init.log 2>&1 || { tail -n 40 .trainyard/airflow_init.log; exit 1; }
	$(ENV) airflow pools set trainyard_training 1 "one distributed training at a time on this machine" >> .trainyard/airflow_init.log 2>&1

# Airflow standalone in a process group of its own (plugins/trainyard/standalone.py): Ctrl-C,
# `kill %1` or `make stop` stop all of it; AIRFLOW_PORT=N moves it off 8080
standalone: standalone-check airflow-init native
	$(ENV) python -m trainyard.standalone run $(if $(AIRFLOW_PORT),--port $(AIRFLOW_PORT))

# refused before airflow-init touches the database a running standalone uses
standalone-check: $(STAMP)
	@$(ENV) python -m trainyard.standalone check

stop:
	$(ENV) python -m trainyard.standalone stop
	$(ENV) python -c "from trainyard.streaming.local_scorer import stop_all_local_scorers; print('stream scorers stopped:', ', '.join(stop_all_local_scorers()) or 'none running')"
	$(ENV) python -c "from trainyard.serving.deploy import stop_local_server; from trainyard.settings import get_settings; print('model server(s) stopped' if stop_local_server(get_settings().serving_root) else 'model server: not running')"
	$(ENV) python -m trainyard.streaming.redis_server stop
	$(ENV) python -m trainyard.metadb stop

# every test, on both cores (pytest-xdist, grouped by tests/conftest.py: each e2e group
# stays on one worker), and the 20 slowest named at the end
PYTEST_ALL := -n 2 --durations=20

# the two tool venvs install while the project's venv builds and lint runs (pip and mypy
# work mostly on one core): make's own jobs, which Ctrl-C stops (a shell's `&` ignores it)
test:
	bash scripts/system_deps.sh
	$(MAKE) --no-print-directory -j 3 tool-datacontract tool-mlflow test-checks
	$(ENV) pytest $(PYTEST_ALL)

tool-datacontract:
	bash scripts/datacontract_cli.sh

tool-mlflow:
	bash scripts/mlflow_server.sh

test-checks: lint native
	$(ENV) python -m trainyard contracts check && python -m trainyard pipelines check

# the inner loop: unit and DAG tests only (no server, scheduler, training or browser)
test-fast: $(STAMP) native
	$(ENV) pytest $(PYTEST_ALL) tests/unit tests/dags

lint: $(STAMP)
	$(ENV) ruff check . && ruff format --check . && mypy

# the generated parts of docs/reference/ (CLI, pipeline YAML, contracts) from the parsers and
# the JSON schemas; tests/unit/test_docs.py fails while they are stale
docs: $(STAMP)
	$(ENV) python scripts/reference.py

bench: $(STAMP) native
	$(ENV) for b in benchmarks/*.py; do python $$b || exit 1; done
	$(ENV) python benchmarks/input_pipeline.py --case table

clean:
	-[ ! -x $(VENV)/bin/python ] || $(ENV) python -m trainyard.standalone stop
	-[ ! -x $(VENV)/bin/python ] || $(ENV) python -m trainyard.metadb stop
	-[ ! -x $(VENV)/bin/python ] || $(ENV) python -c "from trainyard.streaming.local_scorer import stop_all_local_scorers; stop_all_local_scorers()"
	-[ ! -x $(VENV)/bin/python ] || $(ENV) python -m trainyard.streaming.redis_server stop
	rm -rf .trainyard
