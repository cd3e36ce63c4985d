"""switch_lookup: moves a tenant's live clients from the source to the target through the lookup service,
fenced so that no message is lost or stored twice.

Order (each phase timed in the report):

1. **preconditions**: the spec names the lookup service; sync_metadata, replicate_topics and sync_progress
   reported ok in this run dir; the service knows both clusters and routes the tenant to the source (to the
   target already: the switch is done, only the probe runs).
2. **catch up**: replicate_topics once more while clients still run (in Spark unless the delta is known to be
   small: replication.step.AUTO), then up to two more rounds
   in the driver (seconds each), and a sync_progress in the driver, so the final delta is small; then
   **deduplication on at the source** (a producer re-sends what was unacknowledged when the fence cut
   it off; with dedup the source drops those it had stored, which matters if the switch rolls back).
   **hold** the tenant at the lookup service: from now on its clients' lookups are parked, not refused
   (C++ clients back off for up to 60 s after an HTTP error; a late answer costs them nothing).
3. **fence**: unload the tenant's namespaces on the source. Every client is disconnected; its reconnect
   starts with a lookup, which is parked, so nothing can publish or acknowledge on the source any more.
   The step waits until the source shows no producer and no consumer on any selected partition. A client
   found there connected after the unload: one whose lookup was answered just before the hold gets its
   partition unloaded again (up to 3 times, 1 s apart) and its next lookup is parked; one that bypasses the
   lookup service comes straight back and stops the switch after 15 s. Then it reads every partition once
   on both clusters (snapshot.FenceSnapshot: stats, last entry, internalStats; the target's while the
   source unloads). The final delta, the final sync and the quiet check work from that one read instead of
   reading the same things again: while clients wait, every admin call is broker CPU taken from the hold.
4. **final delta**: replicate_topics and sync_progress again, in the driver (no Spark job: its fixed cost
   was the whole 20-40 s hold of the first cut; progress.window translates the map's tail in plain Python
   and hands over to the Spark path when the window is not for it), on the now quiet source. In
   copy mode the final delta keeps the source producers' names and sequence ids, so the target's dedup
   knows them: a producer re-sends its unacknowledged messages after reconnecting (same name, same
   sequence ids), and those the source had already stored (the receipt lost in the disconnect) are
   dropped by the target as duplicates; those it had not stored are stored once. Geo mode's replicator keeps
   names and sequence ids, but the target's dedup records replicated messages by source position only, so
   geo mode reloads the target partitions that had producers at the fence and proves their dedup then knows
   each producer's last sequence id (switch.geo_dedup).
5. **quiet check and id guard**: the source's last entries did not move since the final delta, and no
   source ledger id of a partition is also a ledger id of the same partition on the target. A C++
   consumer keeps its prefetched messages across the switch and may acknowledge them with source ids;
   on the target such an id names an unrelated entry only when the ledger ids collide, so the switch
   refuses (and rolls back) then. Messages whose acks were lost in the disconnect are delivered again,
   as after any unload.
6. **flip** the route to the target; the same call releases the hold, so parked lookups are answered with
   the target's brokers at once.
7. **probe** through the lookup service: a producer and a reader of a selected partition land on the target.

A failure before the flip releases the hold with the route unchanged (rollback): clients reconnect to
the source, which reloads its topics; the target is not live yet, so what the final delta wrote there is
harmless. After the flip, switching back is the step rollback_lookup (switch.rollback: this cutover in reverse).
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Literal

from pulsar_migration import faults
from pulsar_migration.admin import PulsarAdmin, seg
from pulsar_migration.lookup.client import LookupAdmin, LookupServiceError
from pulsar_migration.metadata.inventory import read_layout
from pulsar_migration.positions import Position
from pulsar_migration.replication.engine import EngineProcess
from pulsar_migration.replication.engine import wanted as engine_wanted
from pulsar_migration.report import StepReport
from pulsar_migration.snapshot import FenceSnapshot, read_side
from pulsar_migration.spec import MigrationSpec
from pulsar_migration.stepjob import StepContext, StepFailed
from pulsar_migration.switch.fanout import FENCE_THREADS, each_partition
from pulsar_migration.switch.geo_dedup import (
    kept_with_earlier,
    producers_by_partition,
    record_marks,
    source_marks,
    teach_target,
)
from pulsar_migration.switch.probe import probe

log = logging.getLogger(__name__)

STEP = "switch_lookup"
REQUIRED_REPORTS = ("sync_metadata", "replicate_topics", "sync_progress")
# A client that bypasses the lookup service keeps the hold this long before the switch gives up: well inside the
# clients' default 30 s send timeout (at 30 s, one loaded run saw 1,778 sends time out before the rollback).
CLIENTS_GONE_TIMEOUT_S = 15.0
# A client found on a partition after the fence is fenced again (at most this often, this many times).
REFENCE_GAP_S = 1.0
MAX_REFENCES = 3
# Catch-up copies run while clients still publish; each one is shorter than the last. Stop when one copied
# this few entries: the final delta (an admin call per entry for producer identities) is then about as small.
CATCH_UP_ROUNDS = 3
CATCH_UP_ENOUGH_ENTRIES = 500


class SwitchError(StepFailed):
    """A precondition or a phase of the switch failed (one line)."""


class Phases:
    """Times each phase into report.details["phases_s"]; remembers the one that failed."""

    def __init__(self, report: StepReport) -> None:
        self.report = report
        self.times: dict[str, float] = report.details.setdefault("phases_s", {})
        self.current: str | None = None

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        self.current = name
        started = time.monotonic()
        try:
            yield
        finally:
            self.times[name] = round(time.monotonic() - started, 3)
        log.info("switch phase %s done in %.2fs", name, self.times[name])
        faults.at(f"switch.after_{name}", 1)  # kill tests park here (PM_FAULT)


class Stopwatch:
    """Lap times within a phase, for the report."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._last = time.monotonic()

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.laps[name] = round(now - self._last, 3)
        self._last = now


def run(ctx: StepContext) -> None:
    spec, report = ctx.spec, ctx.report
    if not spec.lookup_url:
        raise SwitchError("the spec names no lookup service (lookup.url): there is no route to switch")
    lookup = spec.lookup_admin()
    src_admin, tgt_admin = spec.source_cluster.admin(), spec.target_cluster.admin()
    try:
        phases = Phases(report)
        with phases("preconditions"):
            route = preconditions(ctx, lookup)
            current = str(route["cluster"])
            release_a_left_hold(ctx, lookup, route)
        partitions = selected_partitions(ctx, src_admin)
        report.counts["partitions"] = len(partitions)
        if current == spec.target:
            report.details["already_switched"] = True
            with phases("probe"):
                report.details["probe"] = probe(ctx, partitions)
            return
        if ctx.dry_run:
            report.details["plan"] = ["hold", "fence (unload " + ", ".join(namespaces(ctx, src_admin)) + ")",
                                      "final replicate_topics", "final sync_progress", "quiet check and id guard",
                                      f"flip {spec.tenant} to {spec.target}", "probe"]
            return
        cutover(ctx, lookup, src_admin, tgt_admin, partitions, phases)
        with phases("probe"):
            report.details["probe"] = probe(ctx, partitions)
    except LookupServiceError as exc:
        raise SwitchError(str(exc)) from None
    finally:
        lookup.close()
        src_admin.close()
        tgt_admin.close()


def preconditions(ctx: StepContext, lookup: LookupAdmin) -> dict[str, Any]:
    """The route the tenant has now (the service's answer: cluster, held); SwitchError when the run dir or the
    service is not ready."""
    spec = ctx.spec
    for step in REQUIRED_REPORTS:
        try:
            earlier = StepReport.read(ctx.run_dir, step)
        except (FileNotFoundError, OSError):
            raise SwitchError(f"no {step} report in {ctx.run_dir}: run the steps before the switch") from None
        # A dry run of the whole migration plans the switch after steps that only planned too.
        planned_ok = ctx.dry_run and earlier.verdict == "planned"
        if not planned_ok and (earlier.verdict != "ok" or earlier.dry_run):
            raise SwitchError(f"{step} in {ctx.run_dir} is {earlier.verdict}{' (dry run)' if earlier.dry_run else ''}"
                              ": the switch needs it verified")
    health = lookup.health()
    missing = [c for c in (spec.source, spec.target) if c not in health.get("clusters", [])]
    if missing:
        raise SwitchError(f"the lookup service at {spec.lookup_url} does not know cluster(s) {', '.join(missing)}")
    route = lookup.route(spec.tenant)
    if route["cluster"] not in (spec.source, spec.target):
        raise SwitchError(f"the lookup service routes tenant {spec.tenant} to {route['cluster']}, neither the "
                          f"source {spec.source} nor the target {spec.target}")
    ctx.report.details["route_before"] = route["cluster"]
    return route


def release_a_left_hold(ctx: StepContext, lookup: LookupAdmin, route: dict[str, Any]) -> None:
    """A hold the tenant has when a switch (or rollback) starts was left by an attempt killed between its hold and
    its flip, or by a flip whose release failed: the tenant's clients have waited since, answered 503 every
    hold_timeout_s. Released first: before the flip they go back to where the route still points (what a failure
    before the flip does), after it to the cluster it was flipped to. Not in a dry run."""
    if not route.get("held"):
        return
    ctx.report.details["left_hold"] = "kept (dry run)" if ctx.dry_run else "released"
    if not ctx.dry_run:
        lookup.release(ctx.spec.tenant, reason=f"a hold an earlier attempt left: released to {route['cluster']}")
        log.warning("tenant %s was held by an earlier attempt: released (its clients go to %s)", ctx.spec.tenant,
                    route["cluster"])


def flip_route(ctx: StepContext, lookup: LookupAdmin) -> None:
    """The route set to the target, releasing the hold. The service may have set it although its answer failed (the
    hold's release failed after it, or the answer was lost): then the switch is flipped, and a hold still left is
    released here (or by the next run, release_a_left_hold)."""
    spec = ctx.spec
    try:
        lookup.set_route(spec.tenant, spec.target, reason=f"switch from {spec.source}", release=True)
        return
    except LookupServiceError as failed:
        try:
            route = lookup.route(spec.tenant)
        except LookupServiceError:
            raise failed from None
        if route["cluster"] != spec.target:
            raise
        ctx.report.details["flip_answer_failed"] = str(failed)
        log.warning("the flip's answer failed (%s), but the route names %s: flipped", failed, spec.target)
    if route.get("held"):
        try:
            lookup.release(spec.tenant, reason=f"switch from {spec.source}: the flip's release")
        except LookupServiceError:
            ctx.report.details["hold_left_after_flip"] = True
            log.error("tenant %s is flipped to %s but still held: a re-run releases it", spec.tenant, spec.target)


def namespaces(ctx: StepContext, admin: PulsarAdmin) -> list[str]:
    return sorted({ref.namespace for ref in read_layout(admin, ctx.spec, must_exist=True).topics})


def selected_partitions(ctx: StepContext, admin: PulsarAdmin) -> list[str]:
    return partitions_of(ctx.spec, admin, read_layout(admin, ctx.spec, must_exist=True))


def partitions_of(spec: MigrationSpec, admin: PulsarAdmin, layout: Any) -> list[str]:
    """Every partition (or non-partitioned topic) of `layout`'s topics, as the source has them now."""
    topics = []
    for ref in layout.topics:
        name = f"persistent://{spec.tenant}/{ref.namespace}/{ref.topic}"
        if ref.partitioned:
            count = int(admin.get(f"{admin.topic_path(name)}/partitions")["partitions"])
            topics += [f"{name}-partition-{i}" for i in range(count)]
        else:
            topics.append(name)
    return sorted(topics)


# -- the fenced cutover ----------------------------------------------------------------------------

def cutover(ctx: StepContext, lookup: LookupAdmin, src_admin: PulsarAdmin, tgt_admin: PulsarAdmin,
            partitions: list[str], phases: Phases) -> None:
    from pulsar_migration.replication.step import AUTO

    spec, report = ctx.spec, ctx.report
    geo = spec.replication_mode == "geo"
    flipped = False
    held_at = None
    # The driver deltas' engine starts now: its JVM, clients and class loading overlap the catch-up, not the fence.
    engine_process = None if geo else delta_engine(spec)
    try:
        with phases("catch_up"):  # shrinks the final delta and the final sync, which run while clients wait
            rounds = []
            for n in range(CATCH_UP_ROUNDS):
                # The first round may have a large backlog: a Spark job unless it is known to be small.
                rounds.append(sub_step(ctx, "replicate_topics", keep_identity=False, in_driver=True if n else AUTO,
                                       name=f"catch_up.{n}", engine_process=engine_process))
                if n > 0 and rounds[-1]["counts"].get("copied_entries", 0) <= CATCH_UP_ENOUGH_ENTRIES:
                    break
            # Subscriptions that moved since sync_progress are set now, so the final sync has little to do.
            rounds.append(sub_step(ctx, "sync_progress", in_driver=True, name="catch_up"))
            report.details["catch_up"] = rounds
        with phases("source_dedup"):
            # Geo mode: which producers could have a send in flight at the fence (geo_dedup), taken before the hold.
            marks = source_marks(ctx.run_dir, src_admin, partitions) if geo else None
            report.details["source_deduplication_enabled_on"] = source_deduplication(ctx, src_admin, partitions)
        fenced_namespaces = namespaces(ctx, src_admin)  # read before the hold: clients do not wait for it
        with phases("hold"):
            lookup.hold(spec.tenant, reason=f"switch to {spec.target}: hold")
            held_at = time.monotonic()
        with phases("fence"):
            # Geo mode: who might re-send after the flip (geo_dedup); copy mode's final delta keeps their identities.
            fenced_producers = kept_with_earlier(ctx.run_dir, producers_by_partition(src_admin, partitions),
                                                 partitions) if geo else {}
            if marks is not None:
                record_marks(ctx.run_dir, marks)
            with ThreadPoolExecutor(1) as side:
                # The target's broker is idle while the source unloads. Nothing but the cutover (and in geo mode the
                # replicator, whose entries only the copy mode's reads of the target's end would care about) writes
                # the target now, and no consumer moves its cursors.
                target_read = side.submit(read_side, tgt_admin, partitions)
                steps = Stopwatch()
                for ns in fenced_namespaces:
                    src_admin.put(f"/namespaces/{seg(spec.tenant)}/{seg(ns)}/unload", expect_json=False)
                steps.lap("unload")
                faults.at("switch.fence_unloaded", 1)  # a test lets a late client in here (PM_FAULT)
                last_stats, refenced = wait_clients_gone(src_admin, partitions, fenced_producers if geo else None)
                steps.lap("clients_gone")
                report.details["fenced_again"] = refenced
                if geo and refenced:  # producers met after the unload are kept too (they may re-send as well)
                    fenced_producers = kept_with_earlier(ctx.run_dir, fenced_producers, partitions)
                source = read_side(src_admin, partitions, last_stats)
                steps.lap("source_read")
                snapshot = FenceSnapshot(source, target_read.result())
                steps.lap("target_read")
                report.details["fence_s"] = steps.laps
        with phases("final_replicate"):
            report.details["final_replicate"] = sub_step(ctx, "replicate_topics", in_driver=True, snapshot=snapshot,
                                                         engine_process=engine_process)
        if geo:
            with phases("target_dedup"):
                report.details["target_dedup"] = teach_target(spec, tgt_admin, fenced_producers, marks, src_admin)
        with phases("final_progress"):
            report.details["final_progress"] = sub_step(ctx, "sync_progress", in_driver=True, snapshot=snapshot)
        with phases("quiet_check"):
            report.details["ledger_collisions"] = quiet_check(src_admin, tgt_admin, partitions, snapshot)
        with phases("flip"):
            flip_route(ctx, lookup)
            flipped = True
        report.details["hold_s"] = round(time.monotonic() - held_at, 3)
        report.details["route_after"] = spec.target
    except BaseException as exc:
        if not flipped and held_at is not None:
            try:
                lookup.release(spec.tenant, reason=f"switch failed in {phases.current}: rolled back")
                report.details["rolled_back"] = True
                report.details["hold_s"] = round(time.monotonic() - held_at, 3)
            except LookupServiceError:
                log.error("rollback: could not release tenant %s at the lookup service", spec.tenant)
            log.warning("switch failed in phase %s before the flip: hold released, clients stay on %s",
                        phases.current, spec.source)
        if isinstance(exc, StepFailed):
            raise SwitchError(f"switch failed in {phases.current} (rolled back: route unchanged): {exc}") from None
        raise
    finally:
        if engine_process is not None:
            engine_process.abandon()  # closed after its rounds, killed if it had none


def delta_engine(spec: MigrationSpec) -> EngineProcess | None:
    """The copy engine of the cutover's driver deltas (its catch-up rounds in the driver and its final delta), one
    process for all of them, started before the catch-up: its JVM and clients are ready long before the hold (3-4 s
    of start-up on a busy machine: started just before the hold it slowed the fence from 1.5-2.0 to 2.6-2.8 s), and
    the catch-up rounds warm it for the final delta. 16 partitions at once, as in a copy: 64 took 100 small
    partitions in 2.9 s against 2.0-2.3 s. None: the Python path copies (no engine here, `copy_engine: python`, or
    it cannot start: the delta says why)."""
    try:
        return EngineProcess(spec, spec.copy_max_in_flight) if engine_wanted(spec) else None
    except Exception:
        log.warning("copy engine for the final delta not started", exc_info=True)
        return None


def source_deduplication(ctx: StepContext, admin: PulsarAdmin, partitions: list[str]) -> list[str]:
    """Deduplication on for the source namespaces while clients still publish: from then on the source
    knows each producer's last sequence id, so the re-sends that follow the fence's unload are dropped there
    too (a rollback leaves nothing stored twice on the source). Returns the namespaces it changed."""
    from types import SimpleNamespace

    from pulsar_migration.replication.step import enable_deduplication

    prefix = f"persistent://{ctx.spec.tenant}/"
    jobs = [SimpleNamespace(topic=t, local=t.removeprefix(prefix)) for t in partitions]
    return enable_deduplication(admin, ctx.spec, jobs)  # type: ignore[arg-type]


def sub_step(ctx: StepContext, step: str, *, keep_identity: bool = True, in_driver: bool | Literal["auto"] = False,
             name: str = "", snapshot: FenceSnapshot | None = None,
             engine_process: EngineProcess | None = None) -> dict[str, Any]:
    """Runs replicate_topics or sync_progress in this process under the switch; its report goes to
    RUN_DIR/switch_lookup.<step>[.<name>].json. `in_driver` takes their driver-only paths (no Spark job; the
    final delta is small and clients wait for it); `snapshot` is what the fence read; `engine_process` the final
    driver deltas' copy engine (delta_engine). Returns its verdict,
    counts and time; StepFailed when it failed."""
    from pulsar_migration.progress.step import run as progress_run
    from pulsar_migration.replication.step import run as replication_run

    report = StepReport.start(f"{STEP}.{step}{'.' + name if name else ''}", ctx.spec)
    sub = StepContext(step=step, spec=ctx.spec, run_dir=ctx.run_dir, dry_run=False,
                      args=argparse.Namespace(markdelete_only=False), report=report, _lazy_spark=ctx._lazy_spark)
    try:
        if step == "replicate_topics":
            # Not capped by copy_max_mb_per_s: the cutover's deltas are small, and the final one holds clients.
            replication_run(sub, keep_identity=keep_identity, in_driver=in_driver, snapshot=snapshot,
                            engine_process=engine_process, throttled=False)
        else:
            progress_run(sub, in_driver=bool(in_driver), snapshot=snapshot)
        report.finish("ok")
    except StepFailed as exc:
        report.finish("failed", str(exc))
        raise SwitchError(f"{name or 'final'} {step}: {exc}") from None
    finally:
        report.write(ctx.run_dir)
    return {"verdict": report.verdict, "counts": report.counts, "duration_s": report.duration_s,
            "path": report.details.get("path") or ("driver" if report.details.get("in_driver") else "spark"),
            "copy_engine": report.details.get("copy_engine")}


def wait_clients_gone(admin: PulsarAdmin, partitions: list[str], seen_producers: dict[str, list[str]] | None = None,
                      ) -> tuple[dict[str, dict[str, Any]], dict[str, int]]:
    """Polls the partitions' stats until none shows a client; returns each partition's last stats and the
    partitions fenced again. Anything on a partition after the unload connected after the fence: a client
    whose lookup was answered just before the hold (its connection still on the way) is fenced once more,
    and its next lookup is parked; a client that bypasses the lookup service comes straight back every time
    and stops the switch at the timeout. Producers seen are added to `seen_producers` (geo mode's dedup
    check needs every producer that may re-send)."""
    deadline = time.monotonic() + CLIENTS_GONE_TIMEOUT_S
    stats: dict[str, dict[str, Any]] = {}
    refenced: dict[str, int] = {}
    last_fence: dict[str, float] = {}
    pending = list(partitions)
    while True:
        stats.update(zip(pending, each_partition(admin, pending, topic_stats), strict=True))
        pending = [t for t in pending if clients_in(t, stats[t])]
        if not pending:
            return stats, refenced
        now = time.monotonic()
        if now > deadline:
            clients = [c for t in pending for c in clients_in(t, stats[t])]
            raise SwitchError(f"{len(clients)} client(s) still connected to the source {CLIENTS_GONE_TIMEOUT_S:.0f}s "
                              f"after the unload (first: {clients[0]}): they bypass the lookup service")
        again = [t for t in pending
                 if refenced.get(t, 0) < MAX_REFENCES and now - last_fence.get(t, 0.0) >= REFENCE_GAP_S]
        for topic in again:
            log.warning("fence: %s connected after the unload: unloading %s again",
                        "; ".join(clients_in(topic, stats[topic])), topic)
            if seen_producers is not None:
                named = {p["producerName"] for p in stats[topic].get("publishers") or [] if p.get("producerName")}
                if named:
                    seen_producers[topic] = sorted(named | set(seen_producers.get(topic, [])))
            refenced[topic] = refenced.get(topic, 0) + 1
            last_fence[topic] = now
        each_partition(admin, again, lambda a, t: a.put(f"{a.topic_path(t)}/unload"))
        time.sleep(0.2)


def topic_stats(admin: PulsarAdmin, topic: str) -> dict[str, Any]:
    return dict(admin.get(f"{admin.topic_path(topic)}/stats"))


def clients_in(topic: str, stats: dict[str, Any]) -> list[str]:
    """The producers and consumers one partition's stats show."""
    found = [f"producer {p.get('producerName')} from {p.get('address')} on {topic}"
             for p in stats.get("publishers") or []]
    for sub, s in (stats.get("subscriptions") or {}).items():
        found += [f"consumer {c.get('consumerName')} of {sub} from {c.get('address')} on {topic}"
                  for c in s.get("consumers") or []]
    return found


def connected_clients(admin: PulsarAdmin, partitions: list[str]) -> list[str]:
    return [c for topic, stats in zip(partitions, each_partition(admin, partitions, topic_stats), strict=True)
            for c in clients_in(topic, stats)]


def quiet_check(src: PulsarAdmin, tgt: PulsarAdmin, partitions: list[str],
                snapshot: FenceSnapshot) -> list[dict[str, Any]]:
    """After the final sync: no source partition moved since the fence's snapshot and none has a client (a
    client bypassing the lookup service), and no source ledger id of a partition is a ledger id of the same
    partition on the target (read now: the final delta may have rolled a ledger). One pass, both clusters at
    once. Returns the collisions (SwitchError when there are any)."""
    def look(topic: str) -> tuple[Position | None, list[str], set[int]]:
        internal = tgt.get(f"{tgt.topic_path(topic)}/internalStats")
        return (src.last_entry(topic), clients_in(topic, topic_stats(src, topic)),
                {int(ledger["ledgerId"]) for ledger in internal.get("ledgers") or []})

    with ThreadPoolExecutor(max(1, min(len(partitions), FENCE_THREADS))) as pool:
        looks = dict(zip(partitions, pool.map(look, partitions), strict=True))
    moved = [t for t in partitions if looks[t][0] != snapshot.source[t].last]
    if moved:
        raise SwitchError(f"{len(moved)} source partition(s) got messages during the fence (first: "
                          f"{moved[0]}): a client bypasses the lookup service")
    clients = [c for t in partitions for c in looks[t][1]]
    if clients:
        raise SwitchError(f"clients reattached to the source during the fence: {clients[0]}")
    collisions = ledger_collisions({t: snapshot.source[t].ledgers for t in partitions},
                                   {t: looks[t][2] for t in partitions})
    if collisions:
        raise SwitchError(f"ledger id {collisions[0]['ledgers'][0]} of {collisions[0]['topic']} exists on both "
                          "clusters: a consumer acking a prefetched source message on the target could ack "
                          "an unrelated entry")
    return collisions


def ledger_collisions(source: dict[str, set[int]], target: dict[str, set[int]]) -> list[dict[str, Any]]:
    return [{"topic": topic, "ledgers": sorted(ids & target[topic])} for topic, ids in source.items()
            if ids & target[topic]]
