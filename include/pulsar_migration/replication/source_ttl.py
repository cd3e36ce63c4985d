"""The message TTL in force on source topics (topic, else namespace, else the broker's default): where it is set,
the broker's expiry check moves every cursor past messages older than it, the copy's readers' included, and a
copy reads those partitions with reading.EntryGaps (the engine: EntryCopy.Gaps)."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

from pulsar_migration.admin import PulsarAdmin

log = logging.getLogger(__name__)

UNKNOWN = -1  # the TTL could not be read: the partition is read as if one were set


def applied_ttls(admin: PulsarAdmin, topics: list[str], concurrency: int) -> dict[str, int]:
    """Each topic's applied message TTL in seconds (0: none; UNKNOWN when it could not be read), one call each."""
    def one(topic: str) -> tuple[str, int]:
        try:
            return topic, int(admin.get(f"{admin.topic_path(topic)}/messageTTL", params={"applied": "true"}) or 0)
        except Exception:  # read as if set: the guard costs one internalStats call and a reader per gap
            log.debug("%s: message TTL unknown", topic, exc_info=True)
            return topic, UNKNOWN

    if not topics:
        return {}
    with ThreadPoolExecutor(max(1, min(concurrency, len(topics)))) as pool:
        return dict(pool.map(one, topics))
