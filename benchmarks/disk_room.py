"""Whether the local clusters' disk has room for a benchmark's data, checked before anything is written.

A bookie stops taking writes when its disk passes 95% use (BookKeeper's default diskUsageThreshold): a benchmark
that fills the disk half-way fails with "Not enough non-faulty bookies available" and leaves its figures useless.
Measured on 2026-11-27: one 768 MB run of the six data sets with raw, geo, copy and bare added 44 GB to the two
local clusters, about 9.5x the payload; each method writes the payload once more on a cluster, and every write goes
to both the bookie's journal and its entry log.
"""

from __future__ import annotations

import shutil
from pathlib import Path

# Every byte a bookie takes is written twice: to its journal and to its entry log.
COPIES_PER_WRITE = 2
# Left free below the bookies' 95% threshold, for everything else on a shared disk.
MAX_USE = 0.90
GB = 1e9


def bytes_needed(payload_bytes: int, methods: int) -> int:
    """About what a run writes to the local clusters' disk for `payload_bytes` of messages and `methods` methods: the
    source data and each method's copy of it (1 + methods), each written twice."""
    return int(payload_bytes * (1 + methods) * COPIES_PER_WRITE)


def shortage(path: Path, needed: int) -> str | None:
    """Why the disk holding `path` lacks room for `needed` more bytes (one line), or None when it has it."""
    existing = next(p for p in (path, *path.parents) if p.exists())  # the clusters may not have started yet
    usage = shutil.disk_usage(existing)
    # As the bookie's DiskChecker counts use: 1 - usable/total (on a shared or reserved disk more than `used`).
    room = usage.free - (1 - MAX_USE) * usage.total
    if needed <= room:
        return None
    return (f"the run needs about {needed / GB:.1f} GB on the disk of {path} and only "
            f"{max(0.0, room) / GB:.1f} GB are left below {MAX_USE:.0%} use "
            f"({usage.free / GB:.1f} GB free; bookies stop writing at 95%): `make clusters-reset` drops old test and "
            "benchmark data, or use a smaller --mb")
