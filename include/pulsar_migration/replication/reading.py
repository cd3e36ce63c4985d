"""Reading one partition's range with a Reader (no subscription is created, nothing is acknowledged)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from pulsar_migration.positions import MessageIdInfo, Position

log = logging.getLogger(__name__)

READ_POLL_MS = 500
# A reader that keeps saying "more is available" without delivering anything is stuck (e.g. the topic
# was deleted under it): give up after this long.
STALL_LIMIT_S = 60.0
RECEIVER_QUEUE = 2000


class ReadError(RuntimeError):
    """Reading a partition failed; the message is one line naming the topic."""


def read_range(client: Any, topic: str, after: Position | None, until: Position | None = None,
               *, inclusive_start: Position | None = None) -> Iterator[tuple[Any, MessageIdInfo]]:
    """Messages of `topic` whose entry is > `after` and <= `until` (None: up to the end the broker
    reports when the reader runs dry), in order, with their parsed ids.

    The reader starts at `after`'s entry inclusive and drops what is <= `after` itself: a start
    *after* a batched entry is not expressible by position alone. `inclusive_start` starts earlier.
    """
    import pulsar

    start_at = inclusive_start or after
    start = pulsar.MessageId(-1, start_at.ledger, start_at.entry, -1) if start_at else pulsar.MessageId.earliest
    try:
        reader = client.create_reader(topic, start, start_message_id_inclusive=True,
                                      receiver_queue_size=RECEIVER_QUEUE)
    except Exception as exc:
        raise ReadError(f"cannot read {topic}: {exc}") from exc
    try:
        stalled_since: float | None = None
        while True:
            # Asked before every read, not after a timed-out one: the client answers from the broker's last
            # id it has cached while that is ahead, so only the end costs a round trip, never a poll wait.
            if not _more_available(reader, topic):
                return
            try:
                message = reader.read_next(READ_POLL_MS)
            except pulsar.Timeout:
                stalled_since = stalled_since or time.monotonic()
                if time.monotonic() - stalled_since > STALL_LIMIT_S:
                    raise ReadError(f"reading {topic} stalled for {STALL_LIMIT_S:.0f}s") from None
                continue
            except Exception as exc:
                raise ReadError(f"reading {topic} failed: {exc}") from exc
            stalled_since = None
            info = MessageIdInfo.of(message.message_id())
            position = info.position
            if after is not None and position <= after:
                continue
            if until is not None and position > until:
                return
            yield message, info
    finally:
        try:
            reader.close()
        except Exception:  # closing a reader of a deleted topic may fail; the result is already known
            log.debug("closing reader of %s failed", topic, exc_info=True)


def _more_available(reader: Any, topic: str) -> bool:
    try:
        return bool(reader.has_message_available())
    except Exception as exc:
        raise ReadError(f"reading {topic} failed: {exc}") from exc
