"""Time windows and the source entries they cover.

A window `[start, end)` covers, on each partition, the entries from the first one published at or after
`start` up to (not including) the first one published at or after `end`, as the broker finds them
(`GET .../messageid/{timestamp}`, the lookup behind `pulsar-admin topics get-message-id`); an entry's window
follows its position, not its own timestamp. The answer can move when an entry published before an edge is stored
after it, so the archive cuts each edge once and keeps the cut (edges.py); the cluster sink continues from its
position map instead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from pulsar_migration.admin import NotFound, PulsarAdmin, base_topic
from pulsar_migration.metadata.inventory import read_layout
from pulsar_migration.positions import Position
from pulsar_migration.spec import MigrationSpec
from pulsar_migration.stepjob import BadInput

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Window:
    start: datetime
    end: datetime

    @classmethod
    def parse(cls, start: str, end: str) -> Window:
        """From ISO instants (`2026-11-22T10:00:00+00:00`, `...Z`); naive ones are UTC. BadInput unless start < end."""
        try:
            window = cls(_instant(start), _instant(end))
        except ValueError as exc:
            raise BadInput(f"window: {exc}") from None
        if window.start >= window.end:
            raise BadInput(f"window: --start {start} is not before --end {end}")
        return window

    @property
    def start_ms(self) -> int:
        return int(self.start.timestamp() * 1000)

    @property
    def end_ms(self) -> int:
        return int(self.end.timestamp() * 1000)

    @property
    def label(self) -> str:
        """`20261122T100000Z-20261122T110000Z` (start and end, to the second; milliseconds when a window has them):
        the archive's `window=` partition and the report's name for it. Both edges: a window of the same start and
        another end (a half hour within an archived hour) is another window, not a rewrite of it."""
        return f"{_stamp(self.start)}-{_stamp(self.end)}"

    def __str__(self) -> str:
        return f"[{self.start.isoformat()}, {self.end.isoformat()})"


def _stamp(instant: datetime) -> str:
    millis = instant.microsecond // 1000
    return instant.strftime("%Y%m%dT%H%M%S") + (f".{millis:03d}Z" if millis else "Z")


def _instant(text: str) -> datetime:
    value = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC)


@dataclass(frozen=True)
class WindowRange:
    """One partition's entries of a window: `first` inclusive up to `upper` inclusive (None: no entries)."""

    topic: str  # persistent://t/ns/name[-partition-N]
    local: str  # ns/name
    partition: int
    first: Position | None
    upper: Position | None

    @property
    def empty(self) -> bool:
        return self.first is None or self.upper is None or self.upper < self.first

    @property
    def base_topic(self) -> str:
        return base_topic(self.topic, self.partition)


def first_at_or_after(admin: PulsarAdmin, topic: str, timestamp_ms: int) -> Position:
    """The first entry published at or after the instant; past the last entry when there is none (the broker
    answers with the position the next entry would take)."""
    found = admin.get(f"{admin.topic_path(topic)}/messageid/{max(timestamp_ms, 0)}")
    return Position(int(found["ledgerId"]), int(found["entryId"]))


def entry_before(admin: PulsarAdmin, topic: str, position: Position) -> Position | None:
    """The entry just before `position` (None: there is none). Within a ledger that is entry - 1; at a
    ledger's first entry it is the last entry of the closest earlier ledger that holds any."""
    if position.entry > 0:
        return Position(position.ledger, position.entry - 1)
    ledgers = admin.get(f"{admin.topic_path(topic)}/internalStats").get("ledgers") or []
    earlier = [(int(lg["ledgerId"]), int(lg.get("entries") or 0)) for lg in ledgers
               if int(lg["ledgerId"]) < position.ledger and int(lg.get("entries") or 0) > 0]
    if not earlier:
        return None
    ledger, entries = max(earlier)
    return Position(ledger, entries - 1)


def window_range(admin: PulsarAdmin, topic: str, local: str, partition: int, window: Window) -> WindowRange:
    """The partition's entries of the window, bounded by the partition's last entry now."""
    last = admin.last_entry(topic)
    if last is None:
        return WindowRange(topic, local, partition, None, None)
    first = first_at_or_after(admin, topic, window.start_ms)
    end = first_at_or_after(admin, topic, window.end_ms)
    if first > last or end <= first:
        return WindowRange(topic, local, partition, None, None)
    # end > first, so an entry before `end` exists
    upper = last if end > last else entry_before(admin, topic, end)
    return WindowRange(topic, local, partition, first, upper)


def source_partitions(spec: MigrationSpec, admin: PulsarAdmin) -> list[tuple[str, str, int]]:
    """(partition topic, `ns/name`, index) of every selected persistent topic of the tenant on the source."""
    layout = read_layout(admin, spec, must_exist=True)
    out: list[tuple[str, str, int]] = []
    for ref in layout.topics:
        name = f"persistent://{spec.tenant}/{ref.namespace}/{ref.topic}"
        if not ref.partitioned:
            out.append((name, ref.local, -1))
            continue
        try:
            count = int(admin.get(f"{admin.topic_path(name)}/partitions")["partitions"])
        except NotFound:
            continue  # deleted since the layout was read
        out += [(f"{name}-partition-{i}", ref.local, i) for i in range(count)]
    return sorted(out, key=lambda item: (item[1], item[2]))
