# Two commands do all set-up on a fresh machine: `make demo` and `make test` (see README.md).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
# Every spark-submit and local SparkSession of this project reads conf/spark/spark-env.sh.
export SPARK_CONF_DIR ?= $(CURDIR)/conf/spark

.PHONY: venv pulsar-fetch clusters-up clusters-down clusters-reset clusters-status airflow airflow-stop lookup lookup-stop demo test lint clean

venv:
	@bash scripts/setup_venv.sh

pulsar-fetch: venv
	$(PY) -m localdev.pulsar_local fetch

# `AUTH=1` (or yes, true): the pair with token authentication and authorization on.
AUTH_FLAG := $(if $(filter 1 yes true,$(AUTH)),--auth)

clusters-up: venv
	$(PY) -m localdev.pulsar_local start $(AUTH_FLAG)

clusters-down: venv
	$(PY) -m localdev.pulsar_local stop

# Tests and benchmarks leave their tenants behind (a crashed benchmark its 768 MB data sets): the pair's data grows
# with every run (55 GB after a few days here, until a bookie turned read-only on a nearly full disk). This starts
# them again empty.
clusters-reset: clusters-down
	$(PY) -m localdev.pulsar_local start --fresh $(AUTH_FLAG)

clusters-status: venv
	$(PY) -m localdev.pulsar_local status

airflow: venv clusters-up
	$(PY) -m localdev.airflow_local start

airflow-stop: venv
	$(PY) -m localdev.airflow_local stop

demo: venv
	$(PY) -m localdev.demo

# Three pytest workers, each test module whole and in order on one (cluster-c is used by one module only); the
# clusters are started first so the workers find them running instead of racing to start them.
test: venv clusters-up
	$(PY) -m ruff check .
	$(PY) -m pytest -n 3 --dist loadfile tests

lint: venv
	$(PY) -m ruff check .

lookup: venv
	$(PY) -m localdev.lookup_local start

lookup-stop: venv
	$(PY) -m localdev.lookup_local stop

clean: clusters-down airflow-stop lookup-stop
	rm -rf var
