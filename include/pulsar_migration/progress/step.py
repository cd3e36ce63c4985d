"""sync_progress: every durable subscription of every selected partition gets, on the target, exactly the
acknowledged set it has on the source, translated through replicate_topics' position map.

inventory (partitions; both sides' cursors read in Spark tasks) -> translate (Spark joins over the map) ->
compare with the target as it is (exact subscriptions are left alone, so re-runs converge and cost little)
-> apply the rest in Spark tasks (create, reset, acknowledge) -> read the target back, translate it back,
compare with the source state read at the start -> report (lost and duplicated must be 0).
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Iterator
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from pulsar_migration import rundir
from pulsar_migration.admin import NotFound
from pulsar_migration.progress import translate, window
from pulsar_migration.progress.apply import (
    ACK_MAX_IN_FLIGHT,
    APPLY_ROUNDS,
    VERIFY_ATTEMPTS,
    Applied,
    CursorPlan,
    ProgressError,
    apply_cursor,
)
from pulsar_migration.progress.cursors import CursorState, note_target_only, read_cursors
from pulsar_migration.replication import posmap
from pulsar_migration.replication.step import inventory
from pulsar_migration.report import stable_hash
from pulsar_migration.snapshot import FenceSnapshot
from pulsar_migration.spec import MigrationSpec
from pulsar_migration.stepjob import BadInput, StepContext, StepFailed

log = logging.getLogger(__name__)

STEP = "sync_progress"
DETAIL_LIMIT = 20


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--markdelete-only", action="store_true",
                        help="baseline for comparisons: translate markDeletePosition only and ignore individually "
                             "acknowledged messages, as Pulsar's replicated subscriptions do (never exact)")


def run(ctx: StepContext, *, in_driver: bool = False, snapshot: FenceSnapshot | None = None) -> None:
    """The step body; `in_driver` (the cutover's final sync) first tries progress.window, which needs no Spark
    job, and falls back to the Spark path when the window is not for it. `snapshot` (the cutover's fence)
    gives the partitions' bounds and both sides' cursors instead of reading them again."""
    spec, report = ctx.spec, ctx.report
    markdelete_only = bool(getattr(ctx.args, "markdelete_only", False))
    report.details["translation"] = "markdelete-only" if markdelete_only else "exact"
    src_admin, tgt_admin = spec.source_cluster.admin(), spec.target_cluster.admin()
    try:
        jobs = inventory(spec, src_admin, tgt_admin, {}, dry_run=ctx.dry_run,
                         uppers=snapshot.uppers if snapshot is not None else None)
    finally:
        src_admin.close()
        tgt_admin.close()
    topics = [job.topic for job in jobs]
    report.counts["partitions"] = len(topics)
    if in_driver and not ctx.dry_run and not markdelete_only and rundir.is_local(ctx.run_dir):
        try:
            covered = snapshot is not None and all(t in snapshot.source and t in snapshot.target for t in topics)
            window.sync(ctx, topics, snapshot if covered else None)
            report.details["path"] = "driver"
            return
        except window.Declined as exc:
            log.info("final sync in the driver declined (%s): the Spark path takes over", exc)
            report.details["driver_declined"] = str(exc)
    report.details["path"] = "spark"
    spark = ctx.spark
    position_map = posmap.read_map(spark, ctx.run_dir)
    if position_map is None:
        if ctx.dry_run:
            report.details["note"] = "no position map in the run dir yet: replicate_topics has not run"
            return
        raise BadInput(f"no position map in {ctx.run_dir}: run replicate_topics (with this run dir) first")
    from pyspark.sql import functions as F

    position_map = position_map.where(F.col("topic").isin(topics)).persist()
    try:
        _sync(ctx, jobs, position_map, markdelete_only)
    finally:
        position_map.unpersist()


def _sync(ctx: StepContext, jobs: list[Any], position_map: Any, markdelete_only: bool) -> None:

    report, spark = ctx.report, ctx.spark
    topics = [job.topic for job in jobs]
    started = time.monotonic()
    source_states, target_states = read_states(ctx, topics, sides=("source", "target"))
    report.details["read_s"] = round(time.monotonic() - started, 3)
    if source_states:
        read_at = [s.read_at_ms for s in source_states]
        report.details["source_state_read_at"] = {"first": _iso(min(read_at)), "last": _iso(max(read_at))}
    report.counts["subscriptions"] = len(source_states)
    report.counts["source_ranges"] = sum(len(s.ranges) for s in source_states)
    note_target_only(report, source_states, target_states)
    report.details["unreplicated_partitions"] = unreplicated(jobs, position_map)

    started = time.monotonic()
    src_cursors, src_ranges = translate.cursor_frames(spark, source_states)
    # What the target is judged against is always the whole source state; the baseline only plans less.
    source_marked = translate.mark_acked(position_map, src_cursors, translate.acked_entries(src_ranges),
                                         "source").persist()
    wanted = source_marked if not markdelete_only else translate.mark_acked(
        position_map, src_cursors, translate.acked_entries(src_ranges.limit(0)), "source").persist()
    try:
        before = _compare(spark, position_map, src_cursors, source_marked, target_states)
        pending = [row for row in before if not _exact(row)]
        report.details["translate_s"] = round(time.monotonic() - started, 3)
        report.counts["subscriptions_already_exact"] = len(before) - len(pending)
        log.info("%d subscription(s) on %d partition(s): %d already exact on the target, %d to set",
                 len(before), len(topics), len(before) - len(pending), len(pending))
        plans = plan_rows(spark, wanted, pending)
        report.counts["split_chunks"] = translate.split_chunks(source_marked)
        if ctx.dry_run:
            report.details["subscriptions"] = [_sub_detail(row, plans.get(_key(row))) for row in before]
            report.counts["subscriptions_to_set"] = len(pending)
            return
        applied: dict[tuple[str, str], Applied] = {}
        acks_sent = rounds = verify_reads = 0
        apply_s = verify_s = 0.0
        after, differing = before, pending
        # The markdelete-only baseline sets a target that differs from the source by design: one round, one
        # read-back (setting it again or reading it again cannot make it exact).
        max_rounds, reads_per_verify = (1, 1) if markdelete_only else (APPLY_ROUNDS, VERIFY_ATTEMPTS)
        # Acks are fire-and-forget in the binary protocol (the Python client has no ack receipts): a connection
        # cut after the client handed them over loses them. So what still differs after the read-back is set
        # again (reset and acks), a bounded number of rounds, unless setting it failed outright.
        while differing and rounds < max_rounds and not any(a.error for a in applied.values()):
            if rounds:
                log.warning("%d subscription(s) still differ after setting them (acks lost on a cut connection?): "
                            "setting them again, round %d of %d", len(differing), rounds + 1, max_rounds)
            rounds += 1
            started = time.monotonic()
            for done in apply_plans(ctx, spark, wanted, differing):
                acks_sent += done.acks_sent
                done.created = done.created or applied.get((done.topic, done.subscription), done).created
                applied[(done.topic, done.subscription)] = done
            apply_s += time.monotonic() - started
            started = time.monotonic()
            after, reads = _verify(ctx, spark, topics, position_map, src_cursors, source_marked, reads_per_verify)
            verify_s += time.monotonic() - started
            verify_reads += reads
            differing = [row for row in after if not _exact(row)]
        report.details["apply_s"] = round(apply_s, 3)
        report.details["verify_s"] = round(verify_s, 3)
        report.details["verify_reads"] = verify_reads
        report.counts["apply_rounds"] = rounds
        report.counts["subscriptions_set"] = sum(1 for a in applied.values() if not a.error)
        report.counts["subscriptions_created"] = sum(1 for a in applied.values() if a.created)
        report.counts["acks_sent"] = acks_sent
        summarise(ctx, after, plans, list(applied.values()))
    finally:
        source_marked.unpersist()
        wanted.unpersist()


def _verify(ctx: StepContext, spark: Any, topics: list[str], position_map: Any, src_cursors: Any,
            source_marked: Any, attempts: int) -> tuple[list[dict[str, Any]], int]:
    """The target read back and compared (acks travel asynchronously: a read right after the consumer
    closed may trail, so a difference is read again a few times); returns the rows and the reads taken."""
    reads = 0
    while True:
        _, target_states = read_states(ctx, topics, sides=("target",))
        after = _compare(spark, position_map, src_cursors, source_marked, target_states)
        reads += 1
        if all(_exact(row) for row in after) or reads == attempts:
            return after, reads
        time.sleep(0.5 * reads)


# -- reading ---------------------------------------------------------------------------------------

def read_states(ctx: StepContext, topics: list[str], *,
                sides: tuple[str, ...]) -> tuple[list[CursorState], list[CursorState]]:
    """Both sides' cursor states of every partition, read in Spark tasks (a few partitions per task)."""
    spec = ctx.spec
    if not topics:
        return [], []

    def read(part: Iterator[str]) -> Iterator[tuple[str, CursorState]]:
        admins = {side: (spec.source_cluster if side == "source" else spec.target_cluster).admin() for side in sides}
        try:
            for topic in part:
                for side, admin in admins.items():
                    try:
                        states = read_cursors(admin, topic)
                    except NotFound:
                        if side == "source":
                            raise
                        states = {}  # a dry run before sync_metadata: the topic is not on the target yet
                    for state in states.values():
                        yield side, state
        finally:
            for admin in admins.values():
                admin.close()

    slices = min(len(topics), max(spec.admin_concurrency, 1))
    rows = ctx.spark.sparkContext.parallelize(topics, slices).mapPartitions(read).collect()
    return [s for side, s in rows if side == "source"], [s for side, s in rows if side == "target"]


def unreplicated(jobs: list[Any], position_map: Any) -> list[dict[str, str]]:
    """Partitions whose source holds entries after the map's end (replication lag when the cursors were
    read): acks on those entries wait for the next replicate_topics + sync_progress."""
    ends = {row.topic: (row.source_ledger, row.source_entry) for row in posmap.map_ends(position_map).collect()}
    lagging = []
    for job in jobs:
        if job.upper is None:
            continue
        end = ends.get(job.topic)
        if end is None or (job.upper.ledger, job.upper.entry) > end:
            lagging.append({"topic": job.topic, "source_last": str(job.upper),
                            "map_end": f"{end[0]}:{end[1]}" if end else None})
    if lagging:
        log.warning("%d partition(s) have source entries the position map does not cover yet (first: %s)",
                    len(lagging), lagging[0]["topic"])
    return lagging


# -- translating and comparing ---------------------------------------------------------------------

def _compare(spark: Any, position_map: Any, src_cursors: Any, source_marked: Any,
             target_states: list[CursorState]) -> list[dict[str, Any]]:
    tgt_cursors, tgt_ranges = translate.cursor_frames(spark, target_states)
    target_marked = translate.mark_acked(position_map, tgt_cursors, translate.acked_entries(tgt_ranges), "target")
    rows = translate.compare(src_cursors, source_marked, target_marked, tgt_cursors).collect()
    return sorted((row.asDict() for row in rows), key=_key)


def _key(row: dict[str, Any]) -> tuple[str, str]:
    return row["topic"], row["subscription"]


def _exact(row: dict[str, Any]) -> bool:
    return bool(row["on_target"]) and row["lost"] == 0 and row["duplicated"] == 0 \
        and row["source_digest"] == row["target_digest"]


def plan_rows(spark: Any, source_marked: Any, pending: list[dict[str, Any]]) -> dict[tuple[str, str], CursorPlan]:
    """The cursor plan of every pending subscription (no mapped entries: reset nothing, create if missing)."""
    if not pending:
        return {}
    plan, _ = translate.target_plan(_only(spark, source_marked, pending))
    plans = {(r.topic, r.subscription): CursorPlan(r.topic, r.subscription, r.reset_ledger, r.reset_entry,
                                                   bool(r.excluded)) for r in plan.collect()}
    for row in pending:
        plans.setdefault(_key(row), CursorPlan(row["topic"], row["subscription"], None, None, False))
    return plans


def _only(spark: Any, frame: Any, subs: list[dict[str, Any]]) -> Any:
    keys = spark.createDataFrame([_key(row) for row in subs], "topic string, subscription string")
    return frame.join(keys, translate.SUB_KEYS)


# -- applying --------------------------------------------------------------------------------------

def apply_plans(ctx: StepContext, spark: Any, source_marked: Any, pending: list[dict[str, Any]]) -> list[Applied]:
    """Sets every pending subscription in Spark tasks: one task per partition topic (its subscriptions one
    after the other, since a reset disconnects consumers), as many tasks at once as Spark has cores."""
    if not pending:
        return []
    from pyspark.sql import functions as F

    selected = _only(spark, source_marked, pending)
    plan, acks = translate.target_plan(selected)
    ack_lists = acks.groupBy(*translate.SUB_KEYS).agg(
        F.sort_array(F.collect_list(F.struct("ledger", "entry"))).alias("acks"))
    keys = spark.createDataFrame([_key(row) for row in pending], "topic string, subscription string")
    rows = (keys.join(plan, translate.SUB_KEYS, "left").join(ack_lists, translate.SUB_KEYS, "left")
            .repartition(min(len({r["topic"] for r in pending}), 64), "topic")
            .sortWithinPartitions("topic", "subscription"))
    spec = ctx.spec
    applied = rows.rdd.mapPartitions(lambda part: _apply_task(spec, part)).collect()
    return [Applied(**a) for a in applied]


def _apply_task(spec: MigrationSpec, rows: Iterator[Any]) -> Iterator[dict[str, Any]]:
    admin = spec.target_cluster.admin()
    client = spec.target_cluster.pulsar_client()
    try:
        for row in rows:
            plan = CursorPlan(row.topic, row.subscription, row.reset_ledger, row.reset_entry, bool(row.excluded))
            try:
                done = apply_cursor(admin, client, plan, ((a.ledger, a.entry) for a in row.acks or ()),
                                    max_in_flight=ACK_MAX_IN_FLIGHT)
            except ProgressError as exc:
                done = Applied(plan.topic, plan.subscription, error=str(exc))
            except Exception as exc:  # one line per subscription; the driver fails the step with it
                log.warning("setting %s on %s failed", plan.subscription, plan.topic, exc_info=True)
                done = Applied(plan.topic, plan.subscription, error=f"{type(exc).__name__}: {exc}")
            yield asdict(done)
    finally:
        client.close()
        admin.close()


# -- report ----------------------------------------------------------------------------------------

_TOTALS = ("mapped_entries", "source_acked_entries", "target_acked_entries", "source_backlog", "target_backlog",
           "lost", "duplicated")


def summarise(ctx: StepContext, after: list[dict[str, Any]], plans: dict[tuple[str, str], CursorPlan],
              applied: list[Applied]) -> None:
    report = ctx.report
    for name in _TOTALS:
        report.counts[name] = sum(int(row[name]) for row in after)
    done = {(a.topic, a.subscription): a for a in applied}
    report.details["subscriptions"] = [_sub_detail(row, plans.get(_key(row)), done.get(_key(row))) for row in after]
    report.hashes["source_acked"] = stable_hash(f"{r['topic']}|{r['subscription']}|{r['source_digest']}" for r in after)
    report.hashes["target_acked"] = stable_hash(f"{r['topic']}|{r['subscription']}|{r['target_digest']}" for r in after)
    failed = [a for a in applied if a.error]
    wrong = [row for row in after if not _exact(row)]
    for row in after:
        log.info("%s %s (%s): %d mapped entries, source backlog %d, target backlog %d, lost %d, duplicated %d",
                 row["topic"], row["subscription"], row["sub_type"], row["mapped_entries"], row["source_backlog"],
                 row["target_backlog"], row["lost"], row["duplicated"])
    if failed:
        report.details["failures"] = [asdict(a) for a in failed[:DETAIL_LIMIT]]
        raise StepFailed(f"{len(failed)} subscription(s) could not be set; first: {failed[0].error}")
    if wrong:
        first = wrong[0]
        names = ", ".join(f"{r['topic'].split('://', 1)[-1]} {r['subscription']}" for r in wrong[:3])
        raise StepFailed(f"{len(wrong)} subscription(s) differ on the target after the sync ({names}"
                         f"{', ...' if len(wrong) > 3 else ''}): lost {report.counts['lost']}, duplicated "
                         f"{report.counts['duplicated']} message(s); first difference at target entry "
                         f"{first['first_difference']} of {first['subscription']}")


def _sub_detail(row: dict[str, Any], plan: CursorPlan | None, done: Applied | None = None) -> dict[str, Any]:
    detail = {k: row[k] for k in ("topic", "subscription", "sub_type", "ranges", "mapped_entries",
                                  "source_acked_entries", "target_acked_entries", "source_backlog",
                                  "target_backlog", "lost", "duplicated", "source_broker_backlog",
                                  "target_broker_backlog", "first_difference")}
    detail["source_mark_delete"] = f"{row['md_ledger']}:{row['md_entry']}"
    detail["source_read_at"] = _iso(row["read_at_ms"])
    if plan is not None:
        detail["reset_to"] = (f"{plan.reset_ledger}:{plan.reset_entry}{'' if plan.excluded else ' (first unacked)'}"
                              if plan.reset_ledger is not None else None)
    if done is not None:
        detail.update(created=done.created, acks_sent=done.acks_sent, apply_s=done.apply_s, error=done.error)
    return detail


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
