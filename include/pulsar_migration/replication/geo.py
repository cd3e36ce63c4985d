"""replicate_topics in geo mode: Pulsar's own replicator moves the messages, this module turns it on with the
existing backlog included, waits for it, and proves the result by reading both sides.

Turning it on (driver, `prepare`): per source partition, the replicator cursor `pulsar.repl.<target>` is
created at the earliest position unless it exists (never moved backwards), then the target is *added* to the
namespace's replication clusters (never removing one: that deletes topics by cascade), then the partitions
whose replicator is new are unloaded. On 4.0.8 the policy change alone already starts the replicator from
the pre-created cursor; until the unload that cursor is also listed as an ordinary subscription, which
tools reading subscriptions would take for a user's. The target needs nothing: each cluster keeps its own
configuration store, its namespace keeps replicating to itself only, and the broker accepted replicated
messages even when its tenant did not list the source cluster (checked on 4.0.8).

Proving it (Spark task, `verify_partition`): the replicator keeps entries 1:1 and in order, so the i-th source
entry after the map's end pairs with the i-th target entry after it. Unbatched copies show the source
position as a property; batched ones only in the entry's metadata, which is sampled over the admin API.
Seen on 4.0.8: of a chunked message whose chunks are at the broker's full message size (a chunking producer's default),
only the last chunk reaches the target (the replicator's own metadata takes the others past the limit; readers there
never assemble the message), so a partition holding one fails here, its line naming the chunked messages and copy
mode. A message chunked smaller arrives whole.
"""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pulsar_migration.admin import AdminError, EntryUnanswered, NotFound, PulsarAdmin, seg
from pulsar_migration.positions import MessageIdInfo, Position, PositionError
from pulsar_migration.replication import source_ttl
from pulsar_migration.replication.content import GEO_SOURCE_PROPERTY, ContentHash
from pulsar_migration.replication.partition import (
    OK,
    PartitionJob,
    PartitionOutcome,
    PartitionTask,
    SharedClients,
    compacted_gap,
    judge,
    lag_after,
    mark_both_sides,
    not_copied_hint,
    only_undeliverable_after,
    run_partition,
)
from pulsar_migration.replication.posmap import MapRow
from pulsar_migration.replication.reading import ReadError, read_range
from pulsar_migration.replication.trim_risk import keeps_nothing
from pulsar_migration.spec import MigrationSpec
from pulsar_migration.stepjob import StepFailed

log = logging.getLogger(__name__)

REPLICATOR_PREFIX = "pulsar.repl."
POLL_S = 0.5
# A replicator missing from a partition's stats this long after the unload gets one more unload.
REPLICATOR_START_GRACE_S = 30.0
# A replicator that moved nothing to the target for this long is restarted by an unload (at most
# MAX_STALL_RESTARTS times per partition). Seen on 4.0.8: after one failed BookKeeper read (the broker out
# of direct memory, replicators reading 1000 entries of 128 KiB at once) the replicator logs "Skip the
# reading because there is a pending read task" for good and never reads again; an unload restarts it from its
# cursor. With nothing delivered for that long nothing is in flight either, so the restart sends nothing twice.
REPLICATOR_STALL_S = 30.0
MAX_STALL_RESTARTS = 3
# The switch's final delta (fenced: clients held) fails once a partition made no progress this long (one stall
# restart included), instead of at the geo timeout: an open transaction on the source holds the replicator back
# (4.0.8 reads only up to the topic's max read position) until it ends, which held the clients 600 s.
FENCED_STALL_S = 45.0
# How long the target may still be short once the source's replicator cursor says everything was delivered.
SETTLE_S = 15.0  # a loaded target broker can take seconds to show entries it has stored
# Reads of the source range that may stop short of its bound before the step gives up on reaching it.
SOURCE_READ_ATTEMPTS = 3
# Batched target entries whose source position is checked through the admin entry endpoint, per partition.
HEADER_SAMPLES = 5
# Source entries that did not arrive whose headers are read for a producer's replicateTo (local_only_hint).
LOCAL_ONLY_LOOKUPS = 50


class GeoError(StepFailed):
    """Geo-replication could not be turned on or did not catch up (one line)."""


def cursor_name(target: str) -> str:
    return f"{REPLICATOR_PREFIX}{target}"


# -- driver: turn replication on, wait for the backlog -------------------------------------------------

def _check_compacted(spec: MigrationSpec, admin: PulsarAdmin, jobs: list[PartitionJob]) -> None:
    """Refuses, before anything is turned on, partitions whose messages from before their first stored entry
    live only in a compacted ledger (partition.compacted_gap): the replicator reads the topic's own entries and
    never carries them, and the verification, reading the same, would pass."""
    with ThreadPoolExecutor(spec.admin_concurrency) as pool:
        gaps = pool.map(lambda job: compacted_gap(admin, job.topic, None), jobs)
        maybe = [(j.topic, g) for j, g in zip(jobs, gaps, strict=True) if g is not None]
    # A compaction ran on these; only one whose view holds a message before the first stored entry lost ledgers
    # (any compacted topic was refused, though retention, which geo mode requires, usually keeps them all).
    gone = [(topic, first) for topic, first in maybe if compacted_view_before(spec, topic, first)] if maybe else []
    if gone:
        names = ", ".join(f"{t.split('://', 1)[-1]} (before {g})" for t, g in gone[:5])
        raise GeoError(f"{len(gone)} partition(s) on {spec.source} hold messages only in their compacted ledger "
                       f"({names}{', ...' if len(gone) > 5 else ''}): a compaction kept them and their ledgers were "
                       "trimmed since; geo-replication does not carry them, copy mode does (replication.mode copy)")


def compacted_view_before(spec: MigrationSpec, topic: str, first: Position) -> bool:
    """Whether the source partition's compacted view begins before `first` (its first stored entry): the messages
    there live in the compacted ledger only."""
    import pulsar

    client = spec.source_cluster.pulsar_client()
    try:
        reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
        try:
            if not reader.has_message_available():
                return False
            message = reader.read_next(30_000)
            return MessageIdInfo.of(message.message_id()).position < first
        finally:
            reader.close()
    finally:
        client.close()


def prepare(spec: MigrationSpec, src_admin: PulsarAdmin, tgt_admin: PulsarAdmin,
            jobs: list[PartitionJob]) -> dict[str, Any]:
    """Replicates every selected partition's whole history to the target and waits until it arrived.
    Idempotent: existing replicator cursors are left where they are, clusters are only ever added."""
    started = time.monotonic()
    cursor = cursor_name(spec.target)
    tenant = seg(spec.tenant)
    by_ns: dict[str, list[PartitionJob]] = {}
    for job in jobs:
        by_ns.setdefault(job.local.split("/", 1)[0], []).append(job)
    _check_allowed(spec, src_admin, sorted(by_ns))
    _check_retention(spec, src_admin, jobs)
    _check_compacted(spec, src_admin, jobs)

    done: dict[str, Any] = {"namespaces_changed": [], "replication_clusters": {}, "target_replication_clusters": {},
                            "cursors_created": [], "partitions_unloaded": [], "unselected_topics_replicated": []}
    to_unload: list[PartitionJob] = []
    with ThreadPoolExecutor(spec.admin_concurrency) as pool:
        # What the target held before: the first arrival is timed from the first change that can start a
        # replicator (on 4.0.8 the policy change alone does, with a cursor created just before).
        baseline = dict(zip([j.topic for j in jobs], pool.map(lambda j: tgt_admin.last_entry(j.topic), jobs),
                            strict=True))
        enabled_at = 0.0
        for ns, ns_jobs in sorted(by_ns.items()):
            path = f"/namespaces/{tenant}/{seg(ns)}/replication"
            clusters = list(src_admin.get(path) or [])
            # Cursors first: a replicator started by the policy change before its cursor exists would begin
            # at the latest entry and skip the backlog for good.
            created = [t for t in pool.map(lambda j: _ensure_cursor(src_admin, j.topic, cursor,
                                                                    j.map_end[1] if j.map_end else None), ns_jobs)
                       if t]
            done["cursors_created"].extend(created)
            if spec.target not in clusters:
                union = [*clusters, spec.target]
                enabled_at = enabled_at or time.monotonic()
                src_admin.post(path, union)
                done["namespaces_changed"].append(ns)
                clusters = list(src_admin.get(path) or [])
                log.info("replication of %s/%s on %s now to %s", spec.tenant, ns, spec.source, clusters)
            done["replication_clusters"][ns] = clusters
            done["target_replication_clusters"][ns] = list(tgt_admin.get(path) or [])
            done["unselected_topics_replicated"].extend(_unselected_topics(src_admin, spec, ns, ns_jobs))
            created_set = set(created)
            running = dict(zip([j.topic for j in ns_jobs],
                               pool.map(lambda j: _replicator_stats(src_admin, j.topic, spec.target) is not None,
                                        ns_jobs), strict=True))
            to_unload.extend(j for j in ns_jobs if j.topic in created_set or not running[j.topic]
                             or ns in done["namespaces_changed"])
        if done["unselected_topics_replicated"]:
            log.warning("namespace-level replication also replicates %d unselected topic(s) from now on "
                        "(no backlog): %s", len(done["unselected_topics_replicated"]),
                        ", ".join(done["unselected_topics_replicated"][:10]))
        unload_at = time.monotonic()
        list(pool.map(lambda j: src_admin.put(f"{src_admin.topic_path(j.topic)}/unload"), to_unload))
        done["partitions_unloaded"] = sorted(j.topic for j in to_unload)
        done["unload_after_s"] = round(unload_at - enabled_at, 3) if enabled_at else None
        done.update(_wait_caught_up(spec, src_admin, tgt_admin, jobs, baseline, enabled_at or unload_at, pool))
    done["prepare_s"] = round(time.monotonic() - started, 3)
    return done


def _check_retention(spec: MigrationSpec, admin: PulsarAdmin, jobs: list[PartitionJob]) -> None:
    """Refuses, before anything is turned on, topics whose source keeps no retention: the broker trims what
    every cursor has passed, the replicator's included, so entries replicated and already consumed would be
    gone before they are read back to verify (seen on 4.0.8: the unload's ledger roll trims them at once),
    and a range that can never be verified again would block every later run."""
    topics = sorted({job.base_topic for job in jobs})

    def applied(topic: str) -> dict[str, Any]:
        return dict(admin.get(f"{admin.topic_path(topic)}/retention", params={"applied": "true"}) or {})

    with ThreadPoolExecutor(spec.admin_concurrency) as pool:
        missing = [t for t, r in zip(topics, pool.map(applied, topics), strict=True)
                   if keeps_nothing(r)]
    if missing:
        names = ", ".join(t.split("://", 1)[-1] for t in missing[:5])
        raise GeoError(f"geo mode verifies by reading the source after Pulsar replicated it, but {len(missing)} "
                       f"topic(s) keep no retention on {spec.source} ({names}{', ...' if len(missing) > 5 else ''}): "
                       "set a retention policy on their namespace(s) for the migration, e.g. 1 day / -1 MB")


def _check_allowed(spec: MigrationSpec, admin: PulsarAdmin, namespaces: list[str]) -> None:
    """Clear errors for what the broker would refuse with a terse 4xx (sync_metadata sets all of it up)."""
    try:
        admin.cluster(spec.target)
    except NotFound:
        raise GeoError(f"cluster {spec.target} is not registered on the source {spec.source}: run sync_metadata "
                       "first") from None
    allowed = admin.get(f"/tenants/{seg(spec.tenant)}").get("allowedClusters") or []
    if spec.target not in allowed:
        raise GeoError(f"tenant '{spec.tenant}' on the source {spec.source} does not allow cluster {spec.target} "
                       f"(allowedClusters {allowed}): run sync_metadata first")
    for ns in namespaces:
        ns_allowed = admin.get(f"/namespaces/{seg(spec.tenant)}/{seg(ns)}").get("allowed_clusters") or []
        if ns_allowed and spec.target not in ns_allowed:
            raise GeoError(f"namespace {spec.tenant}/{ns} on the source allows only {ns_allowed}: add "
                           f"{spec.target} to its allowed clusters first")


def _ensure_cursor(admin: PulsarAdmin, topic: str, cursor: str, start: Position | None = None) -> str | None:
    """Creates the replicator cursor when absent, at `start` (the source side of the map's last row: everything up
    to it is on the target already) or else at the earliest entry; returns the topic if it did. Checked in
    internalStats: a cursor the replicator owns is not listed among the topic's subscriptions. A geo-mode rollback
    starts at its seeded map's end: before it the topic holds only what was replicated into it, which a replicator
    would read through just to skip."""
    path = admin.topic_path(topic)
    if cursor in (admin.get(f"{path}/internalStats").get("cursors") or {}):
        return None
    at = {"ledgerId": start.ledger, "entryId": start.entry} if start else {"ledgerId": -1, "entryId": -1}
    admin.put(f"{path}/subscription/{seg(cursor)}", at)
    log.info("replicator cursor %s created at %s of %s", cursor, start or "the earliest entry", topic)
    return topic


def _replicator_stats(admin: PulsarAdmin, topic: str, target: str) -> dict[str, Any] | None:
    return (admin.get(f"{admin.topic_path(topic)}/stats").get("replication") or {}).get(target)


def _unselected_topics(admin: PulsarAdmin, spec: MigrationSpec, ns: str, jobs: list[PartitionJob]) -> list[str]:
    """Persistent topics of the namespace the spec does not select: namespace-level replication covers them
    too (from the moment it is on, without their backlog)."""
    selected = {j.base_topic for j in jobs}
    names = set()
    for topic in admin.get(f"/persistent/{seg(spec.tenant)}/{seg(ns)}"):
        base = topic.rsplit("-partition-", 1)[0] if "-partition-" in topic else topic
        if not base.rsplit("/", 1)[-1].startswith("__") and base not in selected:
            names.add(base)
    return sorted(names)


def replicated_position(headers: dict[str, str]) -> Position | None:
    """The source position a target entry was replicated from (its entry metadata), None if not replicated."""
    try:
        text = json.loads(headers.get("X-Pulsar-PROPERTY") or "{}").get(GEO_SOURCE_PROPERTY)
        return Position.parse(text) if text else None
    except (ValueError, PositionError):
        return None


def _caught_up(spec: MigrationSpec, src_admin: PulsarAdmin, tgt_admin: PulsarAdmin, job: PartitionJob,
               status: dict[str, Any]) -> bool:
    """Replication must run on the partition (its replicator in the source's stats; asking also loads a
    topic the unload closed). Arrival is judged on the target first (its last entry names the source entry
    it came from), then by the replicator's cursor: the source's backlog counter can stay stale."""
    stats = _replicator_stats(src_admin, job.topic, spec.target)
    status["replicator"] = stats is not None
    if stats is None:
        return False
    status["backlog"] = stats.get("replicationBacklog")
    status["connected"] = stats.get("connected")
    if job.upper is None or (job.map_end is not None and job.map_end[1] >= job.upper):
        return True
    last = tgt_admin.last_entry(job.topic)
    status["target_last"] = str(last) if last else None
    if last is not None:
        try:
            source = replicated_position(tgt_admin.entry_headers(job.topic, last.ledger, last.entry))
        except EntryUnanswered:  # a chunk of a compressed message: the replicator's own figures tell
            source = None
        status["target_last_from"] = str(source) if source else None
        if source is not None and source >= job.upper:
            return True
    if stats.get("replicationBacklog") != 0:
        return False
    mark = replicator_mark(src_admin, job.topic, spec.target)
    return mark is not None and mark >= job.upper


def replicator_mark(admin: PulsarAdmin, topic: str, target: str) -> Position | None:
    """The source entry up to which the target confirmed every replicated entry (None: no replicator cursor)."""
    cursors = admin.get(f"{admin.topic_path(topic)}/internalStats").get("cursors") or {}
    mark = (cursors.get(cursor_name(target)) or {}).get("markDeletePosition")
    return Position.parse(mark) if mark else None


def _arrived(status: dict[str, Any], before: Position | None) -> bool:
    """Whether the target partition's last entry moved since replication was turned on."""
    return "target_last" in status and status["target_last"] != (str(before) if before else None)


class StallWatch:
    """Which partitions' replicators made no progress for `stall_s` (their progress signature, e.g. the
    target's last entry, unchanged), so they can be restarted; each partition at most `max_restarts` times.

    One restart at a time: the next stalled partition is restarted only once the last restarted one moved
    (or left the watch). Restarting all at once repeated the failure here (four replicators reading
    128 MiB each again exhausted the broker's direct memory again); one by one each got through."""

    def __init__(self, stall_s: float = REPLICATOR_STALL_S, max_restarts: int = MAX_STALL_RESTARTS) -> None:
        self.stall_s, self.max_restarts = stall_s, max_restarts
        self._seen: dict[str, tuple[Any, float]] = {}
        self._awaiting: str | None = None  # restarted, not moved since
        self.restarts: dict[str, int] = {}

    def stalled(self, topic: str, progress: Any, now: float) -> bool:
        """Records `progress` at `now`; True (and counted as a restart) when it has not changed for stall_s,
        the partition has restarts left and no other restarted partition is still waiting to move."""
        seen = self._seen.get(topic)
        if seen is None or seen[0] != progress:
            self._seen[topic] = (progress, now)
            if topic == self._awaiting:
                self._awaiting = None
            return False
        if now - seen[1] < self.stall_s or self.restarts.get(topic, 0) >= self.max_restarts:
            return False
        if self._awaiting not in (None, topic):
            return False
        self.restarts[topic] = self.restarts.get(topic, 0) + 1
        self._seen[topic] = (progress, now)
        self._awaiting = topic
        return True

    def forget(self, topic: str) -> None:
        """The partition caught up (or is no longer watched): it holds back no other restart."""
        self._seen.pop(topic, None)
        if topic == self._awaiting:
            self._awaiting = None


class FencedStall:
    """Partitions of a fenced run whose replication made no progress (target's last entry, backlog) for
    FENCED_STALL_S."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[Any, float]] = {}

    def stalled(self, topic: str, status: dict[str, Any], now: float) -> bool:
        progress = (status.get("target_last"), status.get("backlog"), status.get("replicator"))
        seen = self._seen.get(topic)
        if seen is None or seen[0] != progress:
            self._seen[topic] = (progress, now)
            return False
        return now - seen[1] >= FENCED_STALL_S


def fenced_stall_line(spec: MigrationSpec, admin: PulsarAdmin, job: PartitionJob, status: dict[str, Any]) -> str:
    """The one line of a fenced partition whose replication stopped short of its bound, with the likely cause."""
    assert job.upper is not None
    mark = replicator_mark(admin, job.topic, spec.target)
    cause = ""
    try:
        if mark is not None and mark < job.upper and not only_undeliverable_after(admin, job.topic, mark, job.upper,
                                                                                  reader_stopped=True):
            cause = ("; what follows is not only transaction markers or aborted messages: an open transaction on the "
                     "source (the replicator reads no further until it ends), or a replicator stuck")
    except Exception:  # the cause stays unnamed; the line stands
        log.debug("%s: what follows %s is not known", job.topic, mark, exc_info=True)
    return (f"replication to {spec.target} made no progress for {FENCED_STALL_S:.0f}s on {job.topic} while the "
            f"clients are held: its replicator stands at {mark or 'no entry'}, the source's end is {job.upper}"
            f"{cause} ({json.dumps(status, sort_keys=True)})")


def _stall_progress(status: dict[str, Any]) -> tuple[Any, ...] | None:
    """What moves while a running replicator works (None: no replicator yet, the start rule applies)."""
    if not status.get("replicator"):
        return None
    return status.get("target_last"), status.get("backlog")


def _wait_caught_up(spec: MigrationSpec, src_admin: PulsarAdmin, tgt_admin: PulsarAdmin, jobs: list[PartitionJob],
                    baseline: dict[str, Position | None], since: float, pool: ThreadPoolExecutor) -> dict[str, Any]:
    """Polls until every partition's replication reached the job's upper bound, or fails at the geo timeout
    (counted, like the reported times, from `since`: the policy change, else the unload)."""
    deadline = since + spec.geo_timeout_s
    pending = list(jobs)
    first_arrival_s: float | None = None
    reunloaded: set[str] = set()
    stalls = StallWatch()
    fenced = FencedStall()
    status: dict[str, dict[str, Any]] = {}
    while True:
        checks: list[tuple[PartitionJob, dict[str, Any]]] = [(j, {}) for j in pending]
        results = list(pool.map(lambda c: _caught_up(spec, src_admin, tgt_admin, *c), checks))
        status = {j.topic: s for j, s in checks}
        if first_arrival_s is None and any(_arrived(s, baseline.get(t)) for t, s in status.items()):
            first_arrival_s = round(time.monotonic() - since, 3)
        for job, ok in zip(pending, results, strict=True):
            if ok:
                stalls.forget(job.topic)
        pending = [j for j, ok in zip(pending, results, strict=True) if not ok]
        if not pending:
            break
        now = time.monotonic()
        for job in pending:
            if job.fenced and job.upper is not None and fenced.stalled(job.topic, status.get(job.topic, {}), now):
                raise GeoError(fenced_stall_line(spec, src_admin, job, status.get(job.topic, {})))
        if now > deadline:
            first = pending[0]
            raise GeoError(f"replication to {spec.target} has not caught up after {spec.geo_timeout_s}s on "
                           f"{len(pending)} partition(s) (first: {first.topic} up to {first.upper}, "
                           f"{json.dumps(status.get(first.topic, {}), sort_keys=True)})")
        for job in pending:
            if (now - since > REPLICATOR_START_GRACE_S and job.topic not in reunloaded
                    and status.get(job.topic, {}).get("replicator") is False):
                log.warning("no replicator to %s on %s after %.0fs: unloading it again", spec.target, job.topic,
                            now - since)
                src_admin.put(f"{src_admin.topic_path(job.topic)}/unload")
                reunloaded.add(job.topic)
                continue
            progress = _stall_progress(status.get(job.topic, {}))
            if progress is not None and stalls.stalled(job.topic, progress, now):
                log.warning("replicator to %s on %s moved nothing for %.0fs (%s): restarting it by an unload",
                            spec.target, job.topic, stalls.stall_s, json.dumps(status.get(job.topic, {}),
                                                                                 sort_keys=True))
                src_admin.put(f"{src_admin.topic_path(job.topic)}/unload")
        time.sleep(POLL_S)
    wait_s = round(time.monotonic() - since, 3)
    log.info("replication to %s caught up on %d partition(s) %.1fs after it was turned on%s", spec.target, len(jobs),
             wait_s, f" (first entry arrived after {first_arrival_s}s)" if first_arrival_s is not None else "")
    return {"first_arrival_s": first_arrival_s, "wait_s": wait_s, "partitions_unloaded_again": sorted(reunloaded),
            "stalled_replicators_restarted": dict(sorted(stalls.restarts.items()))}


# -- Spark task: pair and verify one partition ---------------------------------------------------------

@dataclass
class _Entry:
    """One entry as a reader delivered it (a chunked message: its last chunk, first chunk noted)."""

    info: MessageIdInfo
    messages: int
    publish_time: int
    source_property: str | None = None  # __MSG_PROP_REPL_SOURCE_POSITION as the first message shows it

    @property
    def position(self) -> Position:
        return self.info.position

    @property
    def batch_size(self) -> int:
        return self.info.messages_in_entry


@dataclass
class _Side:
    content: ContentHash = field(default_factory=ContentHash)
    entries: list[_Entry] = field(default_factory=list)

    @property
    def last(self) -> Position | None:
        return self.entries[-1].position if self.entries else None


def _complete(info: MessageIdInfo) -> bool:
    """Whether this message is the last of its entry (a batch whose size the id lacks ends at the next entry)."""
    return not info.batched or (info.batch_size > 0 and info.batch_index >= info.batch_size - 1)


def read_entries(client: Any, topic: str, side: _Side, after: Position | None, until: Position | None = None,
                 limit: int | None = None) -> None:
    """Appends whole entries after `after` (up to `until`, at most `limit` in all) to `side`, hashing their
    messages; an entry still incomplete when the reader runs dry is left for the next call."""
    pending: list[tuple[Any, MessageIdInfo]] = []

    def finish() -> None:
        first, info = pending[0]
        for message, _ in pending:
            side.content.add(message, new_entry=message is first)
        side.entries.append(_Entry(info, len(pending), first.publish_timestamp(),
                                   first.properties().get(GEO_SOURCE_PROPERTY)))
        pending.clear()

    if limit is not None and len(side.entries) >= limit:
        return
    messages = read_range(client, topic, after, until)
    try:
        for message, info in messages:
            if pending and info.position != pending[0][1].position:
                finish()
                if limit is not None and len(side.entries) >= limit:
                    return
            pending.append((message, info))
            if _complete(info):
                finish()
                if limit is not None and len(side.entries) >= limit:
                    return
        if pending and pending[0][1].position == until:  # the bound's entry: a batch reaches a reader whole
            finish()
    finally:
        messages.close()


def chunked_hint(entries: list[_Entry]) -> str:
    """Why a target that lacks entries may lack them, when the source range holds chunked messages."""
    chunked = [e for e in entries if e.info.first_chunk is not None]
    if not chunked:
        return ""
    return (f"; the source holds {len(chunked)} chunked message(s), the first at {chunked[0].position}: Pulsar's "
            "replicator drops a chunk stored at the broker's full message size (a chunking producer's default for "
            "all chunks but the last): with its own metadata added the send is refused as too large, and it counts "
            "that as stored. Only the last chunk arrives and no reader there delivers the message; copy such topics "
            "with replication.mode copy")


def not_arrived(source: list[_Entry], target: list[_Entry]) -> list[_Entry]:
    """The source entries no target entry names as its origin (a batch replicated whole names none)."""
    arrived = {t.source_property for t in target if t.source_property}
    return [s for s in source if str(s.position) not in arrived]


def expired_hint(admin: PulsarAdmin, base_topic: str, source: list[_Entry], target: list[_Entry], now_ms: int) -> str:
    """Why a target that lacks entries may lack them, when the source topic has a message TTL and the entries that
    did not arrive are older than it: the broker's expiry check moves the replicator's cursor past them as it
    moves every subscription's (4.0.8 PersistentTopic.checkMessageExpiry), while readers of the source get them."""
    ttl = source_ttl.applied_ttls(admin, [base_topic], 1).get(base_topic, 0)
    if ttl <= 0:
        return ""
    old = [s for s in not_arrived(source, target) if now_ms - s.publish_time > ttl * 1000]
    if not old:
        return ""
    return (f"; {len(old)} source entr{'y' if len(old) == 1 else 'ies'} older than the topic's message TTL ({ttl}s) "
            f"did not arrive, the first at {old[0].position}: the broker's expiry check moves the replicator past "
            "them as it moves every subscription, while readers of the source get them; copy such topics with "
            "replication.mode copy (its readers read them again)")


def local_only_hint(spec: MigrationSpec, admin: PulsarAdmin, topic: str, source: list[_Entry],
                    target: list[_Entry]) -> str:
    """Why a target that lacks entries may lack them, when source entries a reader delivers are marked by their
    producer for other clusters only (`replicationClusters`, or `disableReplication`: `X-Pulsar-replicated-to`
    `__local__`): Pulsar's replicator skips them. The source entries no target entry names as its origin are
    looked up, at most LOCAL_ONLY_LOOKUPS (a batch replicated whole names none: a lookup, and no such entry)."""
    held: list[tuple[Position, str]] = []
    for entry in not_arrived(source, target)[:LOCAL_ONLY_LOOKUPS]:
        to = admin.entry_headers(topic, entry.position.ledger, entry.position.entry).get("X-Pulsar-replicated-to")
        if to is not None and spec.target not in {c.strip() for c in to.split(",")}:
            held.append((entry.position, to))
    if not held:
        return ""
    return (f"; {len(held)} source entr{'y is' if len(held) == 1 else 'ies are'} marked by the producer for other "
            f"clusters only (the first at {held[0][0]}, replicated-to {held[0][1]}: replicationClusters or "
            f"disableReplication): Pulsar's replicator never sends them to {spec.target}, while every reader of the "
            "source gets them; copy such topics with replication.mode copy")


def late_start_hint(spec: MigrationSpec, source: list[_Entry], target: list[_Entry], cursor_passed: bool) -> str:
    """Why a target that lacks entries may lack them, when those are the source's first ones: the replicator began
    after them. Its cursor was there before this run (the namespace replicated to the target before the tool ran,
    the topic was created while unselected and its cursor started at its end, or a pre-created cursor was removed
    as an orphan by a topic load before the policy change listed the target), and prepare trusts an existing
    cursor. Every re-run failed as "content differs" with no cause named. `cursor_passed`: the source's replicator
    cursor is past the bound (with nothing on the target, all it passed was skipped)."""
    origins = [Position.parse(t.source_property) for t in target if t.source_property]
    first_arrived = min(origins) if origins else None
    if first_arrived is None and not cursor_passed:
        return ""
    before = [s for s in not_arrived(source, target) if first_arrived is None or s.position < first_arrived]
    if not before or before[0].position != source[0].position:
        return ""
    since = f", the first replicated {first_arrived}" if first_arrived else ""
    return (f"; the replication to {spec.target} began after the source's first {len(before)} entr"
            f"{'y' if len(before) == 1 else 'ies'} (from {before[0].position}{since}): the partition's replicator "
            "cursor was there before this run (the namespace replicated there before, the topic was created "
            "while not selected, or the cursor was removed before replication was on) and geo-replication never "
            "sends what lies before it; copy these topics with replication.mode copy")


def _sample(indexes: list[int], count: int) -> list[int]:
    """Up to `count` indexes spread evenly, the first and the last included."""
    if len(indexes) <= count:
        return indexes
    step = (len(indexes) - 1) / (count - 1)
    return sorted({indexes[round(i * step)] for i in range(count)})


def _mispaired(target: Position, origin: str, source: Position) -> str:
    text = f"target entry {target} was replicated from {origin}, paired with source entry {source}"
    try:
        if Position.parse(origin) < source:
            text += " (entries before it are gone from the source: trimmed once replicated? set a retention policy)"
    except PositionError:
        pass
    return text


NOT_REPLICATED = "was not replicated"


def _not_replicated(spec: MigrationSpec, target: Position, source: Position) -> str:
    return (f"target entry {target} {NOT_REPLICATED} (no {GEO_SOURCE_PROPERTY}), paired with source entry "
            f"{source}{not_copied_hint(spec)}")


def pair_entries(spec: MigrationSpec, admin: PulsarAdmin, job: PartitionJob, source: list[_Entry],
                 target: list[_Entry]) -> tuple[list[MapRow], list[str], int]:
    """One map row per (source, target) pair; shape errors; how many entry headers were checked."""
    errors: list[str] = []
    rows: list[MapRow] = []
    batched: list[int] = []
    for i, (s, t) in enumerate(zip(source, target, strict=False)):
        if s.messages != t.messages or s.info.batched != t.info.batched or s.batch_size != t.batch_size:
            errors.append(f"target entry {t.position} holds {t.messages} of {t.batch_size} message(s) "
                          f"({'batched' if t.info.batched else 'unbatched'}) for source entry {s.position} of "
                          f"{s.messages} of {s.batch_size} ({'batched' if s.info.batched else 'unbatched'})")
        expected = {str(s.position)} | ({str(s.info.first_chunk)} if s.info.first_chunk else set())
        if t.source_property is not None:
            if t.source_property not in expected:
                errors.append(_mispaired(t.position, t.source_property, s.position))
        elif not t.info.batched:
            errors.append(_not_replicated(spec, t.position, s.position))
        else:
            batched.append(i)
        rows.append(MapRow(
            topic=job.topic, partition=job.partition, source_ledger=s.position.ledger, source_entry=s.position.entry,
            source_messages=s.batch_size, source_batched=s.info.batched,
            source_first_chunk=str(s.info.first_chunk) if s.info.first_chunk else None,
            target_ledger=t.position.ledger, target_entry=t.position.entry, target_messages=t.batch_size,
            target_batched=t.info.batched,
            target_first_chunk=str(t.info.first_chunk) if t.info.first_chunk else None,
            source_publish_time=s.publish_time, mode="geo"))
    sampled = _sample(batched, HEADER_SAMPLES)
    for i in sampled:
        s, t = source[i], target[i]
        headers = admin.entry_headers(job.topic, t.position.ledger, t.position.entry)
        origin = replicated_position(headers)
        if origin is None:
            errors.append(_not_replicated(spec, t.position, s.position))
        elif origin != s.position:
            errors.append(_mispaired(t.position, str(origin), s.position))
        if headers.get("X-Pulsar-replicated-from") != spec.source:
            errors.append(f"target entry {t.position} was replicated from cluster "
                          f"{headers.get('X-Pulsar-replicated-from')!r}, not {spec.source}")
    return rows, errors, len(sampled)


def source_shortfall(admin: PulsarAdmin, job: PartitionJob, last: Position | None) -> str | None:
    """Why reading the source stopped before the run's bound: None when the bound is an entry no reader sees
    (a marker, a transactional message), else the problem. A source without retention trims what every cursor,
    the replicator's included, has passed: the range must stay readable until it is verified."""
    assert job.upper is not None
    try:
        headers = admin.entry_headers(job.topic, job.upper.ledger, job.upper.entry)
    except EntryUnanswered as exc:
        return f"{job.topic}: reading the source stopped at {last}, before this run's bound {job.upper} ({exc})"
    except AdminError as exc:
        return (f"{job.topic}: the source no longer holds this run's range up to {job.upper} (read up to {last}): "
                f"trimmed once replicated and consumed? give the namespace a retention policy ({exc})")
    if headers.get("X-Pulsar-marker-type") or headers.get("X-Pulsar-txnid-most-bits"):
        return None
    return f"{job.topic}: reading the source stopped at {last}, before this run's bound {job.upper}"


def verify_partition(spec: MigrationSpec, job: PartitionJob,
                     shared: SharedClients | None = None) -> tuple[PartitionOutcome, list[MapRow]]:
    """Reads the source range and as many target entries after the map's end, waiting (up to the geo timeout)
    while the target is short; pairs and checks them. Never raises: failures are in the outcome."""
    return run_partition(spec, job, lambda task: _verify(spec, task), (ReadError, PositionError, AdminError), shared)


def _verify(spec: MigrationSpec, task: PartitionTask) -> list[MapRow]:
    job, outcome = task.job, task.outcome
    src_admin, tgt_admin, src_client, tgt_client = task.src_admin, task.tgt_admin, task.src_client, task.tgt_client
    map_target, map_source = task.map_target, task.map_source
    started = time.monotonic()
    source = _Side()
    if job.upper is not None and (map_source is None or map_source < job.upper):
        # A reader attached while the topic reloads (after prepare's unload) can report "nothing available"
        # at once: read on from where it stopped until the bound is reached. An entry no reader sees (a
        # marker) at the very end of the range only costs these attempts.
        for _ in range(SOURCE_READ_ATTEMPTS):
            read_entries(src_client, job.topic, source, source.last or map_source, job.upper)
            if source.last is not None and source.last >= job.upper:
                break
            time.sleep(POLL_S)
        else:
            problem = source_shortfall(src_admin, job, source.last)
            if problem:
                outcome.fail(problem)
                return []
    outcome.source_messages, outcome.source_entries = source.content.messages, source.content.entries
    outcome.source_bytes, outcome.source_hash = source.content.bytes, source.content.hexdigest

    target = _Side()
    wanted = len(source.entries)
    deadline = time.monotonic() + spec.geo_timeout_s
    settle_until: float | None = None  # set once the source says everything was delivered
    while len(target.entries) < wanted:
        read_entries(tgt_client, job.topic, target, target.last or map_target, limit=wanted)
        now = time.monotonic()
        if len(target.entries) >= wanted or now > deadline or (settle_until is not None and now > settle_until):
            break
        if settle_until is None and job.upper is not None:
            mark = replicator_mark(src_admin, job.topic, spec.target)
            if mark is not None and mark >= job.upper:
                settle_until = now + SETTLE_S
        time.sleep(POLL_S)
    outcome.copy_s = round(time.monotonic() - started, 3)  # reading both sides, waiting for the target
    outcome.target_messages, outcome.target_entries = target.content.messages, target.content.entries
    outcome.target_hash = target.content.hexdigest
    outcome.copied_messages, outcome.copied_entries = target.content.messages, target.content.entries
    outcome.copied_bytes = target.content.bytes

    started = time.monotonic()
    rows, errors, _ = pair_entries(spec, tgt_admin, job, source.entries, target.entries)
    unreplicated = [e for e in errors if f" {NOT_REPLICATED} (" in e]
    if unreplicated:  # the likely cause first: the target's own messages, not a replication fault
        outcome.fail(f"{job.topic}: {unreplicated[0]}")
    if len(target.entries) < wanted:
        hint = (chunked_hint(source.entries)
                or local_only_hint(spec, src_admin, job.topic, source.entries, target.entries)
                or expired_hint(src_admin, job.base_topic, source.entries, target.entries, int(time.time() * 1000))
                or (late_start_hint(spec, source.entries, target.entries, settle_until is not None)
                    if map_source is None else ""))
        guess = "" if hint else " (entries dropped on the target?)"
        short = f"the target holds {len(target.entries)} of {wanted} replicated entries " + (
            f"although the source's replicator cursor is past {job.upper}{guess}"
            if settle_until is not None else f"after {spec.geo_timeout_s}s")
        errors.insert(0, short)
        if hint:  # the partition's one line: the likely cause before the differing hashes it causes
            outcome.fail(f"{job.topic}: {short}{hint}")
    outcome.verify_s = round(time.monotonic() - started, 3)
    outcome.shape_errors, outcome.mapped_entries = len(errors), len(rows)
    judge(outcome, errors)  # no send receipts in geo mode: both receipt digests stay empty and equal
    outcome.lag_entries = lag_after(src_admin, job)
    if rows and map_source is None and outcome.status == OK:
        mark_both_sides(task)
    return rows


