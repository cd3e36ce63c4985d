"""backfill_window and restore_window: one time window of the tenant's topics to a sink, and back.

    spark-submit spark_jobs/backfill_window.py --spec SPEC --run-dir RUN_DIR --start ISO --end ISO [--dry-run]
    spark-submit spark_jobs/restore_window.py  --spec SPEC --run-dir RUN_DIR --start ISO --end ISO [--dry-run]

backfill_window, sink `pulsar` (options.backfill_sink): the copy of replicate_topics, capped at the window's
end. Its position map lives in a state dir shared by all windows (options.backfill_state_dir), so each window
continues where the last one ended and a re-run finds nothing left to send. The state dir records where its copy
began (the first window's start, `coverage.json`): a partition the map does not know yet starts there, and a window
with messages before it is refused (they would land after later ones). So a run copies what the target lacks up to
the window's end: after a skipped or failed window, the next run brings both (nothing is lost), and re-running a
window changes nothing.

backfill_window, sink `parquet`: the window's messages (cut at its edges as the archive recorded them: edges.py)
are written to the archive at options.archive_path, replacing that window's partitions, then read back and
compared per partition (rows, digest sums, each row's digest recomputed, the last entry read = the window's last
entry). A window archived already is not written again when the source gives the same rows, and is refused when it
gives fewer (the archive is the backup of what retention has since removed).

restore_window: the archived window replayed into the spec's *target* cluster, exactly once (restore.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from pulsar_migration import rundir
from pulsar_migration.admin import NotFound, PulsarAdmin
from pulsar_migration.backfill import archive as arch
from pulsar_migration.backfill import edges, state_lock
from pulsar_migration.backfill.restore import restore_rows, target_topic
from pulsar_migration.backfill.window import (
    Window,
    WindowRange,
    entry_before,
    first_at_or_after,
    source_partitions,
    window_range,
)
from pulsar_migration.positions import Position
from pulsar_migration.replication import step as replication
from pulsar_migration.report import stable_hash
from pulsar_migration.stepjob import BadInput, StepContext, StepFailed

log = logging.getLogger(__name__)

BACKFILL_STEP = "backfill_window"
RESTORE_STEP = "restore_window"
COVERAGE = "coverage.json"  # in the cluster sink's state dir: where its copy begins


def add_window_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--start", required=True, help="window start, ISO instant (inclusive)")
    parser.add_argument("--end", required=True, help="window end, ISO instant (exclusive)")


def state_dir(ctx: StepContext) -> str:
    """Where the cluster sink's position map lives across windows."""
    explicit = ctx.spec.options.get("backfill_state_dir")
    if explicit:
        return str(explicit)
    spec = ctx.spec
    parent = ctx.run_dir.rstrip("/").rsplit("/", 1)[0]
    return rundir.join(parent, f"_state/{spec.tenant}.{spec.source}.{spec.target}")


def window_ranges(ctx: StepContext, window: Window) -> list[WindowRange]:
    spec = ctx.spec
    admin = spec.source_cluster.admin()
    try:
        partitions = source_partitions(spec, admin)
        with ThreadPoolExecutor(spec.admin_concurrency) as pool:
            return list(pool.map(lambda p: window_range(admin, *p, window), partitions))
    finally:
        admin.close()


def _record_window(ctx: StepContext, window: Window, ranges: list[WindowRange]) -> None:
    ctx.report.details["window"] = {"start": window.start.isoformat(), "end": window.end.isoformat(),
                                    "label": window.label}
    ctx.report.details["ranges"] = [{"topic": r.topic, "first": str(r.first) if r.first else None,
                                     "upper": str(r.upper) if r.upper else None} for r in ranges]
    ctx.report.counts["partitions"] = len(ranges)
    ctx.report.counts["partitions_with_messages"] = sum(not r.empty for r in ranges)


def archive_window_ranges(ctx: StepContext, window: Window) -> list[WindowRange]:
    """The parquet sink's ranges: cut at the window's edges as the archive recorded them (backfill.edges)."""
    spec, archive = ctx.spec, ctx.spec.archive_path
    if not archive:
        raise BadInput("backfill_sink 'parquet' needs options.archive_path")
    admin = spec.source_cluster.admin()
    try:
        return edges.archive_ranges(admin, archive, spec.tenant, window, source_partitions(spec, admin),
                                    concurrency=spec.admin_concurrency, record=not ctx.dry_run,
                                    spark=None if rundir.is_local(archive) else ctx.spark)
    finally:
        admin.close()


def run_backfill(ctx: StepContext) -> None:
    window = Window.parse(ctx.args.start, ctx.args.end)
    sink = ctx.spec.backfill_sink
    ctx.report.details["sink"] = sink
    ranges = archive_window_ranges(ctx, window) if sink == "parquet" else window_ranges(ctx, window)
    _record_window(ctx, window, ranges)
    log.info("window %s (%s): %d partition(s), %d with messages; sink %s", window, window.label, len(ranges),
             ctx.report.counts["partitions_with_messages"], sink)
    if sink == "parquet":
        # Archived from the same readers as a copy (the cluster sink checks inside replication.run).
        admin = ctx.spec.source_cluster.admin()
        try:
            guards = replication.check_source_readers(ctx.spec, admin, sorted({r.base_topic for r in ranges
                                                                               if not r.empty}),
                                                      ctx.report.details, dry_run=ctx.dry_run)
        finally:
            admin.close()
        _to_archive(ctx, window, ranges, guards)
    else:
        _to_cluster(ctx, window, ranges)


def coverage_start(ctx: StepContext, state: str, window: Window) -> int:
    """Where the state dir's copy begins (ms): the start of the first window run with it, recorded then
    (`COVERAGE`)."""
    spark = None if rundir.is_local(state) else ctx.spark
    if rundir.exists(state, COVERAGE, spark):
        return int(json.loads(rundir.read_text(state, COVERAGE, spark))["start_ms"])
    if not ctx.dry_run:
        rundir.ensure_dir(state, spark)
        rundir.write_text(state, COVERAGE, json.dumps({"start": window.start.isoformat(),
                                                       "start_ms": window.start_ms}), spark)
    return window.start_ms


def check_covered(ctx: StepContext, admin: PulsarAdmin, state: str, window: Window, ranges: list[WindowRange],
                  covered_from: int) -> None:
    """BadInput for a window with messages published before where the state dir began: they would land on the target
    after later ones (the copy keeps each partition's order), and the map, already past them, would copy none of
    them. A window that only starts earlier, with no message before that, runs (a scheduled hour around it)."""
    if window.start_ms >= covered_from:
        return
    early = [wr.topic for wr in ranges if not wr.empty and wr.first is not None
             and wr.first < first_at_or_after(admin, wr.topic, covered_from)]
    if early:
        began = datetime.fromtimestamp(covered_from / 1000, UTC).isoformat()
        raise BadInput(f"window {window} has messages before {began}, where the backfill state dir {state} began "
                       f"({len(early)} partition(s), first {early[0]}): they would land on {ctx.spec.target} after "
                       "later ones; copy them with a new options.backfill_state_dir, or to the archive "
                       "(backfill_sink parquet)")


def _to_cluster(ctx: StepContext, window: Window, ranges: list[WindowRange]) -> None:
    state = state_dir(ctx)
    ctx.report.details["state_dir"] = state
    src_admin = ctx.spec.source_cluster.admin()
    try:
        if ctx.dry_run:
            _copy_window(ctx, window, ranges, src_admin, state)
        else:
            with state_lock.holding(state, f"window {window}"):  # one window at a time in a state dir
                _copy_window(ctx, window, ranges, src_admin, state)
    finally:
        src_admin.close()


def _copy_window(ctx: StepContext, window: Window, ranges: list[WindowRange], src_admin: PulsarAdmin,
                 state: str) -> None:
    by_topic = {r.topic: r for r in ranges}
    covered_from = coverage_start(ctx, state, window)
    ctx.report.details["state_covers_from"] = datetime.fromtimestamp(covered_from / 1000, UTC).isoformat()

    def new_partition_start(topic: str, first: Position) -> Position | None:
        """A partition the map does not know starts where the state dir began: its messages in windows that ran
        before it reached the map (a window failed on it, say, before sync_metadata created it on the target) are
        copied now instead of skipped."""
        if covered_from < window.start_ms:
            first = min(first, first_at_or_after(src_admin, topic, covered_from))
        return entry_before(src_admin, topic, first)

    def bound(topic: str) -> tuple[Position, Callable[[], Position | None]] | None:
        wr = by_topic.get(topic)
        if wr is None or wr.empty:
            return None
        assert wr.first is not None and wr.upper is not None
        first = wr.first
        return wr.upper, lambda: new_partition_start(topic, first)

    check_covered(ctx, src_admin, state, window, ranges, covered_from)
    # The copy's map lives in the state dir; its report is this window's.
    replication.run(dataclasses.replace(ctx, run_dir=state), bound=bound)


def _to_archive(ctx: StepContext, window: Window, ranges: list[WindowRange],
                guards: dict[str, tuple[int, int]] | None = None) -> None:
    from pyspark import StorageLevel

    archive = ctx.spec.archive_path
    if not archive:
        raise BadInput("backfill_sink 'parquet' needs options.archive_path")
    ctx.report.details["archive"] = archive
    spark = ctx.spark
    held_back = spark.sparkContext.accumulator(0.0)  # seconds the rate cap held the reads back, over the tasks
    started = time.monotonic()
    frame = arch.window_frame(spark, ctx.spec, window, ranges, held_back, guards or {}).persist(
        StorageLevel.MEMORY_AND_DISK)
    try:
        source = arch.partition_totals(frame)
        ctx.report.details["read_s"] = round(time.monotonic() - started, 3)
        if ctx.spec.copy_caps:  # the reads kept to them (archive.read_window_rows)
            ctx.report.details["throttle"] = {**ctx.spec.copy_caps.as_report(),
                                              "held_back_s": round(held_back.value, 3)}
        ctx.report.counts["source_messages"] = sum(t["rows"] for t in source.values())
        _check_complete(ranges, source)
        archived = _archived_totals(ctx, window)
        unchanged = bool(archived) and archive_change(window, archived, source) == "unchanged"
        ctx.report.details["already_archived"] = unchanged
        if ctx.dry_run:
            return
        started = time.monotonic()
        if source and not unchanged:
            arch.write_window(frame, archive)
        ctx.report.details["write_s"] = round(time.monotonic() - started, 3)
    finally:
        frame.unpersist()
    started = time.monotonic()
    _verify_archive(ctx, window, source)
    ctx.report.details["verify_s"] = round(time.monotonic() - started, 3)


def _archived_totals(ctx: StepContext, window: Window) -> dict[tuple[str, str, int], dict[str, Any]]:
    """Per partition, what the archive already holds of the window (of the spec's selected topics)."""
    frame = arch.read_archived(ctx.spark, ctx.spec.archive_path or "", ctx.spec.tenant, window)
    if frame is None:
        return {}
    totals = arch.partition_totals(frame)
    return {k: v for k, v in totals.items()
            if ctx.spec.namespace_selected(k[0]) and ctx.spec.topics.selects(f"{k[0]}/{k[1]}")}


def archive_change(window: Window, archived: dict[tuple[str, str, int], dict[str, Any]],
                   source: dict[tuple[str, str, int], dict[str, Any]]) -> str:
    """What writing the window again would do to the archive: "unchanged" (the same rows: nothing is written),
    "completed" (more rows than an earlier, partial write). StepFailed where the source now gives fewer messages of a
    partition than the archive holds (retention or a delete took them since): the archive is the backup, and
    overwriting it would lose them."""
    if archived == source:
        return "unchanged"
    shrunk = sorted(k for k, held in archived.items() if held["rows"] > (source.get(k) or {}).get("rows", 0))
    if shrunk:
        first = "/".join(str(x) for x in shrunk[0])
        raise StepFailed(f"window {window.label} is archived with more messages than the source now gives on "
                         f"{len(shrunk)} partition(s) (first: {first}: {archived[shrunk[0]]['rows']} archived, "
                         f"{(source.get(shrunk[0]) or {}).get('rows', 0)} now): the archive is kept as it is; delete "
                         "the window's partitions there to archive what the source holds now")
    return "completed"


def _check_complete(ranges: list[WindowRange], totals: dict[tuple[str, str, int], dict[str, Any]]) -> None:
    """Every partition with entries in the window was read to its last entry (a reader that ran dry early, e.g.
    on a topic deleted meanwhile, must not pass for a complete window)."""
    for wr in ranges:
        if wr.empty:
            continue
        namespace, topic = wr.local.split("/", 1)
        got = totals.get((namespace, topic, wr.partition))
        assert wr.upper is not None
        if got is None or Position(*got["last"]) != wr.upper:
            last = Position(*got["last"]) if got else None
            raise StepFailed(f"{wr.topic}: read up to {last}, but the window ends at entry {wr.upper}")


def _verify_archive(ctx: StepContext, window: Window, source: dict[tuple[str, str, int], dict[str, Any]]) -> None:
    from pyspark.sql import functions as F

    archived = arch.read_archived(ctx.spark, ctx.spec.archive_path or "", ctx.spec.tenant, window)
    if archived is None:
        target: dict[tuple[str, str, int], dict[str, Any]] = {}
        bad_digests = 0
    else:
        selected = {f"{ns}/{t}" for ns, t, _ in source}
        archived = archived.where(F.concat_ws("/", "namespace", "topic").isin(sorted(selected))) if selected \
            else archived.limit(0)
        target = arch.partition_totals(archived)
        bad_digests = archived.where(F.col("digest") != arch.digest_column()).count()
    ctx.report.counts["archived_messages"] = sum(t["rows"] for t in target.values())
    ctx.report.counts["digest_mismatches"] = bad_digests
    ctx.report.hashes["source"] = stable_hash(f"{k}|{v['rows']}|{v['digest_sum']}" for k, v in source.items())
    ctx.report.hashes["archive"] = stable_hash(f"{k}|{v['rows']}|{v['digest_sum']}" for k, v in target.items())
    differing = sorted(k for k in set(source) | set(target)
                       if (source.get(k) or {}).get("digest_sum") != (target.get(k) or {}).get("digest_sum")
                       or (source.get(k) or {}).get("rows") != (target.get(k) or {}).get("rows"))
    if differing or bad_digests:
        first = "/".join(str(x) for x in differing[0]) if differing else "row digests"
        raise StepFailed(f"archive of window {window.label} differs from the source: {len(differing)} partition(s), "
                         f"{bad_digests} row digest(s) (first: {first})")


def run_restore(ctx: StepContext) -> None:
    from pyspark.sql import functions as F

    window = Window.parse(ctx.args.start, ctx.args.end)
    spec = ctx.spec
    archive = spec.archive_path
    if not archive:
        raise BadInput("restore_window needs options.archive_path")
    ctx.report.details.update({"window": {"start": window.start.isoformat(), "end": window.end.isoformat(),
                                          "label": window.label}, "archive": archive})
    frame = arch.read_archived(ctx.spark, archive, spec.tenant, window)
    if frame is None:
        raise BadInput(f"no archive at {archive}")
    keys = ["namespace", "topic", "partition"]
    present = [(r["namespace"], r["topic"], r["partition"]) for r in frame.select(*keys).distinct().collect()]
    chosen = sorted(k for k in present if spec.namespace_selected(k[0]) and spec.topics.selects(f"{k[0]}/{k[1]}"))
    ctx.report.counts["partitions"] = len(chosen)
    if not chosen:
        return
    frame = frame.where(F.concat_ws("/", "namespace", "topic").isin(sorted({f"{ns}/{t}" for ns, t, _ in chosen})))
    ctx.report.counts["archived_messages"] = frame.count()
    if ctx.dry_run:
        return
    admin = spec.target_cluster.admin()
    try:
        topics = [target_topic(spec, *k) for k in chosen]
        for topic in topics:
            try:
                admin.get(f"{admin.topic_path(topic)}/stats")
            except NotFound:
                raise BadInput(f"{topic} does not exist on {spec.target}: run sync_metadata first") from None
        replication.enable_deduplication_on(admin, spec, sorted({ns for ns, _, _ in chosen}), topics)
    finally:
        admin.close()
    outcomes = (frame.repartition(*keys).sortWithinPartitions(*keys, *arch.SORT_COLUMNS).rdd
                .mapPartitions(restore_rows(spec, window.label)).collect())
    ctx.report.details["partitions"] = outcomes
    for name in ("sent", "restored"):
        ctx.report.counts[name] = sum(o[name] for o in outcomes)
    ctx.report.hashes["archive"] = stable_hash(f"{o['topic']}|{o['archive_digest']}" for o in outcomes)
    ctx.report.hashes["restored"] = stable_hash(f"{o['topic']}|{o['restored_digest']}" for o in outcomes)
    failed = [o for o in outcomes if o["status"] != "ok"]
    if failed:
        raise StepFailed(f"{len(failed)} of {len(outcomes)} partition(s) failed; first: {failed[0]['error']}")
