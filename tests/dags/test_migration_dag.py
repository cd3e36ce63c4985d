"""`dag.test()` of the tenant migration DAG for real: Airflow -> spark-submit (local[*]) -> both local clusters.

Each run costs 20-40 s (a Spark driver per step), so the cases are few and each checks a lot. The whole
migration, with tokens, leak checks and the policy comparison, runs in test_authenticated_migration.py; the
dry run (every step planned, nothing changed) in tests/integration/test_airflow_ui.py, triggered from the
browser.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from airflow.models.dagrun import DagRun
from localdev.pulsar_local import LocalCluster
from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.dag_support import run_dir

from tests.conftest import unique
from tests.dags.conftest import AirflowTestDb
from tests.dags.dag_runs import run_dag, xcom
from tests.integration.tenant_builders import snapshot

log = logging.getLogger(__name__)

DAG_ID = "pulsar_tenant_migration"
PUBLISH = "publish_sync_metadata_report"
REPLICATE, PUBLISH_REPLICATE = "replicate_topics", "publish_replicate_topics_report"
PROGRESS, PUBLISH_PROGRESS = "sync_progress", "publish_sync_progress_report"
SWITCH, PUBLISH_SWITCH = "switch_lookup", "publish_switch_lookup_report"
CLEANUP, PUBLISH_CLEANUP = "cleanup_source", "publish_cleanup_source_report"
REPORT = "write_migration_report"


def run_migration(conf: dict[str, Any]) -> tuple[DagRun, dict[str, str | None]]:
    return run_dag(DAG_ID, run_conf=conf)


def run_dir_of(airflow_db: AirflowTestDb, dag_run: DagRun) -> Path:
    return Path(run_dir(str(airflow_db.runs_dir), DAG_ID, dag_run.run_id))


def test_unknown_tenant_fails_the_step_the_publish_task_and_the_run(
    airflow_db: AirflowTestDb, admin_b: PulsarAdmin, cluster_a: LocalCluster,
) -> None:
    tenant = unique("dag-missing")

    dag_run, states = run_migration({"tenant": tenant})

    assert dag_run.state == "failed"
    assert states == {"render_spec": "success", "sync_metadata": "failed", PUBLISH: "failed",
                      REPLICATE: "upstream_failed", PUBLISH_REPLICATE: "failed",
                      PROGRESS: "upstream_failed", PUBLISH_PROGRESS: "failed", SWITCH: "upstream_failed",
                      PUBLISH_SWITCH: "failed", CLEANUP: "upstream_failed", PUBLISH_CLEANUP: "failed",
                      REPORT: "failed"}
    assert snapshot(admin_b, tenant) == {"tenant": None}
    report = json.loads((run_dir_of(airflow_db, dag_run) / "sync_metadata.json").read_text())
    assert report["verdict"] == "failed"
    assert f"tenant '{tenant}' does not exist on cluster {cluster_a.name}" in report["error"]
    assert xcom(dag_run, PUBLISH) is None and xcom(dag_run, "sync_metadata") is None
    # The failed run still has its report (written before the report task failed), showing where it stopped.
    summary = json.loads((run_dir_of(airflow_db, dag_run) / "report.json").read_text())
    assert summary["verdict"] == "failed" and summary["steps"][0]["verdict"] == "failed"
    assert [s["verdict"] for s in summary["steps"][1:]] == ["not run"] * 4


def test_same_cluster_on_both_sides_fails_render_spec_before_spark(airflow_db: AirflowTestDb) -> None:
    dag_run, states = run_migration({"tenant": unique("dag-same"), "target_conn": "pulsar_cluster_a"})

    assert dag_run.state == "failed"
    assert states == {"render_spec": "failed", "sync_metadata": "upstream_failed", PUBLISH: "failed",
                      REPLICATE: "upstream_failed", PUBLISH_REPLICATE: "failed",
                      PROGRESS: "upstream_failed", PUBLISH_PROGRESS: "failed", SWITCH: "upstream_failed",
                      PUBLISH_SWITCH: "failed", CLEANUP: "upstream_failed", PUBLISH_CLEANUP: "failed",
                      REPORT: "failed"}
    assert not (run_dir_of(airflow_db, dag_run) / "spec.json").exists()


def test_continuing_a_run_that_does_not_exist_fails_render_spec_with_one_line(
    airflow_db: AirflowTestDb, capfd: pytest.CaptureFixture[str],
) -> None:
    dag_run, states = run_migration({"tenant": unique("dag-again"), "follows_run_id": "manual__never"})

    assert dag_run.state == "failed" and states["render_spec"] == "failed"
    assert states["sync_metadata"] == states[REPLICATE] == "upstream_failed"
    assert not (run_dir_of(airflow_db, dag_run) / "spec.json").exists()
    out, err = capfd.readouterr()
    assert "Continue from run: no run 'manual__never' of pulsar_tenant_migration with a spec at" in out + err
