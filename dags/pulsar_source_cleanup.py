"""
### Pulsar source cleanup

Removes a migrated tenant's copy from the **source** cluster some time after the `pulsar_tenant_migration` run
that switched its clients to the target: give the **run id** of that run. Until then the source is the way back
(`pulsar_tenant_rollback` needs it), so the migration DAG's own cleanup task only verifies and lists unless its
trigger confirmed deletion.

1. **render_spec** finds that run's spec and run dir and checks the form names the connections it used (their
   tokens reach the step as environment variables, never as arguments).
2. **cleanup_source** (spark-submit) in that run dir: it refuses unless the run's switch was verified, the lookup
   service still routes the tenant to the target and the run was not rolled back (after a rollback and a second
   migration, give the second run's id). Then it re-verifies every source partition against the target's copies of
   the same entries (counts and content hashes, through the run's position map), checks that no client uses the
   source, sets replication on the source to the source only (never with a cascade to the target), and deletes
   the tenant's topics and emptied namespaces there (the tenant too with *Delete the tenant*), on the **source
   only**. Without *Confirm cleanup* it stops after the checks and lists what it would delete. Once it starts
   deleting, `pulsar_tenant_rollback` refuses the run.
3. **publish_cleanup_source_report** logs the report (`RUN_DIR/cleanup_source.json`, replacing the migration
   run's own) and fails when the step did.
4. **write_migration_report**, after a cleanup that succeeded: the migration run's report again
   (`RUN_DIR/report.html`, its report tab in the UI), now with this cleanup.

**Retries are safe**: the step is idempotent (a re-run after a kill finishes the deletion; a tenant already gone
after a verified switch is a finished cleanup); refused input (exit 2: no such run) fails at once.
"""

from __future__ import annotations

from pathlib import Path

from airflow.sdk import DAG
from pulsar_migration import dag_params, dag_support
from pulsar_migration.dag_tasks import report_task, step_tasks, switched_run_spec_task

PROJECT_ROOT = Path(__file__).resolve().parents[1]

with DAG(
    dag_id="pulsar_source_cleanup",
    schedule=None,
    catchup=False,
    doc_md=__doc__,
    tags=["pulsar", "migration", "cleanup"],
    params={
        **dag_params.migration_run_param(
            "What to clean up", "The run id of the pulsar_tenant_migration run that switched the tenant's clients "
                                "to the target (e.g. manual__2026-11-23T08:00:00+00:00)."),
        **dag_params.cluster_params(
            source_help="The connection that migration run used for its source (the cluster cleaned up).",
            target_help="The connection that migration run used for its target (read only, to verify)."),
        **dag_params.lookup_param("The lookup service connection that migration run used (the tenant's route must "
                                  "name the target)."),
        **dag_params.cleanup_params(
            "Delete the tenant's topics and namespaces on the source. Off: cleanup_source only verifies and lists "
            "what it would delete. The target is never touched."),
    },
    user_defined_macros=dag_support.macros(PROJECT_ROOT),
    # One cleanup at a time. Against a rollback of the same run the step guards itself: the route is asked again
    # right before deleting, and a marker in the run dir makes rollback_lookup refuse the run from then on.
    max_active_runs=1,
):
    spec = switched_run_spec_task(PROJECT_ROOT, "cleaning up the source of")
    _, published = step_tasks("cleanup_source", PROJECT_ROOT, upstream=spec, dry_run_unless="confirm_cleanup",
                              flags={"delete_tenant": "--delete-tenant"})
    report_task(upstream=published, of_migration_run=True)
