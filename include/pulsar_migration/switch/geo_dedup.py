"""Geo mode: before the flip, the target's deduplication must know each source producer's last sequence id.

The fence's unload can cut off a producer's receipt for a message the source had already stored. The
producer re-sends it after the flip under its own name and sequence id, and only the target's dedup can drop
it. On 4.0.8 a broker deduplicates *replicated* messages by the replicator's name and source position
(`MessageDeduplication.isDuplicateReplV2`, since 4.0.4), so the live target never records the original
producers' sequence ids and stored such a re-send twice (the open bug of switch_lookup in geo mode).

A topic that loads replays its entries since the last dedup snapshot under each entry's own producer name
(`replayCursor` reads the message metadata), which for a replicated entry is the original producer's. So,
after the final delta: unload each target partition that had producers at the fence, wait until its dedup
runs again, then ask both clusters what they know of each of those producers (a producer created with the
same name is told its last sequence id) and refuse the flip where the target knows less than the source.
The source's dedup is on since the switch's `source_dedup` phase, before the fence, so it knows every
sequence id a cut-off receipt could belong to.

A dedup snapshot the target took after a producer's last entry (every 1,000 entries, or on the snapshot timer)
hides that entry from the replay. Only a producer with a send in flight at the fence can re-send, so only one
whose entries the source stored since a mark taken before the hold (`source_marks`, the earliest attempt's) is
judged: one idle since then got its receipts before the hold (until 2026-11-29 an idle producer connected
through the switch was refused on every retry, since its entry never came back into the replay window: a tenant
with a low-rate producer could not switch back in geo mode). A producer that did send since the mark and whose
entry a snapshot hid is still refused (the switch rolls back; a retry after more traffic passes).
"""

from __future__ import annotations

import functools
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pulsar_migration import rundir
from pulsar_migration.admin import EntryUnanswered, PulsarAdmin
from pulsar_migration.positions import Position
from pulsar_migration.replication.reading import read_range
from pulsar_migration.replication.skipped import SkippedEntries, before_first_entry, ledger_entries
from pulsar_migration.replication.step import wait_deduplicating
from pulsar_migration.spec import ClusterSpec, MigrationSpec
from pulsar_migration.stepjob import StepFailed
from pulsar_migration.switch.fanout import each_partition

log = logging.getLogger(__name__)

DEDUP_RELOAD_TIMEOUT_S = 60.0
PROBE_THREADS = 16  # producers opened at once by last_sequence_ids
FENCED_PRODUCERS = "switch_fenced_producers.json"  # in the run dir: every attempt's fenced producers
SOURCE_MARKS = "switch_source_marks.json"  # in the run dir: each partition's last entry before the first hold


class TargetDedupBehind(StepFailed):
    """The target's deduplication does not know a source producer's last sequence id."""


def producers_by_partition(admin: PulsarAdmin, partitions: list[str]) -> dict[str, list[str]]:
    """The names of the producers connected to each partition (the source's, taken right before the fence)."""
    def names(admin: PulsarAdmin, topic: str) -> list[str]:
        stats = admin.get(f"{admin.topic_path(topic)}/stats")
        return sorted({p["producerName"] for p in stats.get("publishers") or [] if p.get("producerName")})

    found = each_partition(admin, partitions, names)
    return {topic: named for topic, named in zip(partitions, found, strict=True) if named}


def kept_with_earlier(run_dir: str, found: dict[str, list[str]], partitions: list[str]) -> dict[str, list[str]]:
    """`found` (the producers on the source right before this fence) and those an earlier attempt of this run found
    before its own fence, written to the run dir before the unload. A run killed after its fence leaves the tenant
    held; the re-run releases it, but a producer cut off by the first fence may still be in its reconnect backoff
    at the second, and would re-send after the flip what the source had already stored (and replicated)."""
    earlier: dict[str, list[str]] = {}
    if rundir.exists(run_dir, FENCED_PRODUCERS):
        earlier = json.loads(rundir.read_text(run_dir, FENCED_PRODUCERS))
    selected = set(partitions)
    kept = {topic: sorted(set(earlier.get(topic, [])) | set(found.get(topic, [])))
            for topic in sorted((set(earlier) | set(found)) & selected)}
    kept = {topic: names for topic, names in kept.items() if names}
    rundir.write_text(run_dir, FENCED_PRODUCERS, json.dumps(kept, indent=1))
    return kept


def source_marks(run_dir: str, admin: PulsarAdmin, partitions: list[str]) -> dict[str, Position | None]:
    """Each partition's last source entry now (taken before the hold; None: empty), or an earlier attempt's mark
    where that one is earlier: that attempt's fence may have cut off a receipt a producer still waits for (in its
    reconnect backoff), as kept_with_earlier keeps its producers."""
    earlier: dict[str, str | None] = {}
    if rundir.exists(run_dir, SOURCE_MARKS):
        earlier = json.loads(rundir.read_text(run_dir, SOURCE_MARKS))
    now = each_partition(admin, partitions, lambda admin, topic: admin.last_entry(topic))
    marks: dict[str, Position | None] = {}
    for topic, mark in zip(partitions, now, strict=True):
        if topic in earlier:
            before = Position.parse(earlier[topic]) if earlier[topic] else None
            mark = None if before is None or mark is None else min(before, mark)
        marks[topic] = mark
    return marks


def record_marks(run_dir: str, marks: dict[str, Position | None]) -> None:
    """Keeps this attempt's marks for a re-run, written before its fence (source_marks)."""
    rundir.write_text(run_dir, SOURCE_MARKS, json.dumps({t: str(m) if m else None for t, m in marks.items()},
                                                        indent=1))


PASSED_LOOKUPS = 1_000  # entries a reader passed over looked up at most per partition, else every producer counts


def producers_since(cluster: ClusterSpec, admin: PulsarAdmin, topic: str, mark: Position | None) -> set[str] | None:
    """The producer names on the source entries after `mark` (from the first for None), read to the partition's end
    (fenced: it does not move). The reader does not deliver a chunked message whose first chunk lies before the mark
    (the client drops it), nor chunks of one not finished: the entries it passed over are looked up for their
    producers. None when they cannot all be told (more than PASSED_LOOKUPS, or one the broker does not show): then
    every producer of the partition is judged."""
    end = admin.last_entry(topic)
    if end is None or (mark is not None and mark >= end):
        return set()
    start = mark or before_first_entry(ledger_entries(admin, topic)) or Position(end.ledger, -1)
    passed = SkippedEntries(start, functools.partial(ledger_entries, admin, topic))
    names: set[str] = set()
    client = cluster.pulsar_client(operation_timeout_seconds=30)
    try:
        for message, info in read_range(client, topic, mark, end, cluster=cluster.name):
            names.add(str(message.producer_name()))
            passed.saw(info.position, info.first_chunk)
    finally:
        client.close()
    passed.finish(end)
    if passed.too_many or len(passed.positions) > PASSED_LOOKUPS:
        return None
    for position in passed.positions:
        try:
            headers = admin.entry_headers(topic, position.ledger, position.entry)
        except EntryUnanswered:
            return None
        if headers.get("X-Pulsar-producer-name"):
            names.add(headers["X-Pulsar-producer-name"])
    return names


def last_sequence_ids(cluster: ClusterSpec, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], int]:
    """What `cluster`'s dedup knows of each (partition, producer name): a producer opened under that name is
    told the last sequence id the broker recorded for it (-1: none). Nothing is sent."""
    client = cluster.pulsar_client(operation_timeout_seconds=30)

    def ask(pair: tuple[str, str]) -> int:
        producer = client.create_producer(pair[0], producer_name=pair[1], batching_enabled=False)
        try:
            return int(producer.last_sequence_id())
        finally:
            producer.close()

    try:
        with ThreadPoolExecutor(max(1, min(len(pairs), PROBE_THREADS))) as pool:
            return dict(zip(pairs, pool.map(ask, pairs), strict=True))
    finally:
        client.close()


def reload_with_dedup(admin: PulsarAdmin, partitions: list[str]) -> None:
    """Unloads each partition and waits until it runs with deduplication again (its replay done)."""
    each_partition(admin, partitions, lambda admin, topic: admin.put(f"{admin.topic_path(topic)}/unload",
                                                                      expect_json=False))
    pending = wait_deduplicating(admin, partitions, DEDUP_RELOAD_TIMEOUT_S)
    if pending:
        raise TargetDedupBehind(f"deduplication did not run again on {len(pending)} target partition(s) "
                                f"{DEDUP_RELOAD_TIMEOUT_S:.0f}s after their unload (first: {pending[0]})")


def teach_target(spec: MigrationSpec, tgt_admin: PulsarAdmin, producers: dict[str, list[str]],
                 marks: dict[str, Position | None] | None = None,
                 src_admin: PulsarAdmin | None = None) -> dict[str, Any]:
    """Reloads the target partitions that had producers at the fence and proves their dedup now knows each
    producer's last sequence id at least as far as the source's does, for every producer that stored entries on
    the source since `marks` (source_marks; every producer of a partition without one). Returns what it checked;
    raises TargetDedupBehind naming the first producer the target knows less of."""
    pairs = [(topic, name) for topic, names in sorted(producers.items()) for name in names]
    if not pairs:
        return {"partitions": 0, "producers": 0}
    started = time.monotonic()
    with ThreadPoolExecutor(1) as side:  # the fenced source's answers do not change: ask while the target reloads
        asked = side.submit(last_sequence_ids, spec.source_cluster, pairs)
        reload_with_dedup(tgt_admin, sorted(producers))
        target = last_sequence_ids(spec.target_cluster, pairs)
        source = asked.result()
    behind = [(topic, name, source[(topic, name)], target[(topic, name)]) for topic, name in pairs
              if target[(topic, name)] < source[(topic, name)]]
    idle = []
    if behind and marks is not None and src_admin is not None:
        topics = sorted({topic for topic, *_ in behind if topic in marks})
        with ThreadPoolExecutor(max(1, min(len(topics), PROBE_THREADS))) as pool:  # clients are held meanwhile
            found = pool.map(lambda topic: producers_since(spec.source_cluster, src_admin, topic, marks[topic]),
                             topics)
            sent = {topic: names for topic, names in zip(topics, found, strict=True) if names is not None}
        idle = [b for b in behind if b[0] in sent and b[1] not in sent[b[0]]]
        if idle:
            log.info("%d producer(s) the target's dedup knows less of stored nothing on the source since the mark "
                     "before the hold (first: %s on %s): no send of theirs was in flight at the fence",
                     len(idle), idle[0][1], idle[0][0])
        behind = [b for b in behind if b not in idle]
    if behind:
        topic, name, src, tgt = behind[0]
        raise TargetDedupBehind(
            f"the target's deduplication knows producer {name} on {topic} up to sequence id {tgt}, the source's up "
            f"to {src} ({len(behind)} such producer(s)): a re-send after the flip could be stored twice")
    checked = {"partitions": len(producers), "producers": len(pairs),
               "sequence_ids_known": sum(1 for pair in pairs if source[pair] >= 0),
               "idle_since_mark_behind": len(idle),
               "seconds": round(time.monotonic() - started, 3)}
    log.info("target dedup knows every fenced producer's last sequence id: %s", checked)
    return checked
