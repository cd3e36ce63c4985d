"""sync_metadata: register clusters, then make the target hold the source tenant's metadata.

inventory (source = desired, both clusters = actual) -> plan (Spark join) -> apply (executors) ->
verify (fresh inventory; every covered row must project equal to its desired payload).
"""

from __future__ import annotations

import json
import logging
import time

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pulsar_migration import rundir
from pulsar_migration.lookup.client import LookupServiceError
from pulsar_migration.metadata import resources as r
from pulsar_migration.metadata.apply import Change, apply_changes
from pulsar_migration.metadata.fields import set_only_on_target
from pulsar_migration.metadata.inventory import read_layout
from pulsar_migration.metadata.plan import CHANGING_ACTIONS, CONFLICT, plan_counts, plan_metadata
from pulsar_migration.metadata.state import Clusters, actual_state, desired_state, project_actual
from pulsar_migration.report import stable_hash
from pulsar_migration.spec import MigrationSpec
from pulsar_migration.stepjob import BadInput, StepContext, StepFailed

log = logging.getLogger(__name__)

STEP = "sync_metadata"
PLAN_DATASET = "sync_metadata_plan"
SWITCH_REPORT = "switch_lookup.json"  # a run dir holding it switched (or tried to switch) the tenant itself
CONFLICT_DETAIL_LIMIT = 100
VERIFY_ATTEMPTS = 5
VERIFY_RETRY_DELAY_S = 2.0  # doubled after each attempt: 30 s in all for a loaded broker's policy cache


def check_not_switched(spec: MigrationSpec, run_dir: str, spark: SparkSession | None = None) -> None:
    """BadInput when the lookup service routes the tenant to the target already and this run dir did not switch
    it: the clients write there, and a new run would apply the frozen source's metadata over theirs (updating
    policies back, creating subscriptions and topics they deleted since). Asked before anything is read; a service
    that does not answer is only warned about (this step does not need it)."""
    if spec.lookup_url is None or rundir.exists(run_dir, SWITCH_REPORT, spark):
        return
    lookup = spec.lookup_admin()
    try:
        route = lookup.route(spec.tenant)
    except LookupServiceError as exc:
        log.warning("cannot tell where the lookup service routes tenant %s: %s", spec.tenant, exc)
        return
    finally:
        lookup.close()
    if route.get("cluster") == spec.target:
        raise BadInput(f"the lookup service routes tenant {spec.tenant} to the target {spec.target} already: its "
                       "clients write there, and a new migration run would apply the source's metadata over theirs; "
                       "to finish the run that switched it, clear its failed task; to migrate again, roll it back "
                       "first (pulsar_tenant_rollback)")


def run(ctx: StepContext) -> None:
    spec, report, spark = ctx.spec, ctx.report, ctx.spark
    concurrency = spec.admin_concurrency
    check_not_switched(spec, ctx.run_dir, spark)
    clusters = Clusters.open(spec)
    try:
        started = time.monotonic()
        # Both inventories complete before anything is written: bad input fails with no writes.
        source = read_layout(clusters.source, spec, must_exist=True)
        desired = desired_state(spark, spec, source, concurrency).cache()
        desired_topics = {row.key for row in desired.filter(F.col("kind") == r.TOPIC).select("key").collect()}
        actual = actual_state(spark, spec, clusters, desired_topics, concurrency)
        plan = plan_metadata(desired, actual).cache()
        plan.count()  # materialise now: the target's per-topic reads belong to the inventory time
        report.details["inventory_s"] = round(time.monotonic() - started, 3)
        started = time.monotonic()
        _record_plan(ctx, plan)
        report.details["plan_s"] = round(time.monotonic() - started, 3)

        conflicts = report.counts.get(CONFLICT, 0)
        if conflicts and not spec.proceed_on_conflict:
            raise BadInput(f"{conflicts} conflict(s) in the plan (see {rundir.join(ctx.run_dir, PLAN_DATASET)}); "
                             "resolve them on the target or set options.proceed_on_conflict")
        if ctx.dry_run:
            return

        changes = [Change(**row.asDict()) for row in plan.filter(F.col("action").isin(*CHANGING_ACTIONS))
                   .select("side", "kind", "key", "namespace", "action", "desired", "change").collect()]
        started = time.monotonic()
        results = apply_changes(spark, spec, changes, concurrency)
        report.details["apply_s"] = round(time.monotonic() - started, 3)
        report.counts["applied"] = sum(res.ok for res in results)
        report.counts["apply_failed"] = sum(not res.ok for res in results)
        failures = [res for res in results if not res.ok]
        report.details["apply_failures"] = [
            {"side": f.side, "kind": f.kind, "key": f.key, "action": f.action, "error": f.error}
            for f in failures[:CONFLICT_DETAIL_LIMIT]
        ]
        if failures:
            first = failures[0]
            raise StepFailed(f"{len(failures)} of {len(results)} change(s) failed; first: {first.kind} "
                             f"{first.key} ({first.action}): {first.error}")

        existed = {(res.side, res.kind, res.key): res.error for res in results if res.ok and res.error}
        if existed:
            report.details["created_already_there"] = [
                {"side": k[0], "kind": k[1], "key": k[2], "answer": v}
                for k, v in list(existed.items())[:CONFLICT_DETAIL_LIMIT]]
        planned_conflicts = {(row.side, row.kind, row.key) for row in plan.filter(F.col("action") == CONFLICT)
                             .select("side", "kind", "key").collect()}
        started = time.monotonic()
        _verify(ctx, clusters, desired, desired_topics, planned_conflicts, concurrency, existed)
        report.details["verify_s"] = round(time.monotonic() - started, 3)
    finally:
        clusters.close()


def _record_plan(ctx: StepContext, plan: DataFrame) -> None:
    """Writes the plan dataset, counts it into the report and logs a summary."""
    location = rundir.join(ctx.run_dir, PLAN_DATASET)
    plan.orderBy("side", "kind", "key").write.mode("overwrite").parquet(location)
    ctx.report.details["plan"] = location
    ctx.report.counts.update(plan_counts(plan))
    ctx.report.details["conflicts"] = [
        {"kind": row.kind, "key": row.key, "reason": row.reason}
        for row in plan.filter(F.col("action") == CONFLICT).orderBy("kind", "key").limit(CONFLICT_DETAIL_LIMIT)
        .collect()
    ]
    changing = plan.filter(F.col("action").isin(*CHANGING_ACTIONS)).orderBy("side", "kind", "key")
    for row in changing.limit(20).collect():
        log.info("plan: %-8s %-6s %-23s %s (%s)", row.action, row.side, row.kind, row.key, row.reason)
    log.info("plan: %s", ", ".join(f"{a}={ctx.report.counts.get(a, 0)}" for a in ("CREATE", "UPDATE", "CONFLICT",
                                                                                     "NOOP")))
    for conflict in ctx.report.details["conflicts"][:20]:
        log.warning("conflict: %s %s: %s", conflict["kind"], conflict["key"], conflict["reason"])
    _note_set_only_on_target(ctx, plan)


def _note_set_only_on_target(ctx: StepContext, plan: DataFrame) -> None:
    """Counts and names the namespace and topic policies only the target holds (left as they are)."""
    found = []
    rows = plan.filter((F.col("side") == r.TARGET) & F.col("kind").isin(r.NAMESPACE, *sorted(r.TOPIC_POLICY_KINDS))
                       & F.col("actual").isNotNull()).select("kind", "key", "desired", "actual").orderBy("kind", "key")
    for row in rows.collect():
        if row.kind == r.NAMESPACE and row.desired is None:
            continue  # a namespace only the target has: left alone as a whole
        desired, actual = (json.loads(row.desired) if row.desired else None), json.loads(row.actual)
        if row.kind == r.NAMESPACE:
            desired, actual = (desired or {}).get("policies"), actual.get("policies") or {}
        extra = set_only_on_target(desired, actual)
        if extra:
            found.append({"kind": row.kind, "key": row.key, "settings": extra})
    ctx.report.counts["set_only_on_target"] = len(found)
    if found:
        ctx.report.details["set_only_on_target"] = found[:CONFLICT_DETAIL_LIMIT]
        first = found[0]
        log.warning("%d namespace(s) or topic(s) hold policies on the target that the source does not (first: %s %s: "
                    "%s): left as they are; where the source removed them after an earlier sync, remove them on the "
                    "target too", len(found), first["kind"], first["key"], ", ".join(first["settings"]))


def _verify(ctx: StepContext, clusters: Clusters, desired: DataFrame, desired_topics: set[str],
            planned_conflicts: set[tuple[str, str, str]], concurrency: int,
            existed: dict[tuple[str, str, str], str] | None = None) -> None:
    """Fresh inventory of both clusters; every desired row the plan did not mark CONFLICT must now hold
    exactly (a conflict that appeared during apply, e.g. a producer auto-creating a topic, fails here).

    Topic-level policies reach the broker's policy cache through the `__change_events` system topic,
    a moment after the admin call returns: a mismatch is re-read a few times before it counts.
    """
    report = ctx.report
    for attempt in range(1, VERIFY_ATTEMPTS + 1):
        mismatched, remaining = _compare(ctx, clusters, desired, desired_topics, planned_conflicts, concurrency)
        report.counts["verify_attempts"] = attempt
        if not mismatched and not remaining:
            log.info("verified %d resources: desired hash %s == actual hash", report.counts["verified_rows"],
                     report.hashes["desired"][:16])
            return
        if attempt < VERIFY_ATTEMPTS:
            log.info("verification attempt %d: %d resource(s) not yet as desired; re-reading", attempt,
                     len(mismatched))
            time.sleep(VERIFY_RETRY_DELAY_S * 2 ** (attempt - 1))
    first = mismatched[0] if mismatched else ("?", "?", "?")
    answer = (existed or {}).get(first)
    why = f"; its CREATE was answered {answer}" if answer else ""
    raise StepFailed(f"verification failed: {len(mismatched)} resource(s) differ after apply "
                     f"(first: {first[1]} {first[2]} on {first[0]}{why}), {remaining} change(s) still planned")


def _compare(ctx: StepContext, clusters: Clusters, desired: DataFrame, desired_topics: set[str],
             planned_conflicts: set[tuple[str, str, str]], concurrency: int) -> tuple[list[tuple[str, str, str]], int]:
    """Hashes desired vs projected actual payloads; returns the differing rows and the re-plan's changes."""
    spec, report, spark = ctx.spec, ctx.report, ctx.spark
    actual = actual_state(spark, spec, clusters, desired_topics, concurrency)
    replan = plan_metadata(desired, actual).filter(F.col("desired").isNotNull()).cache()
    rows = replan.select("side", "kind", "key", "desired", "actual").collect()
    pairs = [((row.side, row.kind, row.key), row.desired, project_actual(row.kind, row.desired, row.actual))
             for row in rows if (row.side, row.kind, row.key) not in planned_conflicts]
    report.counts["verified_rows"] = len(pairs)
    report.hashes["desired"] = stable_hash(f"{'|'.join(k)}|{d}" for k, d, _ in pairs)
    report.hashes["target_actual"] = stable_hash(f"{'|'.join(k)}|{a}" for k, _, a in pairs)
    remaining = replan.filter(F.col("action").isin(*CHANGING_ACTIONS)).count()
    report.counts["verify_remaining_changes"] = remaining
    replan.unpersist()
    return sorted(k for k, d, a in pairs if d != a), remaining
