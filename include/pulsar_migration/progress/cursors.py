"""Subscription cursors as the admin API shows them: which durable subscriptions a partition has, and for
each its markDeletePosition and individually acknowledged ranges (`internalStats`), type, consumers and
backlog (`stats`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_plus

from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.metadata.resources import is_system_cursor
from pulsar_migration.positions import AckRange, Position, parse_ack_ranges

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CursorState:
    """One durable subscription of one partition, at `read_at_ms`."""

    topic: str
    subscription: str
    mark_delete: Position
    ranges: tuple[AckRange, ...]
    sub_type: str  # the dispatcher type the broker reports (the last consumers' type; "None" before any)
    consumers: int
    backlog: int  # the broker's msgBacklog (messages; approximate for batches)
    read_at_ms: int

    @property
    def acked_after_mark_delete(self) -> int:
        return sum(len(r.entries) for r in self.ranges)


def read_cursors(admin: PulsarAdmin, topic: str, stats: dict[str, Any] | None = None) -> dict[str, CursorState]:
    """The durable, non-system subscriptions of one partition (non-partitioned topic or `-partition-N`).
    Stats first (the list of durable subscriptions; `stats` when already read), then internalStats (the cursor
    positions): acks that land between the two reads are in the cursor state, which is what the sync
    translates."""
    path = admin.topic_path(topic)
    stats = stats if stats is not None else admin.get(f"{path}/stats")
    internal = admin.get(f"{path}/internalStats")
    return cursor_states(topic, stats, internal, int(time.time() * 1000))


def cursor_states(topic: str, stats: dict[str, Any], internal: dict[str, Any],
                  read_at_ms: int) -> dict[str, CursorState]:
    """read_cursors over stats and internalStats already read."""
    # internalStats names each cursor as the managed ledger stores it, URL-encoded: subscription 'a+b' is cursor
    # 'a%2Bb', 'sp ace' is 'sp+ace'. Matched by the stored name, such subscriptions were silently left out.
    cursors = {unquote_plus(name): cursor for name, cursor in (internal.get("cursors") or {}).items()}
    states = {}
    for name, sub in sorted((stats.get("subscriptions") or {}).items()):
        if is_system_cursor(name) or not sub.get("isDurable", True) or name not in cursors:
            continue
        states[name] = cursor_state(topic, name, cursors[name], sub, read_at_ms)
    return states


def cursor_state(topic: str, name: str, cursor: dict[str, Any], sub_stats: dict[str, Any],
                 read_at_ms: int) -> CursorState:
    return CursorState(
        topic=topic, subscription=name, mark_delete=Position.parse(cursor["markDeletePosition"]),
        ranges=tuple(parse_ack_ranges(cursor.get("individuallyDeletedMessages"))),
        sub_type=str(sub_stats.get("type") or "None"), consumers=len(sub_stats.get("consumers") or []),
        backlog=int(sub_stats.get("msgBacklog") or 0), read_at_ms=read_at_ms)


def note_target_only(report: Any, source: Iterable[CursorState], target: Iterable[CursorState]) -> None:
    """Subscriptions the target has on a partition whose source lacks them (deleted or expired there since
    sync_metadata created them, or the target's own): counted and named in the report, left as they are. After the
    switch a client subscribing under such a name gets the target cursor's backlog, where the source would have
    created the subscription afresh; the operator deletes them (`pulsar-admin topics unsubscribe`) or keeps them."""
    had = {(s.topic, s.subscription) for s in source}
    only = sorted({(s.topic, s.subscription) for s in target} - had)
    report.counts["target_only_subscriptions"] = len(only)
    if only:
        report.details["target_only_subscriptions"] = [{"topic": t, "subscription": n} for t, n in only[:100]]
        log.warning("%d subscription(s) on the target the source does not have (first: %s on %s): left as they are",
                    len(only), only[0][1], only[0][0])
