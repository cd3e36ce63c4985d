"""
### Pulsar tenant migration

Moves one Pulsar tenant from the cluster of `source_conn` to the cluster of `target_conn`. Trigger it
from the UI form (or the REST API / CLI with the same keys as `conf`).

1. **render_spec** builds the MigrationSpec from the form and the two connections, validates it (a
   bad combination, e.g. the same cluster on both sides or an invalid regex, fails here with one
   line) and writes it to `RUN_DIR/spec.json`.
2. **sync_metadata** (spark-submit) makes the target hold the tenant's metadata: namespaces and their
   policies, topics and partitions, subscriptions, grants, schemas, topic policies. Conflicts on the
   target stop it before any write unless *Proceed on conflict* is set.
3. **replicate_topics** (spark-submit) brings every selected partition's messages to the target exactly
   once, entry for entry: mode `copy` re-publishes them (target deduplication on, sequence ids from
   source positions, resume from what the target holds), mode `geo` enables Pulsar's geo-replication
   with the older backlog included and waits for it to drain. Both read the target back, compare
   counts and content hashes per partition, and append the position map (`RUN_DIR/position_map/`)
   that progress sync translates cursors with. *Copy rate limit (MB/s)* caps the copy's source reads over all
   partitions, to spare a source that serves production traffic meanwhile.
4. **sync_progress** (spark-submit) gives every durable subscription on the target exactly the
   acknowledged set it has on the source: markDeletePosition *and* every individually acknowledged
   message, translated entry by entry through the position map (a Spark join), applied by a cursor
   reset plus grouped acknowledgements, then read back and compared: lost and duplicated must be 0.
   Subscriptions already exact are left alone, so re-runs converge.
5. **switch_lookup** (spark-submit) moves the tenant's live clients to the target through the lookup service
   of `lookup_conn`: catch-up copies, hold the tenant's lookups, unload it on the source (the fence), final
   delta and final progress sync in the driver (about 2 s of hold), flip the route, release, probe. Any
   failure before the flip releases the hold with the route unchanged: clients carry on at the source.
6. **cleanup_source** (spark-submit) re-verifies every partition (counts and content hashes), checks that
   no client is left on the source, and deletes the tenant's topics and emptied namespaces there (the
   tenant too with *Delete the tenant*), on the **source only**. Without *Confirm cleanup* it is a dry
   run that lists what it would delete.
7. **publish_<step>_report** after each step logs its report and returns its verdict, counts, hashes,
   plan location and conflicts (XCom). It fails whenever the step did, so a failed step never leaves
   the run green.
8. **write_migration_report** writes the report for people, `RUN_DIR/report.html` (and `report.md`,
   `report.json`): the plan's counts, every partition's copied counts and content hashes, every
   subscription's lost/duplicated counts, the cutover's hold and phases, the cleanup and each step's
   time. It runs even when a step failed (that run's report shows where), its log and XCom give the
   path, and it fails when the migration did. The **Pulsar migrations** view and the run's report tab
   show the same report.

**Switching back** after the flip: trigger `pulsar_tenant_rollback` with this run's id (copy or geo mode; the
clients return to the source with what they published on the target). **Migrating again** after that: trigger
this DAG with *Continue from run* set to the rolled-back run's id (the target keeps everything; the new run
continues from the old run's position maps).

**Retries are safe** because every step is idempotent: the Spark tasks retry twice (20 s apart), so a
broker restart or a lost executor costs a retry, not a migration. A step that refuses its input (exit
code 2: unknown tenant, conflicts, a missing earlier step) fails at once, without retries.

With *Dry run* the steps only plan: the reports (verdict `planned`), the plan dataset and the list
of what would be copied land in RUN_DIR and no cluster is touched.

Every step is idempotent (a re-run after success changes nothing; after a kill it finishes the job
without loss or duplicates), so a failed run can simply be triggered again with the same form, and a
failed task can be cleared and re-run.

RUN_DIR is `<Variable pulsar_migration_run_dir_base>/pulsar_tenant_migration/<run id>` (a relative
base is under the project root; `s3a://...` at scale). It holds `spec.json`, `sync_metadata.json`,
`sync_metadata_plan/` (Parquet), `replicate_topics.json`, `position_map/` (Parquet) and
`sync_progress.json`, `switch_lookup.json` (with its sub-reports `switch_lookup.<step>.*.json`),
`cleanup_source.json` and the report `report.{html,md,json}`.

Connections: a Pulsar connection's host/port/schema give the admin URL; extra holds `cluster_name`,
`service_url` and `tls`; the password, if any, is the token. The lookup service's connection gives its URL
the same way; its password is the service's admin token. Tokens reach Spark only as environment
variables `PULSAR_TOKEN_<CONN_ID>`; the spec names the variable, never the token.
"""

from __future__ import annotations

from pathlib import Path

from airflow.sdk import DAG, Param
from pulsar_migration import dag_params, dag_support
from pulsar_migration.dag_tasks import render_spec_task, report_task, step_tasks

PROJECT_ROOT = Path(__file__).resolve().parents[1]

with DAG(
    dag_id="pulsar_tenant_migration",
    schedule=None,  # UI-triggered; required params without defaults are only allowed without a schedule
    catchup=False,
    doc_md=__doc__,
    tags=["pulsar", "migration"],
    params={
        **dag_params.cluster_params(
            source_help="Airflow connection id of the Pulsar cluster the tenant lives on now.",
            target_help="Airflow connection id of the Pulsar cluster the tenant moves to."),
        # No tenant default: the form cannot be submitted without a tenant.
        **dag_params.selection_params(),
        "replication_mode": Param("copy", type="string", enum=["copy", "geo"], title="Replication mode",
                                  section="Behaviour",
                                  description="copy: Spark re-publishes every message exactly once and records "
                                              "where each landed. geo: Pulsar's own geo-replication is enabled on "
                                              "the namespaces (older messages included) and drained; it needs "
                                              "the brokers to reach each other."),
        **dag_params.rate_cap_params(),
        **dag_params.lookup_param(
            "Airflow connection id of the lookup service the tenant's clients use as their service URL "
            "(host/port/schema = its URL, password = its admin token); switch_lookup flips the tenant's route there."),
        **dag_params.cleanup_params(
            "Delete the tenant's topics and namespaces on the source right after the verified switch (no rollback is "
            "possible afterwards). Off: cleanup_source only verifies and lists what it would delete; clean up later "
            "with pulsar_source_cleanup. The target is never touched."),
        **dag_params.dry_run_param(),
        "follows_run_id": Param(None, type=["null", "string"], minLength=1, title="Continue from run",
                                section="Behaviour",
                                description="After a rollback: the run id of the rolled-back migration run of this "
                                            "tenant. Its position maps seed this run's, so the copy continues where "
                                            "it left off and what clients published on the target between the "
                                            "flips is known. Empty: start afresh."),
        "proceed_on_conflict": Param(False, type="boolean", title="Proceed on conflict", section="Behaviour",
                                     description="Go on when the target holds a resource that cannot take the "
                                                 "source's shape (more partitions, partitioned vs non-partitioned, "
                                                 "a different schema history): it is reported and left as it is, "
                                                 "everything else is synced. Differing policies are not "
                                                 "conflicts: they are set to the source's values."),
    },
    user_defined_macros=dag_support.macros(PROJECT_ROOT),
    # One run at a time: two runs (e.g. of the same tenant) would race on the target's metadata.
    max_active_runs=1,
):
    spec = render_spec_task(PROJECT_ROOT)
    # Each step chains on the previous publish task, so a step runs only after the one before verified.
    _, metadata_published = step_tasks("sync_metadata", PROJECT_ROOT, upstream=spec)
    _, replication_published = step_tasks("replicate_topics", PROJECT_ROOT, upstream=metadata_published)
    _, progress_published = step_tasks("sync_progress", PROJECT_ROOT, upstream=replication_published)
    _, switch_published = step_tasks("switch_lookup", PROJECT_ROOT, upstream=progress_published)
    _, cleanup_published = step_tasks("cleanup_source", PROJECT_ROOT, upstream=switch_published,
                                      dry_run_unless="confirm_cleanup", flags={"delete_tenant": "--delete-tenant"})
    report_task(upstream=[metadata_published, replication_published, progress_published, switch_published,
                          cleanup_published])
