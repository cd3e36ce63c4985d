"""
### Pulsar archive restore

Replays one archived window (written by `pulsar_scheduled_backfill` with sink *parquet*) into the target
connection's cluster, exactly once: per partition, in the original order, with the archive's keys,
properties and event times; target deduplication with sequence ids from the archive's ordinals makes a
re-run (or a retry after a kill) send nothing twice. The target must hold the tenant's topics (sync_metadata).

Tasks: **render_spec**, **restore_window** (spark-submit `spark_jobs/restore_window.py --start --end`:
reads the archive's window, produces, reads the target back and compares content digests),
**publish_restore_window_report**.

*Window start* must be the start of an archived window (its `window=` partition); the end bounds nothing
else. **Retries are safe**: the Spark task retries twice; a refused input (exit 2: no archive there, a topic
missing on the target) fails at once.
"""

from __future__ import annotations

from pathlib import Path

from airflow.sdk import DAG
from pulsar_migration import dag_params, dag_support
from pulsar_migration.dag_tasks import render_spec_task, step_tasks

PROJECT_ROOT = Path(__file__).resolve().parents[1]

with DAG(
    dag_id="pulsar_archive_restore",
    schedule=None,
    catchup=False,
    doc_md=__doc__,
    tags=["pulsar", "backfill", "restore"],
    params={
        **dag_params.cluster_params(
            source_help="Airflow connection id of the cluster the archive was taken from (names the topics).",
            target_help="Airflow connection id of the Pulsar cluster the window is restored into."),
        **dag_params.selection_params(),
        "archive_path": dag_params.archive_params()["archive_path"],
        **dag_params.window_params(required=True),
        **dag_params.dry_run_param(),
    },
    user_defined_macros=dag_support.macros(PROJECT_ROOT),
    max_active_runs=1,
):
    spec = render_spec_task(PROJECT_ROOT)
    step_tasks("restore_window", PROJECT_ROOT, upstream=spec,
               extra_args=["--start", "{{ params.window_start }}", "--end", "{{ params.window_end }}"])
