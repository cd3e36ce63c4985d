"""The source entries a reader passed over in a range, and a chunked message among them begun before it.

The client's reader delivers a chunked message at its last chunk, and never one whose first chunk came before where
it started (it drops the rest as an "uncached chunk"). When another producer's entries came between a message's
chunks and an earlier run's bound fell inside the message, that run copied what came before its bound but not the
message, and the next run, which starts after it, never sees it: both sides' hashes leave it out. The copy engine
reads such a message's earlier chunks again; the Python path cannot, so it names the message in one line instead.

The entries the reader passed over are found from the positions it delivered (gaps in a ledger, a ledger's tail by
its entry count, up to the run's bound); only those are looked up, one entry-header read each: a chunked message's
earlier chunks, transaction markers, aborted messages.
"""

from __future__ import annotations

import bisect
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from pulsar_migration.admin import EntryUnanswered, PulsarAdmin
from pulsar_migration.positions import Position, ledger_sizes
from pulsar_migration.replication.reading import EntryGaps, ReadError, chunk_fields

log = logging.getLogger(__name__)

# Past this many entries passed over in one range the look-up is left out (and logged): each costs an admin read.
MAX_LOOKUPS = 100_000


@dataclass
class SkippedEntries:
    """Follows a reader's delivered positions after `after`; `ledgers()` gives the partition's (ledger id, entry
    count) in order, asked only when the reading crosses a ledger."""

    after: Position
    ledgers: Callable[[], list[tuple[int, int]]]
    positions: list[Position] = field(default_factory=list)
    # (first chunk, last chunk) of each chunked message delivered: the entries between are its own earlier chunks
    # or entries delivered on their own (another producer's), unless a third message's chunks came between.
    chunk_spans: list[tuple[Position, Position]] = field(default_factory=list)
    too_many: bool = False
    _last: Position | None = None
    _ledgers: list[tuple[int, int]] | None = None

    def saw(self, position: Position, first_chunk: Position | None = None) -> None:
        if first_chunk is not None:
            self.chunk_spans.append((first_chunk, position))
        last = self._last or self.after
        if position > last:
            self._pass_over(last, position)
            self._last = position

    def in_delivered_span(self) -> Callable[[Position], bool]:
        """A test of whether a position lies in a delivered chunked message's span (its first chunk up to, not
        including, its last). Spans come in order of their last chunks (delivered there): the ones reaching past a
        position are a suffix, found by bisection, whose least first chunk tells (a walk over the spans per position
        took minutes past a few thousand chunked messages)."""
        spans = self.chunk_spans
        lasts = [last for _, last in spans]
        least: list[Position] = []
        for first, _ in reversed(spans):
            least.append(first if not least or first < least[-1] else least[-1])
        least.reverse()

        def test(position: Position) -> bool:
            i = bisect.bisect_right(lasts, position)
            return i < len(spans) and least[i] <= position

        return test

    def finish(self, upper: Position) -> None:
        """The range ends at `upper` (inclusive): what lies after the last delivered entry was passed over too."""
        last = self._last or self.after
        if upper > last:
            self._pass_over(last, Position(upper.ledger, upper.entry + 1))
            self._last = upper

    def _pass_over(self, last: Position, until: Position) -> None:
        """Adds the entries strictly between `last` and `until`."""
        if last.ledger == until.ledger:
            self._add(last.ledger, last.entry + 1, until.entry)
            return
        if self._ledgers is None:
            self._ledgers = self.ledgers()
        for ledger, entries in self._ledgers:
            if ledger == last.ledger:
                self._add(ledger, last.entry + 1, entries)
            elif last.ledger < ledger < until.ledger:
                self._add(ledger, 0, entries)
            elif ledger == until.ledger:
                self._add(ledger, 0, until.entry)

    def _add(self, ledger: int, start: int, stop: int) -> None:
        if self.too_many or stop <= start:
            return
        if len(self.positions) + stop - start > MAX_LOOKUPS:
            self.too_many = True
            return
        self.positions.extend(Position(ledger, entry) for entry in range(start, stop))


@dataclass
class RestartPoints:
    """Where a reader that was moved past stored entries (reading.EntryGaps) may start again without dropping a
    chunked message: the client drops a message whose first chunk a reader did not read, so a reader started
    after the first chunk of a message it has not delivered yet loses it (another producer's entries between its
    chunks put that first chunk before the last entry taken). `passed`, fed with every entry taken, gives the
    entries passed over; those outside every delivered chunked message's span are looked up in order (once each,
    only when a reader starts again, up to the first found): the earliest first chunk among them, or one the broker
    does not show (a compressed chunk, each a 5 s wait once), is where the reader starts. A first chunk whose
    producer had a later message taken since is not waited for: a producer stores a message's chunks before its
    next message, so that one never completes (a producer killed inside it), and every restart went back to it.
    A message whose first chunk lies inside another delivered message's span is not seen here (undelivered_chunked
    names it after the read)."""

    admin: PulsarAdmin
    topic: str
    passed: SkippedEntries
    _pending: list[Position] = field(default_factory=list)  # passed over, not ruled out as a first chunk
    _seen: int = 0  # how many of passed.positions were looked at
    _firsts: dict[Position, tuple[bool, str | None]] = field(default_factory=dict)  # (may be one, its producer)
    _latest_by_producer: dict[str, Position] = field(default_factory=dict)  # the last entry taken of each

    def saw(self, position: Position, first_chunk: Position | None = None, producer: str | None = None) -> None:
        self.passed.saw(position, first_chunk)
        if producer:
            self._latest_by_producer[producer] = position

    def __call__(self, at: Position) -> Position:
        positions = self.passed.positions
        self._pending += positions[self._seen:]
        self._seen = len(positions)
        in_span = self.passed.in_delivered_span()
        kept: list[Position] = []
        earliest = at
        for i, position in enumerate(self._pending):
            if earliest != at or position >= at:
                kept += self._pending[i:]  # looked at by a later call: in order, the first found is the earliest
                break
            if in_span(position):
                continue
            first, producer = self._first_chunk(position)
            if not first or (producer is not None and self._latest_by_producer.get(producer, position) > position):
                continue
            kept.append(position)
            earliest = position
        self._pending = kept
        if earliest != at:
            log.info("%s: starting the reader again at %s, before %s: a chunked message begun there is not "
                     "delivered yet", self.topic, earliest, at)
        return earliest

    def _first_chunk(self, position: Position) -> tuple[bool, str | None]:
        """Whether the entry may be a message's first chunk, and its producer where that one is told apart (none
        for a replicated entry: a producer of the same name in another cluster is another one)."""
        if position not in self._firsts:
            try:
                headers = self.admin.entry_headers(self.topic, position.ledger, position.entry)
                chunks, chunk = chunk_fields(headers)
                producer = None if "X-Pulsar-replicated-from" in headers else headers.get("X-Pulsar-producer-name")
                self._firsts[position] = (chunks > 1 and chunk == 0, producer)
            except EntryUnanswered:
                self._firsts[position] = (True, None)  # a compressed chunk: it may be a first one
        return self._firsts[position]


def guide_restarts(admin: PulsarAdmin, topic: str, gaps: EntryGaps, after: Position) -> SkippedEntries:
    """The entries a reader with `gaps` passes over after `after`, told by the reader, which asks them where to start
    again (RestartPoints); check_chunked_delivered(..., restarted=gaps.rereads > 0) judges them after the read."""
    passed = SkippedEntries(after, functools.partial(ledger_entries, admin, topic))
    gaps.guide = RestartPoints(admin, topic, passed)
    return passed


def before_first_entry(ledgers: list[tuple[int, int]]) -> Position | None:
    """The place before a partition's first stored entry (a SkippedEntries start for a range read from its
    beginning), from its (ledger, entry count) list; None when no ledger holds an entry."""
    stored = [ledger for ledger, entries in ledgers if entries > 0]
    return Position(stored[0], -1) if stored else None


def ledger_entries(admin: PulsarAdmin, topic: str) -> list[tuple[int, int]]:
    """The partition's ledgers and their entry counts (the open ledger's so far), from its internal stats."""
    return ledger_sizes(admin.get(f"{admin.topic_path(topic)}/internalStats"))


@dataclass(frozen=True)
class Undelivered:
    """A chunked message the reader did not deliver though it should have: where its first chunk in the range is.
    `begun_before`: its chunks in the range lack its first (it began before the range); else its first and last
    chunks are both in the range, passed over (a reader started again between them dropped it)."""

    uuid: str
    position: Position
    begun_before: bool = True


def undelivered_chunked(admin: PulsarAdmin, topic: str, skipped: SkippedEntries, *, begun_before: bool = True,
                        restarted: bool = False) -> Undelivered | None:
    """The first chunked message among the entries passed over that the reader did not deliver, or None: one begun
    before the range (`begun_before`), one whose first and last chunks are both among them and that no delivered
    message starts at (`restarted`: the reader was started again inside the range). EntryUnanswered when an entry
    passed over outside a delivered chunked message's chunks cannot be read (`begun_before` only; a warning
    otherwise)."""
    if not begun_before and not restarted:
        return None
    if skipped.too_many:
        log.warning("%s: more than %d entries passed over by the reader; chunked messages it did not deliver are not "
                    "looked for", topic, MAX_LOOKUPS)
        return None
    firsts: dict[str, Position] = {}
    later: dict[str, Position] = {}
    lasts: set[str] = set()
    untold: EntryUnanswered | None = None
    in_span = skipped.in_delivered_span()
    for position in skipped.positions:
        try:
            headers = admin.entry_headers(topic, position.ledger, position.entry)
        except EntryUnanswered as exc:
            # A compressed chunk (the broker does not show one): a delivered message's own, in its span; else
            # a message's that began before the range or was dropped cannot be ruled out.
            if not in_span(position):
                untold = untold or exc
            continue
        chunks, chunk = chunk_fields(headers)
        if chunks <= 1:
            continue
        uuid = headers.get("X-Pulsar-uuid", "")
        if chunk == 0:
            firsts.setdefault(uuid, position)
        else:
            later.setdefault(uuid, position)
        if chunk == chunks - 1:
            lasts.add(uuid)
    found: list[Undelivered] = []
    if begun_before:
        # A reader started again at a message's first chunk before the range delivered that message: its chunks in
        # the range are its own, not an orphan's.
        early = [(first, last) for first, last in skipped.chunk_spans if first <= skipped.after]
        found += [Undelivered(uuid, position) for uuid, position in later.items()
                  if uuid not in firsts and not any(first <= position < last for first, last in early)]
    if restarted:
        # A last chunk passed over whose message began in the range; one stored again (a producer's resend) is
        # passed over beside a delivered copy, which starts at the same first chunk.
        delivered = {first for first, _ in skipped.chunk_spans}
        found += [Undelivered(uuid, firsts[uuid], begun_before=False) for uuid in lasts
                  if uuid in firsts and firsts[uuid] not in delivered]
    if found:
        return min(found, key=lambda u: (u.position, u.uuid))
    if untold is not None and begun_before:
        raise untold
    if untold is not None:
        # Only a message begun among another delivered one's chunks could be missed here (RestartPoints starts a
        # reader at an entry it cannot read); refusing would fail every run while a compressed message's first
        # chunks sit at the partition's end.
        log.warning("%s: entries passed over that the broker does not show (%s): a chunked message begun among "
                    "another's chunks and dropped by a reader started again is not ruled out", topic, untold)
    return None


def check_chunked_delivered(admin: PulsarAdmin, topic: str, skipped: SkippedEntries, *, begun_before: bool = True,
                            restarted: bool = False) -> None:
    """One line (ReadError) for a chunked message the Python client's reader did not deliver (undelivered_chunked):
    left out of both sides' hashes, it would be lost with verdict ok."""
    try:
        found = undelivered_chunked(admin, topic, skipped, begun_before=begun_before, restarted=restarted)
    except EntryUnanswered as exc:
        raise ReadError(f"{topic} in cluster {admin.name}: the reader passed over entries it was not given whose "
                        f"metadata the broker does not show ({exc}): whether one is a chunk of a message it did not "
                        "deliver (begun before this run's range, or dropped by a reader started again inside it) is "
                        "not known; the copy engine reads such chunks (options.copy_engine auto, with a JDK)") from exc
    if found is None:
        return
    if found.begun_before:
        raise ReadError(f"{topic} in cluster {admin.name}: the chunked message {found.uuid} (its chunks from "
                        f"{found.position} on) began before this run's range: another producer's entries came between "
                        "its chunks and an earlier run's bound fell inside it. The Python path's reader cannot read "
                        "it; the copy engine can (options.copy_engine auto, with a JDK)")
    raise ReadError(f"{topic} in cluster {admin.name}: the chunked message {found.uuid} (its chunks from "
                    f"{found.position} on) was not delivered: the reader was started again between its chunks (it was "
                    "moved past stored entries: a message TTL or an expiry) and the client drops a message whose first "
                    "chunk it did not read. A re-run reads it again; the copy engine reads such chunks "
                    "(options.copy_engine auto, with a JDK)")
