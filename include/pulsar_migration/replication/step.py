"""replicate_topics: every selected source partition's messages reach the target exactly once, entries 1:1,
verified by reading both sides, with a position map for sync_progress.

inventory (partitions, upper bounds, map ends; the target must already hold every topic) ->
prepare the target (deduplication on; geo mode: replication enabled with the backlog included) ->
per partition in Spark tasks: copy or pair, then read back and compare -> append the map -> report.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from typing import Any, Literal, TypeVar

from pulsar_migration import faults, rundir
from pulsar_migration.admin import NotFound, PulsarAdmin, seg
from pulsar_migration.metadata.inventory import read_layout
from pulsar_migration.positions import Position, ledger_sizes
from pulsar_migration.replication import entry_filters, follows, posmap, source_ttl, trim_risk
from pulsar_migration.replication.engine import EngineProcess
from pulsar_migration.replication.partition import (
    ENGINE_DONE,
    ENGINE_LEFT,
    OK,
    PLANNED,
    PartitionJob,
    PartitionOutcome,
    SharedClients,
    average_from_stats,
    compacted_from_stats,
    copy_partition,
    engine_group,
    engine_phase,
)
from pulsar_migration.report import stable_hash
from pulsar_migration.snapshot import FenceSnapshot
from pulsar_migration.spec import MigrationSpec
from pulsar_migration.stepjob import BadInput, StepContext, StepFailed
from pulsar_migration.throttle import Caps, Throttle, throttle

log = logging.getLogger(__name__)

STEP = "replicate_topics"
DEDUP_WAIT_S = 30.0
DEDUP_CHECK_THREADS = 16
# After a namespace's deduplication is turned on, partitions asked first, spread over the list (DEDUP_PROBES of them),
# before every partition is asked: the broker applies the policy to its loaded topics one after another (about 3 s
# for 1200 here), and rounds over all of them meanwhile asked 1,738-2,854 times where probes first asked 1,242.
DEDUP_PROBES = 8
FAILURE_DETAIL_LIMIT = 20


class ReplicationError(StepFailed):
    """Inventory or preparation found something that stops the step (one line)."""


# `in_driver=AUTO`: driver threads when the run dir is local and every partition's delta is known to be at most
# this many entries; otherwise a Spark job. Measured in the demo DAG: the cutover's first catch-up round of
# 3,315 entries took 17.5 s as a Spark job in a fresh spark-submit (10.5 s of it reading the map's ends) and
# later rounds of a few hundred entries 1.1 s in the driver, which copies about as fast as local Spark here.
AUTO = "auto"
BEFORE_EVERYTHING = Position(-1, -1)
DRIVER_DELTA_MAX_ENTRIES = 20_000

# A bound on one partition's copy (backfill windows): (upper inclusive, the source entry after which a partition the
# map does not know yet starts, or a function asked for it only then), or None to leave the partition out of this run.
Bound = Callable[[str], "tuple[Position, Position | Callable[[], Position | None] | None] | None"]


def run(ctx: StepContext, *, keep_identity: bool = False, in_driver: bool | Literal["auto"] = False,
        bound: Bound | None = None, snapshot: FenceSnapshot | None = None,
        engine_process: EngineProcess | None = None, throttled: bool = True) -> None:
    """The step body; `keep_identity` (the cutover's final delta, copy mode) keeps source producer names and
    sequence ids on the copies (see replication.sending). `in_driver` (the cutover's small deltas, a local run
    dir) runs the partitions in driver threads and appends the map with pyarrow: no Spark job, whose fixed
    cost would dominate a delta of a few hundred entries; AUTO does so when the delta is known to be small
    (`small_delta`). `bound` (backfill windows) caps each partition's
    range and says where a partition new to the map starts. `snapshot` (the cutover's final delta) gives each
    partition's bound, the target's last entry and its deduplication state as read right after the fence:
    the source is quiet then, and nothing else writes the target. `engine_process`: the cutover's copy engine,
    started before its catch-up, for the driver path's copies (the caller closes it). `throttled`: the Spark
    path's copies keep to the spec's rate caps (options.copy_max_mb_per_s, copy_max_msgs_per_s); the cutover's
    deltas do not."""
    spec, report = ctx.spec, ctx.report
    report.details["mode"] = spec.replication_mode
    decide = in_driver == AUTO
    use_engine = False
    in_driver = bool(in_driver) and rundir.is_local(ctx.run_dir) and not ctx.dry_run
    report.details["in_driver"] = in_driver
    src_admin, tgt_admin = spec.source_cluster.admin(), spec.target_cluster.admin()
    try:
        started = time.monotonic()
        seeded = follows.seed(spec, ctx.run_dir, report.details, dry_run=ctx.dry_run) \
            if snapshot is None and bound is None else None
        if seeded is not None:  # a dry run continuing an earlier run: the map it would seed
            ends = posmap.ends_of(seeded)
        elif in_driver:
            ends = posmap.ends_local(ctx.run_dir)
        else:
            ends = posmap.collect_ends(ctx.spark, ctx.run_dir)
        jobs = inventory(spec, src_admin, tgt_admin, ends, dry_run=ctx.dry_run, bound=bound,
                         uppers=snapshot.uppers if snapshot is not None else None)
        if keep_identity:
            jobs = [replace(job, keep_identity=True) for job in jobs]
        if snapshot is not None and spec.replication_mode == "copy":  # geo's replicator may still be writing
            jobs = [replace(job, fenced=True, target_last=snapshot.target[job.topic].last, target_last_known=True)
                    if job.topic in snapshot.target else job for job in jobs]
        if decide and in_driver:
            total = pending_total(jobs, src_admin, spec.admin_concurrency)
            in_driver = report.details["in_driver"] = total is not None and total <= DRIVER_DELTA_MAX_ENTRIES
            report.details["pending_entries"] = total
            log.info("delta of %s entries: %s", "unknown" if total is None else total,
                     "driver threads" if in_driver else "a Spark job")
        report.counts["partitions"] = len(jobs)
        report.counts["topics"] = len({job.base_topic for job in jobs})
        report.details["inventory_s"] = round(time.monotonic() - started, 3)
        log.info("%d partition(s) of %d topic(s) to replicate (%s mode)%s", len(jobs), report.counts["topics"],
                 spec.replication_mode, "; map continues from an earlier run" if ends else "")
        if not jobs:
            return
        if snapshot is None and not in_driver:  # not the cutover's deltas: they hold the tenant's clients
            guards = check_source_readers(spec, src_admin, sorted({job.base_topic for job in jobs}),
                                          report.details, dry_run=ctx.dry_run, ttls=spec.replication_mode == "copy")
            if spec.replication_mode == "copy":  # geo reads nothing to copy: Pulsar's replicator does
                jobs = [replace(job, reader_guard=guards.get(job.base_topic, (0, source_ttl.MARKER_TOLERANCE)))
                        for job in jobs]
            check_trim(report.details, tgt_admin, jobs, ends, spec.admin_concurrency)
        faults.at("replicate.after_inventory", 1)  # tests park here (PM_FAULT), e.g. to outlive a token
        if not ctx.dry_run:
            started = time.monotonic()
            running = {t for t, state in snapshot.target.items() if state.deduplicating} if snapshot else set()
            report.details["deduplication_enabled_on"] = enable_deduplication(tgt_admin, spec, jobs, running)
            if spec.replication_mode == "geo":
                from pulsar_migration.replication import geo

                report.details["geo"] = geo.prepare(spec, src_admin, tgt_admin, jobs)
            elif not in_driver or engine_process is not None or keep_identity:
                # The cutover's driver deltas (catch-up rounds, final delta) go through its engine, started before
                # them: only the engine keeps a Java producer's binary-key flag, and it reads identities from the
                # entries, where the Python path asks the admin API for each. Other driver deltas are small: a JVM
                # start would dominate them.
                use_engine = copy_engine_wanted(spec)
            report.details["prepare_s"] = round(time.monotonic() - started, 3)
        started = time.monotonic()
        report.details["copy_engine"] = ("java" if use_engine else "python") if spec.replication_mode == "copy" \
            else None
        caps = spec.copy_caps if throttled and spec.replication_mode == "copy" else Caps()
        if caps and not in_driver:
            report.details["throttle"] = caps.as_report()
            intake, jobs = intake_check(caps, src_admin, jobs, spec.admin_concurrency)
            report.details["throttle"].update(intake)
        outcomes = (replicate_in_driver(ctx, jobs, use_engine, engine_process) if in_driver
                    else replicate(ctx, jobs, use_engine, caps))
        report.details["replicate_s"] = round(time.monotonic() - started, 3)
        if not ctx.dry_run and snapshot is None:  # not inside the cutover's hold: the next delta reads it there
            report.details["position_map_compaction"] = posmap.compact_local(ctx.run_dir)
        summarise(ctx, outcomes, time.monotonic() - started)
    finally:
        src_admin.close()
        tgt_admin.close()


# -- inventory ---------------------------------------------------------------------------------------

def inventory(spec: MigrationSpec, src_admin: PulsarAdmin, tgt_admin: PulsarAdmin,
              ends: dict[str, posmap.MapEnd], *, dry_run: bool = False,
              bound: Bound | None = None, uppers: dict[str, Position | None] | None = None) -> list[PartitionJob]:
    """One job per source partition (non-partitioned topics are one), with the source's last entry now
    (from `uppers` when it was just read). Fails before anything is written when a topic is missing or shaped
    differently on the target; a dry run (e.g. of the whole migration, before sync_metadata really ran)
    plans such topics as empty."""
    source = read_layout(src_admin, spec, must_exist=True)
    target = read_layout(tgt_admin, spec, must_exist=False)
    target_topics = {t.local: t.partitioned for t in target.topics}
    refs = []
    for ref in source.topics:
        if ref.local not in target_topics and dry_run:
            refs.append(ref)
            continue
        if ref.local not in target_topics:
            raise BadInput(f"topic {ref.local} of tenant '{spec.tenant}' does not exist on the target "
                                   f"{spec.target}: run sync_metadata first (it may have been created since)")
        if target_topics[ref.local] != ref.partitioned:
            raise BadInput(f"topic {ref.local} is {'' if ref.partitioned else 'non-'}partitioned on the "
                                   f"source but not on the target {spec.target}: resolve the sync_metadata conflict")
        refs.append(ref)

    def partitions(ref: Any) -> list[tuple[str, str, int]]:
        name = f"persistent://{spec.tenant}/{ref.namespace}/{ref.topic}"
        if not ref.partitioned:
            return [(name, ref.local, -1)]
        path = src_admin.topic_path(name)
        count = int(src_admin.get(f"{path}/partitions")["partitions"])
        if ref.local not in target_topics:
            return [(f"{name}-partition-{i}", ref.local, i) for i in range(count)]
        have = int(tgt_admin.get(tgt_admin.topic_path(name) + "/partitions")["partitions"])
        if have < count:
            raise ReplicationError(f"topic {ref.local} has {count} partitions on the source but {have} on the "
                                   f"target {spec.target}: run sync_metadata first")
        return [(f"{name}-partition-{i}", ref.local, i) for i in range(count)]

    def job(item: tuple[str, str, int]) -> PartitionJob | None:
        topic, local, index = item
        try:
            upper = uppers[topic] if uppers is not None and topic in uppers else src_admin.last_entry(topic)
        except NotFound:
            raise ReplicationError(f"partition {topic} does not exist on the source {spec.source}") from None
        end = ends.get(topic)
        map_end: Any = (end.target, end.source) if end else None
        if bound is not None:
            limit = bound(topic)
            if limit is None:
                return None
            upper = min(upper, limit[0]) if upper else None
            start = None if end is not None else limit[1]() if callable(limit[1]) else limit[1]
            if start is not None:
                map_end = (None, start)  # new to the map: start after this source entry, scan the whole target
        return PartitionJob(topic, local, index, upper, map_end, target_exists=local in target_topics)

    with ThreadPoolExecutor(spec.admin_concurrency) as pool:
        items = [item for group in pool.map(partitions, refs) for item in group]
        return sorted((j for j in pool.map(job, items) if j is not None), key=lambda j: (j.local, j.partition))


def check_source_readers(spec: MigrationSpec, admin: PulsarAdmin, topics: list[str], details: dict[str, Any], *,
                         dry_run: bool, ttls: bool = True) -> dict[str, tuple[int, int]]:
    """What the source's brokers do to the step's readers, checked once per run (copy and geo runs, both backfill
    sinks): entry filters (entry_filters.check: refused unless trusted) and, when `ttls` (the copy's readers; geo's
    replicator is Pulsar's), each topic's message TTL and what may move its readers: returned, each topic's (message
    TTL, gap tolerance) (source_ttl.reader_guards), its partitions read with EntryGaps."""
    entry_filters.check(spec, admin, topics, details, dry_run=dry_run)
    if not ttls:
        return {}
    found = source_ttl.reader_guards(admin, topics, spec.admin_concurrency)
    details["message_ttl_topics"] = sum(1 for ttl, _ in found.values() if ttl)
    details["reader_gap_tolerance"] = {str(tolerance): sum(1 for _, t in found.values() if t == tolerance)
                                       for tolerance in sorted({t for _, t in found.values()})}
    return found


def check_trim(details: dict[str, Any], admin: PulsarAdmin, jobs: list[PartitionJob], ends: dict[str, posmap.MapEnd],
               concurrency: int) -> None:
    """The warning of target topics the broker may trim (replication.trim_risk), and a second one when it already
    did: a partition of such a topic without the lowest ledger its map holds. Not a failure: Pulsar keeps no
    promise for messages nothing subscribes to or retains, and the copy goes on from the map's end (a target
    trimmed this way is still the topic the map describes)."""
    bare = trim_risk.unprotected_topics(admin, sorted({job.base_topic for job in jobs if job.target_exists}),
                                        concurrency)
    risk = trim_risk.trim_risk(admin.name, bare)
    if not risk:
        return
    details["trim_risk"] = risk
    held = set(bare)
    mapped = [(job.topic, ends[job.topic].first_target_ledger) for job in jobs
              if job.base_topic in held and job.topic in ends and ends[job.topic].first_target_ledger >= 0]
    lost = trim_risk.trimmed(admin, mapped, concurrency) if mapped else []
    if lost:
        risk["trimmed"] = [{"topic": t, "first_ledger": first, "map_first_ledger": mapped_first}
                           for t, first, mapped_first in lost[:trim_risk.LISTED]]
        risk["trimmed_count"] = len(lost)
        risk["trimmed_warning"] = trim_risk.trimmed_line(lost)
        log.warning("%s", risk["trimmed_warning"])


def intake_check(caps: Caps, admin: PulsarAdmin, jobs: list[PartitionJob],
                 concurrency: int) -> tuple[dict[str, Any], list[PartitionJob]]:
    """What the selected partitions take in now (their stats' msgThroughputIn and msgRateIn, as the broker last
    computed them: every statsUpdateFrequencyInSecs, 60 s by default), and a warning when a cap is not above it:
    such a copy falls further behind while it runs, and its lag_entries grow. Returns that and the jobs with the
    average message size the same stats give (the engine sizes its readers by it instead of reading them again)."""
    def intake(job: PartitionJob) -> tuple[float, float, PartitionJob]:
        try:
            stats = admin.get(f"{admin.topic_path(job.topic)}/stats")
        except Exception:  # unknown: counted as nothing, the copy itself meets the problem and names it
            log.debug("%s: no stats for the intake check", job.topic, exc_info=True)
            return 0.0, 0.0, job
        return (float(stats.get("msgThroughputIn") or 0), float(stats.get("msgRateIn") or 0),
                replace(job, average_message_bytes=average_from_stats(stats) or 0.0,
                        compacted=compacted_from_stats(stats)))

    with ThreadPoolExecutor(max(1, min(concurrency, len(jobs)))) as pool:
        rates = list(pool.map(intake, jobs))
    bytes_in, msgs_in = sum(r[0] for r in rates), sum(r[1] for r in rates)
    out: dict[str, Any] = {"source_in_mb_per_s": round(bytes_in / 1e6, 3), "source_in_msgs_per_s": round(msgs_in, 1)}
    warning = intake_warning(caps, bytes_in, msgs_in)
    if warning:
        log.warning("%s", warning)
        out["warning"] = warning
    return out, [r[2] for r in rates]


def intake_warning(caps: Caps, bytes_in: float, msgs_in: float) -> str | None:
    """One line when a cap is at or below the source's current intake (None: every cap is above it)."""
    over = []
    if caps.bytes_per_s is not None and bytes_in > 0 and caps.bytes_per_s <= bytes_in:
        over.append(f"{caps.bytes_per_s / 1e6:g} MB/s against {bytes_in / 1e6:.3g} MB/s")
    if caps.msgs_per_s is not None and msgs_in > 0 and caps.msgs_per_s <= msgs_in:
        over.append(f"{caps.msgs_per_s:g} msgs/s against {msgs_in:.4g} msgs/s")
    if not over:
        return None
    return (f"the copy's rate cap is not above what the source takes in now ({'; '.join(over)}): the copy will fall "
            "further behind while it runs")


def pending_entries(job: PartitionJob) -> int | None:
    """Source entries past the map's end, when both are in one ledger (None: not known without more reads)."""
    if job.upper is None:
        return 0
    source_end = job.map_end[1] if job.map_end else None
    if source_end is None or source_end.ledger != job.upper.ledger:
        return None
    return max(0, job.upper.entry - source_end.entry)


def pending_across_ledgers(internal_stats: dict[str, Any], after: Position, upper: Position) -> int:
    """Source entries in (after, upper] from the topic's ledger list (internalStats), for a delta that crosses
    ledgers (a reload or a rollover since the map's end). A ledger already trimmed (consumed, no retention)
    holds nothing left to read, so only listed ledgers count: the work the copy will do."""
    total = 0
    for ledger_id, entries in ledger_sizes(internal_stats):
        if ledger_id < after.ledger or ledger_id > upper.ledger:
            continue
        last = min(entries, upper.entry + 1) if ledger_id == upper.ledger else entries
        first = after.entry + 1 if ledger_id == after.ledger else 0
        total += max(0, last - first)
    return total


def pending_total(jobs: list[PartitionJob], admin: PulsarAdmin | None = None, concurrency: int = 8) -> int | None:
    """The delta's entries, or None when some partition's is not known. With `admin` (the source), partitions
    whose delta crosses ledgers are counted from their ledger lists (one call each)."""
    counts = [pending_entries(job) for job in jobs]
    unknown = [job for job, count in zip(jobs, counts, strict=True) if count is None]
    if unknown and admin is not None:
        def across(job: PartitionJob) -> int | None:
            stats = admin.get(f"{admin.topic_path(job.topic)}/internalStats")
            # A partition new to the map is copied from its first entry.
            after = job.map_end[1] if job.map_end and job.map_end[1] else BEFORE_EVERYTHING
            return pending_across_ledgers(stats, after, job.upper)  # type: ignore[arg-type]

        with ThreadPoolExecutor(max(1, min(concurrency, len(unknown)))) as pool:
            counts = [c for c in counts if c is not None] + list(pool.map(across, unknown))
    return None if None in counts else sum(c for c in counts if c is not None)


def small_delta(jobs: list[PartitionJob], admin: PulsarAdmin | None = None, concurrency: int = 8) -> bool:
    total = pending_total(jobs, admin, concurrency)
    return total is not None and total <= DRIVER_DELTA_MAX_ENTRIES


def enable_deduplication(admin: PulsarAdmin, spec: MigrationSpec, jobs: list[PartitionJob],
                         running: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Turns deduplication on for every namespace with selected topics on the target (what makes copies
    and client re-sends exactly-once) and waits until each target partition runs with it (those in `running`
    were just seen doing so). Returns the namespaces it changed."""
    return enable_deduplication_on(admin, spec, sorted({job.local.split("/", 1)[0] for job in jobs}),
                                   [job.topic for job in jobs], running)


def enable_deduplication_on(admin: PulsarAdmin, spec: MigrationSpec, namespaces: list[str],
                            topics: list[str], running: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Deduplication on for the tenant's `namespaces` on `admin`'s cluster, then waits until every one of
    `topics` runs with it (not asking again about those in `running`, unless a namespace was changed now).
    Returns the namespaces it changed."""
    changed = []
    for ns in namespaces:
        path = f"/namespaces/{seg(spec.tenant)}/{seg(ns)}/deduplication"
        if admin.get(path) is not True:
            admin.post(path, True)
            changed.append(ns)
            log.info("deduplication turned on for namespace %s/%s on %s", spec.tenant, ns, admin.name)
    started = time.monotonic()
    if changed:
        fresh = [t for t in topics if t.split("://", 1)[-1].split("/")[1] in changed]
        wait_deduplicating(admin, fresh[::max(1, len(fresh) // DEDUP_PROBES)], DEDUP_WAIT_S)
    else:
        topics = [t for t in topics if t not in running]
    pending = wait_deduplicating(admin, topics, max(0.0, DEDUP_WAIT_S - (time.monotonic() - started)))
    if pending:
        raise ReplicationError(f"deduplication is not running on {len(pending)} target partition(s) after "
                               f"{DEDUP_WAIT_S:.0f}s (first: {pending[0]}); a topic-level policy may disable it")
    return changed


def wait_deduplicating(admin: PulsarAdmin, topics: list[str], timeout_s: float, poll_s: float = 0.2) -> list[str]:
    """Waits until each topic runs with deduplication (its stats say Enabled: loaded, replay done); returns
    those that still do not after `timeout_s` (empty: all do)."""
    def deduplicating(topic: str) -> bool:
        return admin.get(f"{admin.topic_path(topic)}/stats").get("deduplicationStatus") == "Enabled"

    deadline = time.monotonic() + timeout_s
    pending = list(topics)
    # In parallel: the cutover's final delta checks every partition while the tenant's clients are held.
    with ThreadPoolExecutor(max(1, min(DEDUP_CHECK_THREADS, len(pending)))) as pool:
        while pending:
            pending = [t for t, ok in zip(pending, pool.map(deduplicating, pending), strict=True) if not ok]
            if not pending or time.monotonic() > deadline:
                break
            time.sleep(poll_s)
    return pending


# -- the Spark part ----------------------------------------------------------------------------------

def copy_engine_wanted(spec: MigrationSpec) -> bool:
    """Whether the copy goes through the Java engine (replication.engine); one line when it must and cannot."""
    from pulsar_migration.replication import engine

    try:
        return engine.wanted(spec)
    except engine.EngineError as exc:
        raise BadInput(str(exc)) from None


# Python-path tasks when a tenant has more partitions than Spark slots: at most this many tasks per slot, each running
# its share of partitions on one set of clients, PYTHON_TASK_THREADS at a time. A task per partition opened four
# clients for each: a re-run of a 1000-topic tenant with nothing new took 172 s, 0.14 s a partition.
PYTHON_TASKS_PER_SLOT = 2
PYTHON_TASK_THREADS = 8
Job = TypeVar("Job")


def task_groups(jobs: list[Job], slots: int) -> list[list[Job]]:
    """The partitions of each Python-path Spark task: one each while they are few, else dealt round-robin into
    PYTHON_TASKS_PER_SLOT x `slots` groups (a topic's partitions, listed together, land in different tasks).
    Backfill archive windows group their partitions' reads the same way."""
    tasks = max(1, slots * PYTHON_TASKS_PER_SLOT)
    if len(jobs) <= tasks:
        return [[job] for job in jobs]
    return [jobs[i::tasks] for i in range(tasks)]


def task_caps(caps: Caps, tasks: int, slots: int) -> Caps:
    """Each task's part of the run's rate caps when `tasks` tasks share `slots` Spark slots: at most that many run
    at once, and a task's part must hold while the others run."""
    return caps.share(min(tasks, slots))


def _partition_task(spec: MigrationSpec, dry_run: bool, shared: SharedClients | None = None,
                    caps: Caps | None = None) -> Any:
    """The Python path's task body; `caps`: each task's part of the run's rate caps, shared by its partitions."""
    mode = spec.replication_mode

    def one(job: PartitionJob, clients: SharedClients | None,
            limit: Throttle | None) -> tuple[PartitionOutcome, list[Any]]:
        if mode == "geo" and not dry_run:
            from pulsar_migration.replication import geo

            return geo.verify_partition(spec, job, clients)
        return copy_partition(spec, job, dry_run=dry_run, max_in_flight=spec.copy_max_in_flight,
                              delivery_horizon_s=spec.delayed_delivery_horizon_s, shared=clients, throttle=limit)

    def run_jobs(jobs: Iterator[PartitionJob]) -> Iterator[tuple[PartitionOutcome, list[Any]]]:
        batch = list(jobs)
        limit = throttle(caps)
        if shared is not None or len(batch) <= 1:
            for job in batch:
                yield one(job, shared, limit)
            return
        try:
            clients = SharedClients.open(spec)
        except Exception:  # e.g. a cluster unreachable: each partition opens its own and says so in one line
            log.warning("shared clients for %d partitions failed", len(batch), exc_info=True)
            for job in batch:
                yield one(job, None, limit)
            return
        try:
            with ThreadPoolExecutor(min(PYTHON_TASK_THREADS, len(batch))) as pool:
                yield from pool.map(lambda job: one(job, clients, limit), batch)
        finally:
            clients.close()

    return run_jobs


def replicate(ctx: StepContext, jobs: list[PartitionJob], use_engine: bool = False,
              caps: Caps | None = None) -> list[PartitionOutcome]:
    """Runs every job in Spark tasks (one partition per task, or groups of partitions through the Java engine),
    appends the verified partitions' map rows. `caps`: the run's rate caps, split evenly over the engine
    processes, then over the Python path's tasks that run at once."""
    caps = caps or Caps()
    from pyspark import StorageLevel

    spark = ctx.spark
    persisted = []
    finished = None
    if use_engine:
        started = time.monotonic()
        finished, jobs = copy_through_engine(ctx, jobs, caps)
        if finished is not None:
            persisted.append(finished)
        ctx.report.details["engine_phase_s"] = round(time.monotonic() - started, 3)
    results = None
    if jobs:
        slots = spark.sparkContext.defaultParallelism
        groups = task_groups(jobs, slots)
        part = task_caps(caps, len(groups), slots)
        if part and not ctx.dry_run:
            ctx.report.details.setdefault("throttle", {})["python_task"] = part.as_report()
        task = _partition_task(ctx.spec, ctx.dry_run, caps=part)
        results = (spark.sparkContext.parallelize(groups, len(groups))
                   .mapPartitions(lambda tasks: task(job for group in tasks for job in group))
                   .persist(StorageLevel.MEMORY_AND_DISK))
        persisted.append(results)
    if finished is not None:
        finished = finished.filter(lambda item: item[0] == ENGINE_DONE).map(lambda item: item[1])
        results = finished if results is None else results.union(finished)
    try:
        outcomes = results.map(lambda result: result[0]).collect() if results is not None else []
        outcomes.sort(key=lambda o: (o.local, o.partition))  # the inventory's order, however tasks were grouped
        mapped = sum(o.mapped_entries for o in outcomes if o.status == OK)
        if not ctx.dry_run and results is not None:  # even with nothing mapped: the map exists once verified
            rows = results.flatMap(lambda result: [row.as_tuple() for row in result[1]])
            posmap.append(spark, ctx.run_dir, spark.createDataFrame(rows, posmap.MAP_SCHEMA))
            ctx.report.counts["map_rows_appended"] = mapped
        ctx.report.details["position_map"] = posmap.location(ctx.run_dir)
    finally:
        for rdd in persisted:
            rdd.unpersist()
    return outcomes


# Partitions per engine process: one JVM start (about 1.5 s of CPU) serves this many partitions, copied at once
# on one pair of clients; more partitions get more processes, spread over Spark's slots, but never more processes
# than slots: each start costs seconds of JVM, clients and JIT (a 1000-topic tenant in 38 processes on 2 slots
# spent 3-6 s of each on start-up).
ENGINE_PARTITIONS_PER_PROCESS = 32


def engine_processes(partitions: int, slots: int) -> int:
    return max(1, min(-(-partitions // ENGINE_PARTITIONS_PER_PROCESS), slots))


def copy_through_engine(ctx: StepContext, jobs: list[PartitionJob],
                        caps: Caps | None = None) -> tuple[Any, list[PartitionJob]]:
    """Every partition the engine takes, copied, read back and judged in Java engine processes
    (partition.engine_group), as a Spark job of one task per group of partitions. Returns the persisted RDD of
    the groups' yields (its ENGINE_DONE items are (outcome, rows)) and the jobs left to the Python path's
    per-partition tasks (None and all jobs when no partition has anything to copy)."""
    from pyspark import StorageLevel

    spec = ctx.spec
    eligible = [job for job in jobs if job.upper is not None]
    if not eligible:
        return None, jobs
    groups = engine_processes(len(eligible), ctx.spark.sparkContext.defaultParallelism)
    max_in_flight, run_dir = spec.copy_max_in_flight, ctx.run_dir
    part = (caps or Caps()).share(groups)  # engine processes never outnumber the slots: all run at once
    if part:
        ctx.report.details.setdefault("throttle", {})["engine_process"] = part.as_report()

    def run_group(group: Iterator[PartitionJob]) -> Iterator[tuple[str, Any]]:
        yield from engine_group(spec, list(group), max_in_flight, run_dir, caps=part)

    staged = (ctx.spark.sparkContext.parallelize(eligible, groups).mapPartitions(run_group)
              .persist(StorageLevel.MEMORY_AND_DISK))
    left = staged.filter(lambda item: item[0] == ENGINE_LEFT).map(lambda item: item[1]).collect()
    return staged, [job for job in jobs if job.upper is None] + left


DRIVER_THREADS_MIN = 64  # partitions at once in the driver path: each mostly waits on round trips


def driver_threads(spec: MigrationSpec, jobs: int) -> int:
    return max(1, min(jobs, max(spec.admin_concurrency, DRIVER_THREADS_MIN)))


def replicate_in_driver(ctx: StepContext, jobs: list[PartitionJob], use_engine: bool = False,
                        engine_process: EngineProcess | None = None) -> list[PartitionOutcome]:
    """The same partition tasks in driver threads (bounded by the spec's admin concurrency); the verified
    partitions' rows are appended to the map in one local Parquet file. `use_engine`: the copy phase goes
    through one engine process first (`engine_process` when given), the Python client reads the target back."""
    shared = SharedClients.open(ctx.spec)
    try:
        if use_engine:
            started = time.monotonic()
            jobs = engine_phase(ctx.spec, jobs, ctx.spec.copy_max_in_flight, shared, process=engine_process,
                                prepare_threads=driver_threads(ctx.spec, len(jobs)))
            ctx.report.details["engine_phase_s"] = round(time.monotonic() - started, 3)
        task = _partition_task(ctx.spec, ctx.dry_run, shared)
        with ThreadPoolExecutor(driver_threads(ctx.spec, len(jobs))) as pool:
            results = [result for chunk in pool.map(lambda job: list(task(iter([job]))), jobs) for result in chunk]
    finally:
        shared.close()
    rows = [row for outcome, job_rows in results if outcome.status == OK for row in job_rows]
    ctx.report.counts["map_rows_appended"] = posmap.append_local(ctx.run_dir, rows)
    ctx.report.details["position_map"] = posmap.location(ctx.run_dir)
    return [outcome for outcome, _ in results]


# -- report ------------------------------------------------------------------------------------------

_TOTALS = ("source_messages", "source_entries", "source_bytes", "copied_messages", "copied_entries", "copied_bytes",
           "skipped_messages", "deduplicated", "delayed_messages", "delivery_time_lookups", "target_messages",
           "target_entries", "mapped_entries", "shape_errors", "earlier_chunk_messages",
           "unassembled_chunked_messages", "compacted_messages", "reader_rereads")


def summarise(ctx: StepContext, outcomes: list[PartitionOutcome], elapsed_s: float) -> None:
    report = ctx.report
    for name in _TOTALS:
        report.counts[name] = sum(getattr(o, name) for o in outcomes)
    failed = [o for o in outcomes if o.status not in (OK, PLANNED)]
    report.counts["partitions_failed"] = len(failed)
    report.counts["partitions_ok"] = len(outcomes) - len(failed)
    report.counts["partitions_unchanged"] = sum(o.unchanged for o in outcomes)
    lag = [o.lag_entries for o in outcomes if o.lag_entries is not None]
    report.counts["lag_entries"] = sum(lag)
    report.details["partitions"] = [asdict(o) for o in outcomes]
    # details.copy_engine is the path chosen; this is what ran, by partitions that copied something.
    report.details["copy_engines_ran"] = dict(sorted(Counter(
        o.copy_engine for o in outcomes if o.copied_messages and o.copy_engine).items()))
    throttle = report.details.get("throttle")
    if throttle is not None:  # the partitions' copies held back by the cap, summed
        throttle["held_back_s"] = round(sum(o.throttled_s for o in outcomes), 3)
        if ctx.dry_run:  # what the caps mean for this run's length: its bytes and messages take no less than this
            throttle["least_copy_s"] = round(max(
                report.counts["copied_bytes"] / (throttle["max_mb_per_s"] * 1e6) if "max_mb_per_s" in throttle else 0,
                report.counts["copied_messages"] / throttle["max_msgs_per_s"] if "max_msgs_per_s" in throttle else 0),
                1)
    report.details["msgs_per_s"] = round(report.counts["copied_messages"] / elapsed_s, 1) if elapsed_s else None
    report.details["mb_per_s"] = round(report.counts["copied_bytes"] / elapsed_s / 1e6, 3) if elapsed_s else None
    if not ctx.dry_run:
        report.hashes["source"] = stable_hash(f"{o.topic}|{o.source_hash}" for o in outcomes)
        report.hashes["target"] = stable_hash(f"{o.topic}|{o.target_hash}" for o in outcomes)
    for o in outcomes:
        log.info("%s %s: %s msgs (%s copied, %s already there), %s entries, hash %s%s", o.status, o.topic,
                 o.source_messages, o.copied_messages, o.skipped_messages, o.source_entries, o.source_hash[:12],
                 f": {o.error}" if o.error else "")
    if failed:
        report.details["failures"] = [{"topic": o.topic, "error": o.error} for o in failed[:FAILURE_DETAIL_LIMIT]]
        names = ", ".join(o.topic.split("://", 1)[-1] for o in failed[:5])
        raise StepFailed(f"{len(failed)} of {len(outcomes)} partition(s) failed ({names}"
                         f"{', ...' if len(failed) > 5 else ''}); first: {failed[0].error}")
