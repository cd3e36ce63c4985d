"""`dag.test()` of pulsar_tenant_rollback on bad input: the rollback engine itself, with live clients, is in
tests/integration/test_rollback_live.py."""

from __future__ import annotations

import pytest

from tests.dags.conftest import AirflowTestDb
from tests.dags.dag_runs import run_dag


def test_an_unknown_migration_run_fails_in_render_spec_with_one_line(
    airflow_db: AirflowTestDb, capfd: pytest.CaptureFixture[str],
) -> None:
    dag_run, states = run_dag("pulsar_tenant_rollback", run_conf={"migration_run_id": "manual__never"})
    assert dag_run.state == "failed"
    assert states == {"render_spec": "failed", "rollback_lookup": "upstream_failed",
                      "publish_rollback_lookup_report": "failed"}
    out, err = capfd.readouterr()
    assert "no run 'manual__never' of pulsar_tenant_migration with a spec at" in out + err
