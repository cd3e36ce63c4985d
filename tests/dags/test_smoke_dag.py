"""`dag.test()` of the smoke DAG for real: Airflow -> spark-submit (local[*]) -> both local Pulsar clusters."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from airflow.dag_processing.dagbag import DagBag
from localdev.pulsar_local import LocalCluster
from pulsar_migration.dag_support import run_dir

from tests.dags.conftest import DAGS_DIR, AirflowTestDb

log = logging.getLogger(__name__)


def run_smoke_dag(airflow_db: AirflowTestDb) -> dict[str, Any]:
    """Runs the DAG once; asserts it succeeded and returns the job's result JSON."""
    dag = DagBag(dag_folder=str(DAGS_DIR / "pulsar_smoke.py")).get_dag("pulsar_smoke")
    assert dag is not None
    started = time.monotonic()
    dag_run = dag.test()
    log.info("pulsar_smoke dag.test() took %.1fs", time.monotonic() - started)
    states = {ti.task_id: ti.state for ti in dag_run.get_task_instances()}
    assert dag_run.state == "success", f"run {dag_run.run_id} ended {dag_run.state}; tasks: {states}"
    assert states == {"check_clusters": "success"}
    result_file = Path(run_dir(str(airflow_db.runs_dir), "pulsar_smoke", dag_run.run_id)) / "smoke_admin.json"
    return json.loads(result_file.read_text())


def test_smoke_dag_reaches_both_clusters_from_spark(airflow_db: AirflowTestDb,
                                                    pulsar_clusters: list[LocalCluster]) -> None:
    result = run_smoke_dag(airflow_db)
    assert result["ok"] and result["problems"] == []
    assert result["master"] == "local[*]"  # from the spark_default connection, not the hook's yarn fallback
    by_name = {r["name"]: r for r in result["clusters"]}
    assert set(by_name) == {c.name for c in pulsar_clusters}
    for cluster in pulsar_clusters:
        checked = by_name[cluster.name]
        assert checked["admin_url"] == cluster.admin_url
        assert checked["healthy"] is True
        assert checked["authenticated"] is False  # no token in airflow_settings.yaml
        assert {c.name for c in pulsar_clusters} <= set(checked["clusters"])
        # The executors imported the library from the --py-files zip, not from the driver's install.
        assert ".zip/pulsar_migration/" in checked["library_file"]


def test_connection_token_reaches_the_job_only_through_the_environment(
    airflow_db: AirflowTestDb, pulsar_clusters: list[LocalCluster], monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A password on a cluster connection becomes the job's token; it never shows in arguments or logs."""
    token = "smoke-test-token-5f1e"  # the local brokers run without auth and ignore it
    b = pulsar_clusters[1]
    # An environment connection takes precedence over the DB one (same fields, plus the password).
    monkeypatch.setenv("AIRFLOW_CONN_PULSAR_CLUSTER_B", json.dumps({
        "conn_type": "pulsar", "host": "127.0.0.1", "port": b.web_port, "schema": "http", "password": token,
        "extra": {"cluster_name": b.name, "service_url": b.service_url, "tls": None},
    }))
    result = run_smoke_dag(airflow_db)
    assert result["ok"], result["problems"]
    assert {r["name"]: r["authenticated"] for r in result["clusters"]} == {pulsar_clusters[0].name: False,
                                                                           b.name: True}
    assert "--clusters" in result["args"] and token not in json.dumps(result)  # the job's arguments lack it
    out, err = capfd.readouterr()
    assert token not in out + err
