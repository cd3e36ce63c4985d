"""
### Pulsar scheduled backfill

Every hour (with catchup) copies the messages published in the run's data interval
`[data_interval_start, data_interval_end)` on the selected source topics to a sink:

- **pulsar** (default): the target connection's cluster, exactly once by the copy rules of
  `replicate_topics` (target deduplication, sequence ids from source positions, resume from what the target
  holds). A position map kept across windows (`RUN_DIR/../_state/<tenant>.<source>.<target>/`) makes each
  window continue where the one before ended: a skipped or failed window is carried by the next run, and
  re-running a window changes nothing. The state begins at the first window run with it: a window with messages
  before that is refused (they would land after later ones). The target needs the tenant's topics: run
  `pulsar_tenant_migration` with *Dry run* off up to sync_metadata, or sync_metadata alone, first.
- **parquet**: an archive at *Archive path* (`s3a://...` at scale), partitioned by
  `tenant/namespace/topic/date/window` (the window named by both its edges); a re-run finds the same rows and
  leaves them, and is refused when the source now gives fewer (the archive keeps what retention removed).
  Geo-replication is no backup (a delete replicates too): the archive is.
  `pulsar_archive_restore` replays an archived window into a cluster, exactly once.

Tasks: **render_spec** (the form + connections -> `RUN_DIR/spec.json`), **backfill_window** (spark-submit
`spark_jobs/backfill_window.py --start --end`, which reads every partition's entries of the window, sends or
writes them and verifies by counts and content hashes), **publish_backfill_window_report** (the verdict and
counts in XCom; fails when the step did).

*Copy rate limit (MB/s)* caps how fast a window reads the source (payload bytes, over all partitions), for
backfills that run beside production traffic.

Windows are cut by the broker's own publish-time lookup; the archive keeps each edge's cut once made, so
consecutive windows meet at one entry and every message belongs to exactly one window whenever they run (the
cluster sink continues from its position map). *Window start* and *Window end* in the form (both, or neither)
override the data interval for a manual run of any window. Past ranges: `airflow backfill create --dag-id
pulsar_scheduled_backfill --from-date ... --to-date ... --max-active-runs 1` (a backfill has its own limit, 10 by
default, whatever the DAG's; windows of the cluster sink that overlap anyway wait for each other on a lock in the
state dir).

**Retries are safe** because the step is idempotent: the Spark task retries twice (20 s apart). A refused
input (exit 2: unknown tenant, a topic missing on the target, no archive path) fails at once.

The DAG starts paused; catchup starts at `start_date` (2026-11-01): set it where your backfill should begin.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from airflow.sdk import DAG, CronDataIntervalTimetable
from pulsar_migration import dag_params, dag_support
from pulsar_migration.dag_tasks import render_spec_task, step_tasks

PROJECT_ROOT = Path(__file__).resolve().parents[1]

with DAG(
    dag_id="pulsar_scheduled_backfill",
    # Data-interval timetable: each run's [data_interval_start, data_interval_end) is the hour before it.
    schedule=CronDataIntervalTimetable("0 * * * *", timezone="UTC"),
    start_date=datetime(2026, 11, 1, tzinfo=UTC),
    catchup=True,
    # Paused whatever `[core] dags_are_paused_at_creation` says: catch-up from start_date with the form's defaults
    # (tenant demo, the default connections) must not start on deployment.
    is_paused_upon_creation=True,
    doc_md=__doc__,
    tags=["pulsar", "backfill"],
    params={
        **dag_params.cluster_params(
            source_help="Airflow connection id of the Pulsar cluster whose messages are backfilled.",
            target_help="Airflow connection id of the Pulsar cluster that receives them (sink pulsar)."),
        **dag_params.selection_params(tenant_default="demo"),
        **dag_params.archive_params(),
        **dag_params.window_params(required=False),
        **dag_params.rate_cap_params(),
        **dag_params.dry_run_param(),
    },
    user_defined_macros=dag_support.macros(PROJECT_ROOT),
    # Windows in order, one at a time: each continues the position map the one before left.
    max_active_runs=1,
):
    spec = render_spec_task(PROJECT_ROOT)
    step_tasks("backfill_window", PROJECT_ROOT, upstream=spec,
               extra_args=["--start", "{{ params.window_start or data_interval_start.isoformat() }}",
                           "--end", "{{ params.window_end or data_interval_end.isoformat() }}"])
