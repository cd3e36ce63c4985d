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

Left: a dedup snapshot the target took after a producer's last entry (every 1,000 entries, or on the
snapshot timer) hides that entry from the replay; the check then refuses and the switch rolls back, and a
retry after more traffic passes.
"""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pulsar_migration import rundir
from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.replication.step import wait_deduplicating
from pulsar_migration.spec import ClusterSpec, MigrationSpec
from pulsar_migration.stepjob import StepFailed
from pulsar_migration.switch.fanout import each_partition

log = logging.getLogger(__name__)

DEDUP_RELOAD_TIMEOUT_S = 60.0
PROBE_THREADS = 16  # producers opened at once by last_sequence_ids
FENCED_PRODUCERS = "switch_fenced_producers.json"  # in the run dir: every attempt's fenced producers


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


def teach_target(spec: MigrationSpec, tgt_admin: PulsarAdmin, producers: dict[str, list[str]]) -> dict[str, Any]:
    """Reloads the target partitions that had producers at the fence and proves their dedup now knows each
    producer's last sequence id at least as far as the source's does. Returns what it checked; raises
    TargetDedupBehind naming the first producer the target knows less of."""
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
    if behind:
        topic, name, src, tgt = behind[0]
        raise TargetDedupBehind(
            f"the target's deduplication knows producer {name} on {topic} up to sequence id {tgt}, the source's up "
            f"to {src} ({len(behind)} such producer(s)): a re-send after the flip could be stored twice")
    checked = {"partitions": len(producers), "producers": len(pairs),
               "sequence_ids_known": sum(1 for pair in pairs if source[pair] >= 0),
               "seconds": round(time.monotonic() - started, 3)}
    log.info("target dedup knows every fenced producer's last sequence id: %s", checked)
    return checked
