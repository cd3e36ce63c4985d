"""The archive's window edges: where, on each partition, an instant cuts the entries, decided once and kept.

The broker finds "the first entry published at or after T" by the entries it holds when asked. Two windows that
share the edge T ask at different times (an hour apart, or a re-run days later), and the answer moves when an
entry published before T is stored after it (a producer re-sending after a reconnect, a producer whose clock is
behind): that entry then fell between the windows (in neither) or in both. So the first window to reach an edge
records each partition's cut under `_edges/tenant=<t>/<T>.json` in the archive (Spark and pyarrow skip `_` paths),
and every later window (the one on its other side, a re-run) cuts there. A window holds the entries from its start
edge's cut up to, not including, its end edge's cut: consecutive windows meet at one entry whenever they run.
A partition no edge knows yet (new since) is cut when first asked, and added.
"""

from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from pulsar_migration import rundir
from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.backfill.window import Window, WindowRange, entry_before, first_at_or_after
from pulsar_migration.positions import Position

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

EDGES_DIR = "_edges"
BEFORE_EVERYTHING = Position(-1, -1)  # the cut of a partition that held nothing yet: all its entries come after


def edge_name(instant_ms: int) -> str:
    return datetime.fromtimestamp(instant_ms / 1000, UTC).strftime("%Y%m%dT%H%M%S") + f"{instant_ms % 1000:03d}Z.json"


def cut_now(admin: PulsarAdmin, topic: str, instant_ms: int) -> Position:
    """Where `instant_ms` cuts the partition's entries now: the first entry published at or after it (the position
    the next entry takes when there is none yet)."""
    if admin.last_entry(topic) is None:
        return BEFORE_EVERYTHING
    return first_at_or_after(admin, topic, instant_ms)


def cuts(admin: PulsarAdmin, archive: str, tenant: str, instant_ms: int, partitions: list[str], *,
         concurrency: int, record: bool, spark: SparkSession | None = None) -> dict[str, Position]:
    """Each partition's cut at the edge: as recorded, else found now (and recorded unless `record` is false)."""
    directory = rundir.join(archive, f"{EDGES_DIR}/tenant={tenant}")
    name = edge_name(instant_ms)
    recorded: dict[str, Position] = {}
    if rundir.exists(directory, name, spark):
        recorded = {topic: Position.parse(at) for topic, at in
                    json.loads(rundir.read_text(directory, name, spark)).items()}
    missing = [p for p in partitions if p not in recorded]
    if missing:
        with ThreadPoolExecutor(max(1, min(concurrency, len(missing)))) as pool:
            found = dict(zip(missing, pool.map(lambda t: cut_now(admin, t, instant_ms), missing), strict=True))
        recorded.update(found)
        if record:
            rundir.ensure_dir(directory, spark)
            rundir.write_text(directory, name, json.dumps({t: str(p) for t, p in sorted(recorded.items())},
                                                          indent=1), spark)
            log.info("edge %s: %d partition cut(s) recorded", name, len(found))
    return {p: recorded[p] for p in partitions}


def entry_at_or_after(admin: PulsarAdmin, topic: str, cut: Position, last: Position) -> Position | None:
    """The first entry the partition holds at or after `cut` (None: none up to `last`, its last entry now)."""
    if cut > last:
        return None
    if cut.ledger == last.ledger:
        return Position(cut.ledger, max(cut.entry, 0))
    ledgers = admin.get(f"{admin.topic_path(topic)}/internalStats").get("ledgers") or []
    held = [(int(lg["ledgerId"]), int(lg.get("entries") or 0)) for lg in ledgers]
    for ledger, entries in sorted(held):
        if ledger == cut.ledger and entries > max(cut.entry, 0):
            return Position(ledger, max(cut.entry, 0))
        if ledger > cut.ledger and (entries > 0 or ledger == last.ledger):
            return Position(ledger, 0)
    return Position(last.ledger, 0)


def window_range_at(admin: PulsarAdmin, topic: str, local: str, partition: int, start: Position,
                    end: Position) -> WindowRange:
    """The partition's entries from the `start` cut up to, not including, the `end` cut, bounded by its last entry
    now."""
    last = admin.last_entry(topic)
    if last is None:
        return WindowRange(topic, local, partition, None, None)
    first = entry_at_or_after(admin, topic, start, last)
    if first is None or end <= first:
        return WindowRange(topic, local, partition, None, None)
    upper = last if end > last else entry_before(admin, topic, end)
    return WindowRange(topic, local, partition, first, upper)


def archive_ranges(admin: PulsarAdmin, archive: str, tenant: str, window: Window,
                   partitions: list[tuple[str, str, int]], *, concurrency: int, record: bool,
                   spark: SparkSession | None = None) -> list[WindowRange]:
    """The window's range on each partition, cut at its two edges' recorded cuts."""
    topics = [p[0] for p in partitions]
    starts = cuts(admin, archive, tenant, window.start_ms, topics, concurrency=concurrency, record=record,
                  spark=spark)
    ends = cuts(admin, archive, tenant, window.end_ms, topics, concurrency=concurrency, record=record, spark=spark)
    with ThreadPoolExecutor(max(1, min(concurrency, len(partitions)))) as pool:
        return list(pool.map(lambda p: window_range_at(admin, *p, starts[p[0]], ends[p[0]]), partitions))
