"""One read of every selected partition on both clusters, taken by the cutover right after its fence and
handed to the final delta, the final sync and the quiet check.

While the tenant is held and its source namespaces are unloaded, nothing moves a source partition (the quiet
check proves it afterwards) and nothing but the cutover itself writes a target partition. So one read per
partition and side (stats, last message id, internalStats) serves every phase that clients wait for, where
each phase used to read the same things again: on two cores shared with both brokers every admin call is
broker CPU taken from the hold.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.positions import Position

READ_THREADS = 64


@dataclass(frozen=True)
class PartitionState:
    """One partition as the admin API showed it: `stats` first, then the last entry, then `internalStats`
    (acks that land between the reads are in the cursors, which is what a sync translates)."""

    last: Position | None  # the entry of the last message (None: the partition holds none)
    stats: dict[str, Any]
    internal: dict[str, Any]
    read_at_ms: int

    @property
    def ledgers(self) -> set[int]:
        return {int(ledger["ledgerId"]) for ledger in self.internal.get("ledgers") or []}

    @property
    def deduplicating(self) -> bool:
        return self.stats.get("deduplicationStatus") == "Enabled"


@dataclass(frozen=True)
class FenceSnapshot:
    source: dict[str, PartitionState]
    target: dict[str, PartitionState]

    @property
    def uppers(self) -> dict[str, Position | None]:
        """Each source partition's last entry: the final delta's bound."""
        return {topic: state.last for topic, state in self.source.items()}


def read_partition(admin: PulsarAdmin, topic: str, stats: dict[str, Any] | None = None) -> PartitionState:
    path = admin.topic_path(topic)
    stats = stats if stats is not None else admin.get(f"{path}/stats")
    last = admin.last_entry(topic)
    internal = admin.get(f"{path}/internalStats")
    return PartitionState(last, stats, internal, int(time.time() * 1000))


def read_side(admin: PulsarAdmin, partitions: list[str],
              stats: dict[str, dict[str, Any]] | None = None) -> dict[str, PartitionState]:
    """Every partition of one cluster, in threads; `stats` already read (the fence's last poll) are reused."""
    known = stats or {}
    with ThreadPoolExecutor(max(1, min(len(partitions), READ_THREADS))) as pool:
        states = pool.map(lambda topic: read_partition(admin, topic, known.get(topic)), partitions)
        return dict(zip(partitions, states, strict=True))
