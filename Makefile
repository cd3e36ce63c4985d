# Two commands do all set-up on a fresh machine: `make demo` and `make test` (see README.md).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: venv pulsar-fetch clusters-up clusters-down clusters-status airflow airflow-stop demo test lint clean

venv:
	@bash scripts/setup_venv.sh

pulsar-fetch: venv
	$(PY) -m localdev.pulsar_local fetch

clusters-up: venv
	$(PY) -m localdev.pulsar_local start

clusters-down: venv
	$(PY) -m localdev.pulsar_local stop

clusters-status: venv
	$(PY) -m localdev.pulsar_local status

airflow: venv clusters-up
	$(PY) -m localdev.airflow_local start

airflow-stop: venv
	$(PY) -m localdev.airflow_local stop

demo: venv
	$(PY) -m localdev.demo

test: venv
	$(PY) -m ruff check .
	$(PY) -m pytest tests

lint: venv
	$(PY) -m ruff check .

clean: clusters-down airflow-stop
	rm -rf var
