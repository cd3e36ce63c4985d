"""`dag.test()` of pulsar_scheduled_backfill and pulsar_archive_restore against the local cluster pair.

Batches are produced a moment apart and windows cut between them (as in the step's integration test); the runs
here prove the DAG half: the form's window or the run's data interval reaches the step, runs of consecutive
windows bring each batch once, the run of the hour holding both windows again brings nothing, an archived window
comes back once.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from localdev.airflow_local import venv_bin
from localdev.pulsar_local import LocalCluster
from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.dag_support import run_dir

from tests.conftest import unique
from tests.dags.conftest import RUNS_DIR, AirflowTestDb
from tests.dags.dag_runs import failures, rendered_fields, run_dag, xcom
from tests.integration.replication_helpers import drain
from tests.integration.test_backfill_window import PER_BATCH, create_topics, iso, seed, target_payloads

BACKFILL, RESTORE = "pulsar_scheduled_backfill", "pulsar_archive_restore"
PARTITION_TOPICS = ["persistent://{tenant}/ns/events", "persistent://{tenant}/ns/parted-partition-0",
                    "persistent://{tenant}/ns/parted-partition-1"]


def backfill(conf: dict[str, object], **kwargs: object) -> dict[str, object]:
    """One backfill run that must succeed; returns its published report summary."""
    dag_run, states = run_dag(BACKFILL, run_conf=conf, **kwargs)
    assert dag_run.state == "success", failures(dag_run, states)
    return xcom(dag_run, "publish_backfill_window_report")


def test_consecutive_windows_then_a_scheduled_interval_over_both_brings_nothing_again(
    airflow_db: AirflowTestDb, cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin,
    admin_b: PulsarAdmin,
) -> None:
    now = datetime.now(UTC)
    hour = now.replace(minute=0, second=0, microsecond=0)
    if now - hour < timedelta(seconds=15):  # every batch must fall in the hour the scheduled run covers
        time.sleep(15 - (now - hour).total_seconds())
    tenant = unique("dag-bf")
    edges, payloads = seed(admin_a, cluster_a, tenant, batches=2)
    create_topics(admin_b, cluster_b, tenant)
    conf = {"tenant": tenant}

    first = backfill({**conf, "window_start": iso(edges[0]), "window_end": iso(edges[1])})
    assert first["verdict"] == "ok" and first["counts"]["copied_messages"] == PER_BATCH * 2
    assert sorted(target_payloads(cluster_b, tenant)) == sorted(payloads[0])
    # With the form's rate cap: it reaches the step through the spec (its report says so).
    capped_run, states = run_dag(BACKFILL, run_conf={**conf, "window_start": iso(edges[1]),
                                                     "window_end": iso(edges[2]), "copy_max_mb_per_s": 50})
    assert capped_run.state == "success", failures(capped_run, states)
    second = xcom(capped_run, "publish_backfill_window_report")
    assert second["counts"]["copied_messages"] == PER_BATCH * 2
    step_report = json.loads((Path(run_dir(str(RUNS_DIR), BACKFILL, capped_run.run_id)) / "backfill_window.json")
                             .read_text())
    assert step_report["details"]["throttle"]["max_mb_per_s"] == 50
    held = target_payloads(cluster_b, tenant)
    assert len(held) == len(set(held)) == PER_BATCH * 4 and set(held) == payloads[0] | payloads[1]

    # No window in the form: the run's data interval, the hour holding both batches (already all copied: a window
    # run again brings nothing).
    dag_run, states = run_dag(BACKFILL, run_conf=conf, logical_date=hour + timedelta(hours=1))
    assert dag_run.state == "success", failures(dag_run, states)
    assert (dag_run.data_interval_start, dag_run.data_interval_end) == (hour, hour + timedelta(hours=1))
    args = rendered_fields(dag_run, "backfill_window")["application_args"]
    assert args[-4:] == ["--start", hour.isoformat(), "--end", (hour + timedelta(hours=1)).isoformat()]
    scheduled = xcom(dag_run, "publish_backfill_window_report")
    # ... read on every partition the source holds messages on (keys may all hash to one of parted's two)
    holding = [t for t in PARTITION_TOPICS if drain(cluster_a, t.format(tenant=tenant))]
    assert scheduled["counts"]["partitions_with_messages"] == len(holding) >= 2
    assert scheduled["counts"]["copied_messages"] == 0
    assert len(target_payloads(cluster_b, tenant)) == PER_BATCH * 4

    # `airflow backfill create` over a range plans one run per hour of it, with these same intervals.
    day = hour - timedelta(days=1)
    listed = subprocess.run([str(venv_bin() / "airflow"), "backfill", "create", "--dag-id", BACKFILL, "--from-date",
                             day.isoformat(), "--to-date", (day + timedelta(hours=2)).isoformat(), "--dry-run"],
                            capture_output=True, text=True, timeout=120, env=dict(os.environ), check=True).stdout
    planned = re.findall(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d", listed.split("Runs to be attempted:")[1])
    assert planned[:2] == [f"{(day + timedelta(hours=h)):%Y-%m-%d %H:%M:%S}" for h in (0, 1)], listed


def test_a_window_archived_then_restored_into_the_target(
    airflow_db: AirflowTestDb, cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin,
    admin_b: PulsarAdmin, tmp_path: Path,
) -> None:
    tenant = unique("dag-archive")
    edges, payloads = seed(admin_a, cluster_a, tenant, batches=1)
    window = {"tenant": tenant, "window_start": iso(edges[0]), "window_end": iso(edges[1]),
              "archive_path": str(tmp_path / "archive")}

    archived = backfill({**window, "backfill_sink": "parquet"})
    assert archived["verdict"] == "ok" and archived["counts"]["archived_messages"] == PER_BATCH * 2
    assert archived["hashes"]["source"] == archived["hashes"]["archive"]
    assert list((tmp_path / "archive").glob(f"tenant={tenant}/namespace=ns/topic=*/date=*/window=*/*.parquet"))

    create_topics(admin_b, cluster_b, tenant)
    dag_run, states = run_dag(RESTORE, run_conf=window)
    assert dag_run.state == "success", failures(dag_run, states)
    restored = xcom(dag_run, "publish_restore_window_report")
    assert restored["verdict"] == "ok" and restored["counts"]["restored"] == PER_BATCH * 2
    held = target_payloads(cluster_b, tenant)
    assert len(held) == len(set(held)) and set(held) == payloads[0]
