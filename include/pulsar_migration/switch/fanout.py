"""Per-partition admin calls in threads, for the phases that run while clients wait."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pulsar_migration.admin import PulsarAdmin

FENCE_THREADS = 64


def each_partition(admin: PulsarAdmin, partitions: list[str], read: Any) -> list[Any]:
    """`read(admin, topic)` for every partition, in threads: the fence and the quiet check run while clients
    wait, and a hundred sequential admin calls would cost seconds."""
    with ThreadPoolExecutor(max(1, min(len(partitions), FENCE_THREADS))) as pool:
        return list(pool.map(lambda topic: read(admin, topic), partitions))
