"""
### Pulsar tenant rollback

Switches a migrated tenant's live clients back to the source after `pulsar_tenant_migration` flipped them to
the target: give the **run id** of that migration run (its run dir holds the position map this needs).

1. **render_spec** finds that run's spec and run dir and checks the form names the connections it used (their
   tokens reach the step as environment variables, never as arguments).
2. **rollback_lookup** (spark-submit) is the switch in reverse, in `RUN_DIR/rollback/`: the migration's map
   with its sides swapped, catch-up copies of what clients published on the target since the flip (copy mode;
   in geo mode the target's namespaces replicate back to the source; the source's deduplication drops re-sends),
   the reverse progress sync of every subscription (markDelete and
   individual acks), hold, fence the target, final delta and sync, quiet check, flip the route back to the
   source, release, probe that clients land on the source. A failure before that flip leaves the clients on the
   target. It runs only after a verified switch_lookup of that run.
3. **publish_rollback_lookup_report** logs the report (`RUN_DIR/rollback_lookup.json`) and fails when the
   step did.

Nothing is deleted: the target keeps its copy. To migrate the tenant again later, trigger
`pulsar_tenant_migration` with *Continue from run* set to the same migration run id: the new run takes this
run's position maps and copies only what the source got since.

**Retries are safe**: the step is idempotent (a re-run after the flip back only probes); refused input (exit 2:
no such run, no switch to roll back) fails at once.
"""

from __future__ import annotations

from pathlib import Path

from airflow.sdk import DAG
from pulsar_migration import dag_params, dag_support
from pulsar_migration.dag_tasks import report_task, step_tasks, switched_run_spec_task

PROJECT_ROOT = Path(__file__).resolve().parents[1]

with DAG(
    dag_id="pulsar_tenant_rollback",
    schedule=None,
    catchup=False,
    doc_md=__doc__,
    tags=["pulsar", "migration", "rollback"],
    params={
        **dag_params.migration_run_param(
            "What to roll back", "The run id of the pulsar_tenant_migration run whose switch to undo "
                                 "(e.g. manual__2026-11-23T08:00:00+00:00)."),
        **dag_params.cluster_params(
            source_help="The connection that migration run used for its source (the clients go back there).",
            target_help="The connection that migration run used for its target."),
        **dag_params.lookup_param("The lookup service connection that migration run used."),
        **dag_params.dry_run_param(),
    },
    user_defined_macros=dag_support.macros(PROJECT_ROOT),
    max_active_runs=1,
):
    spec = switched_run_spec_task(PROJECT_ROOT, "rolling back")
    _, published = step_tasks("rollback_lookup", PROJECT_ROOT, upstream=spec)
    # The migration run's report again, so its page and Browse -> Pulsar migrations say it was rolled back.
    report_task(upstream=published, of_migration_run=True, after_rollback=True)
