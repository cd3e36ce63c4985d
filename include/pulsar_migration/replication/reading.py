"""Reading one partition's range with a Reader (no subscription is created, nothing is acknowledged)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from pulsar_migration.positions import MessageIdInfo, Position

log = logging.getLogger(__name__)

READ_POLL_MS = 500
# A reader that keeps saying "more is available" without delivering anything is stuck (e.g. the topic
# was deleted under it): give up after this long.
STALL_LIMIT_S = 60.0
# How long a reader's "no more" must hold before an expected end is reached (a reconnect takes well under it).
END_CONFIRM_S = 10.0
RETRY_PAUSE_S = 0.2
RECEIVER_QUEUE = 2000
# The client names a reader's subscription "<prefix>-reader-<random>"; the engine's are "pm-copy-reader-<hex>".
READER_ROLE_PREFIX = "pm-copy"


class ReadError(RuntimeError):
    """Reading a partition failed; the message is one line naming the topic."""


class RestartGuide(Protocol):
    """Told every entry a reader took; tells where a reader starting again at a place must start instead
    (replication.skipped.RestartPoints)."""

    def saw(self, position: Position, first_chunk: Position | None = None, producer: str | None = None) -> None: ...

    def __call__(self, at: Position) -> Position: ...


@dataclass
class EntryGaps:
    """Catches a reader moved past stored entries under the copy. A source with a message TTL expires every
    subscription's cursor, a reader's included: the broker's expiry check (every
    `messageExpiryCheckIntervalInMinutes`, 5 by default) marks a reader's cursor past each message older than the
    TTL and the reader goes on after them. A copy behind such messages then had a hole in the middle of its range,
    left out of both sides' hashes: verdict ok, messages every new reader of the source still gets missing on the
    target (shown with 40,000 messages: 30,000 arrived).

    An operator's expiry of every subscription of a topic (`topics expire-messages-all-subscriptions`) moves them
    the same way on any topic, so every partition is watched (source_ttl.reader_guards).

    `ledgers`: the partition's (ledger, entry count) when the run started (its range ends inside them). An entry
    delivered past the one stored next is read again from the last one taken, by a new reader; where the broker
    skips the same entries again (a transaction marker, an aborted message) they are passed over. Up to
    `tolerance` stored entries passed over are let go without reading again (a marker's entry, where markers can be
    stored: source_ttl). `rereads` counts the readings again."""

    ledgers: list[tuple[int, int]]
    first: Position | None = None  # where a range read from its start begins (None: the first stored entry)
    tolerance: int = 0
    rereads: int = 0
    confirmed: tuple[Position | None, Position] | None = None
    # Where entries can be looked up: keeps a reader started again from dropping a chunked message begun before.
    guide: RestartGuide | None = None

    def stored_after(self, last: Position | None) -> Position | None:
        """The entry stored next after `last` (`first`, else the first stored one, for None); None past the
        ledgers known."""
        if last is None and self.first is not None:
            return self.first
        for ledger, entries in self.ledgers:
            if entries <= 0 or (last is not None and ledger < last.ledger):
                continue
            if last is None or ledger > last.ledger:
                return Position(ledger, 0)
            if last.entry + 1 < entries:
                return Position(ledger, last.entry + 1)
        return None

    def stored_between(self, last: Position | None, position: Position) -> int:
        """How many stored entries lie after `last` (from `first`, else the first stored one, for None) and before
        `position`."""
        start = self.first if last is None else Position(last.ledger, last.entry + 1)
        count = 0
        for ledger, entries in self.ledgers:
            if entries <= 0 or (start is not None and ledger < start.ledger):
                continue
            if ledger > position.ledger:
                break
            begin = start.entry if start is not None and ledger == start.ledger else 0
            end = min(position.entry, entries) if ledger == position.ledger else entries
            count += max(0, end - begin)
        return count

    def follows(self, last: Position | None, position: Position) -> bool:
        """Whether the entry at `position` may be taken after `last`; False: read again from `last` (counted)."""
        expected = self.stored_after(last)
        if expected is None or position <= expected or self.confirmed == (last, position):
            return True
        if self.tolerance and self.stored_between(last, position) <= self.tolerance:
            return True
        log.warning("reader moved past stored entries: %s came after %s where %s is stored (a message TTL or an "
                    "expiry of every subscription moving the reader's cursor?); reading again from there",
                    position, last, expected)
        self.confirmed = (last, position)
        self.rereads += 1
        return False


def chunk_fields(headers: dict[str, str]) -> tuple[int, int]:
    """(chunk count, chunk id) of an entry from its admin entry headers; (0, -1) for an entry not chunked."""
    return (int(headers.get("X-Pulsar-num-chunks-from-msg", "0") or 0),
            int(headers.get("X-Pulsar-chunk-id", "-1") or -1))


def read_range(client: Any, topic: str, after: Position | None, until: Position | None = None,
               *, inclusive_start: Position | None = None,
               expect_end: Position | None = None, cluster: str | None = None,
               rest_undeliverable: Callable[[Position, bool], bool] | None = None,
               gaps: EntryGaps | None = None) -> Iterator[tuple[Any, MessageIdInfo]]:
    """Messages of `topic` whose entry is > `after` and <= `until` (None: up to the end the broker
    reports when the reader runs dry), in order, with their parsed ids.

    The reader starts at `after`'s entry inclusive and drops what is <= `after` itself: a start
    *after* a batched entry is not expressible by position alone. `inclusive_start` starts earlier.

    A reader whose connection was just cut can say "no more" too early and deliver a message again after it
    reconnects. So a message at or before one already read is dropped, and "no more" is believed before an
    entry at or past `expect_end` (default `until`) was read only once it has held for END_CONFIRM_S; then
    the range ends there and the caller's counts and hashes judge it. `rest_undeliverable(p, waited)` (asked once
    per place) may end it at once: nothing after `p` up to the end is an entry a reader is given (a source range
    ending in a transaction marker waited out END_CONFIRM_S otherwise); `waited`: the reader was given nothing for
    END_CONFIRM_S while the broker counted more (asked then as well: chunks of a message whose last chunk is not
    stored are counted and never given). `gaps` (a source with a message TTL)
    reads again where the reader was moved past stored entries. Errors name `cluster` when given.
    """
    import pulsar

    start_at = inclusive_start or after
    end = expect_end if expect_end is not None else until
    where = f"{topic} in cluster {cluster}" if cluster else topic

    def open_reader(at: Position | None) -> Any:
        start = pulsar.MessageId(-1, at.ledger, at.entry, -1) if at else pulsar.MessageId.earliest
        try:
            # An encrypted message is delivered as stored (the client holds no keys) and refused below in one line:
            # the default action kept it from the reader, which waited out STALL_LIMIT_S and blamed a stall.
            return client.create_reader(topic, start, start_message_id_inclusive=True,
                                        receiver_queue_size=RECEIVER_QUEUE,
                                        # "pm-copy-reader-<random>", as the engine names its readers: what
                                        # a source entry filter can let through (replication.entry_filters)
                                        subscription_role_prefix=READER_ROLE_PREFIX,
                                        crypto_failure_action=pulsar.ConsumerCryptoFailureAction.CONSUME)
        except Exception as exc:
            raise ReadError(f"cannot read {where}: {exc}") from exc

    reader = open_reader(start_at)
    taken: Position | None = after  # the last entry whose messages were taken (gaps)
    try:
        stalled_since: float | None = None
        dry_since: float | None = None
        failing_since: float | None = None
        last_read: tuple[int, int, int] | None = None
        previous: MessageIdInfo | None = None
        asked: set[tuple[Position, bool]] = set()
        untold = ""  # why what follows the last read could not be told (for the stall's error)

        def nothing_deliverable_after(read_to: Position | None, waited: bool) -> bool:
            """rest_undeliverable, asked once per place (and once more after the reader waited END_CONFIRM_S)."""
            nonlocal untold
            if rest_undeliverable is None or read_to is None or (read_to, waited) in asked:
                return False
            asked.add((read_to, waited))
            try:
                return rest_undeliverable(read_to, waited)
            except Exception as exc:  # unanswered: the reader's "no more" is confirmed by waiting instead
                log.debug("%s: cannot tell what follows %s", topic, read_to, exc_info=True)
                untold = f"; what follows it is not known: {exc}"
                return False

        while True:
            # Asked before every read, not after a timed-out one: the client answers from the broker's last
            # id it has cached while that is ahead, so only the end costs a round trip, never a poll wait.
            try:
                more = bool(reader.has_message_available())
                failing_since = None
            except Exception as exc:  # e.g. NotConnected while the client reconnects: bounded retry
                failing_since = failing_since or time.monotonic()
                if time.monotonic() - failing_since > END_CONFIRM_S:
                    raise ReadError(f"reading {where} failed: {exc}") from exc
                time.sleep(RETRY_PAUSE_S)
                continue
            if not more:
                if end is None or (last_read is not None and Position(*last_read[:2]) >= end):
                    return
                if nothing_deliverable_after(Position(*last_read[:2]) if last_read is not None else after, False):
                    return
                dry_since = dry_since or time.monotonic()
                if time.monotonic() - dry_since > END_CONFIRM_S:
                    log.warning("%s: the reader found nothing after %s for %.0fs though the range ends at %s",
                                topic, last_read, END_CONFIRM_S, end)
                    return
            try:
                message = reader.read_next(READ_POLL_MS)
            except pulsar.Timeout:
                if more:
                    stalled_since = stalled_since or time.monotonic()
                    # Entries the broker counts but never delivers end the range too: the first chunks of a
                    # message whose last chunk is not stored (a producer stopped inside it, or still sending it).
                    if end is not None and time.monotonic() - stalled_since > END_CONFIRM_S and \
                            nothing_deliverable_after(Position(*last_read[:2]) if last_read is not None else after,
                                                      True):
                        return
                    if time.monotonic() - stalled_since > STALL_LIMIT_S:
                        at = f" after {Position(*last_read[:2])}" if last_read is not None else ""
                        raise ReadError(f"reading {where} stalled{at} for {STALL_LIMIT_S:.0f}s{untold}") from None
                continue
            except Exception as exc:
                raise ReadError(f"reading {where} failed: {exc}") from exc
            stalled_since = dry_since = None
            info = MessageIdInfo.of(message.message_id(), previous)
            previous = info
            read_id = (info.ledger, info.entry, info.batch_index)
            if last_read is not None and read_id <= last_read:
                continue  # delivered again after a reconnect
            position = info.position
            if gaps is not None and position != taken and (after is None or position > after) \
                    and not gaps.follows(taken, position):
                try:
                    reader.close()
                except Exception:  # the new reader reads on regardless
                    log.debug("closing reader of %s failed", topic, exc_info=True)
                # What was taken again is dropped below (last_read). A chunked message is read again from its first
                # chunk: with another producer's entries between its chunks (taken past that chunk), a reader
                # started at `taken` got its later chunks only and dropped it, silently.
                at = restart_at(taken or start_at, info.first_chunk)
                reader = open_reader(gaps.guide(at) if at is not None and gaps.guide is not None else at)
                previous = None
                continue
            last_read = read_id
            if after is not None and position <= after:
                continue
            if until is not None and position > until:
                return
            taken = position
            if gaps is not None and gaps.guide is not None:
                gaps.guide.saw(position, info.first_chunk, message.producer_name())
            if message._message.encryption_context() is not None:
                raise ReadError(encrypted_line(where, position))
            yield message, info
    finally:
        try:
            reader.close()
        except Exception:  # closing a reader of a deleted topic may fail; the result is already known
            log.debug("closing reader of %s failed", topic, exc_info=True)


def restart_at(at: Position | None, first_chunk: Position | None) -> Position | None:
    """Where a reader starts again after a gap: `at`, or the first chunk of the chunked message delivered past the
    gap where that lies before it (None: the topic's first entry)."""
    if at is None or first_chunk is None:
        return at
    return min(at, first_chunk)


def encrypted_line(where: str, position: Position) -> str:
    return (f"entry {position} of {where} is end-to-end encrypted: this tool cannot copy or verify encrypted "
            "messages without their keys; leave the topic out (the spec's topics.exclude) and move it another way")
