"""A throw-away AIRFLOW_HOME for the DAG tests, migrated and loaded with airflow_settings.yaml.

Airflow reads AIRFLOW_HOME and its AIRFLOW__* settings when it is first imported, so the environment is
set here at import time: pytest imports this conftest while collecting tests/dags, before any test
module there imports Airflow. It is the same environment `make airflow` runs with (airflow_env).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from localdev.airflow_local import airflow_env, migrated_db
from localdev.paths import PROJECT_ROOT
from localdev.pulsar_local import LocalCluster

from tests.integration.lookup_helpers import TOKEN, LookupProcess, start_service

log = logging.getLogger(__name__)

AIRFLOW_TEST_HOME = Path(tempfile.mkdtemp(prefix="pm-airflow-tests-"))
RUNS_DIR = AIRFLOW_TEST_HOME / "runs"
DAGS_DIR = PROJECT_ROOT / "dags"

if "airflow" in sys.modules:  # too late to point Airflow at the test home
    raise pytest.UsageError(
        "airflow was imported before tests/dags/conftest.py set AIRFLOW_HOME; run tests/dags first "
        "or keep Airflow imports out of module level elsewhere"
    )
os.environ.update(airflow_env(AIRFLOW_TEST_HOME))
# Run dirs of DAG test runs stay inside the throw-away home (environment variables beat DB variables).
os.environ["AIRFLOW_VAR_PULSAR_MIGRATION_RUN_DIR_BASE"] = str(RUNS_DIR)


@dataclass(frozen=True)
class AirflowTestDb:
    home: Path
    runs_dir: Path
    migrate_s: float
    apply_s: float


@pytest.fixture(scope="session")
def airflow_db() -> Iterator[AirflowTestDb]:
    """The test home's DB migrated (a copy of one migrated once per Airflow install), then airflow_settings.yaml
    applied with the project's loader."""
    migrate_s = migrated_db(os.environ)
    from localdev.airflow_settings import apply_settings, load_settings

    started = time.monotonic()
    outcome = apply_settings(load_settings())
    apply_s = time.monotonic() - started
    log.info("airflow test DB at %s: migrate %.1fs, settings %.1fs %s", AIRFLOW_TEST_HOME, migrate_s, apply_s, outcome)
    yield AirflowTestDb(AIRFLOW_TEST_HOME, RUNS_DIR, migrate_s, apply_s)


@pytest.fixture(scope="session")
def lookup_service(cluster_a: LocalCluster, cluster_b: LocalCluster,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[LookupProcess]:
    """A lookup service of its own (routes in a temp dir, unknown tenants to cluster-a), reached by the DAG's
    default `pulsar_lookup` connection, whose password is the service's admin token (env beats the DB)."""
    service = start_service(tmp_path_factory.mktemp("lookup"), [cluster_a, cluster_b], cluster_a)
    os.environ["AIRFLOW_CONN_PULSAR_LOOKUP"] = json.dumps({"conn_type": "http", "host": "127.0.0.1",
                                                           "port": service.port, "schema": "http",
                                                           "password": TOKEN})
    yield service
    os.environ.pop("AIRFLOW_CONN_PULSAR_LOOKUP", None)
    service.stop()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(AIRFLOW_TEST_HOME, ignore_errors=True)
