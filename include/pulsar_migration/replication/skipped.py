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

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from pulsar_migration.admin import EntryUnanswered, PulsarAdmin
from pulsar_migration.positions import Position, ledger_sizes
from pulsar_migration.replication.reading import chunk_fields

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


def ledger_entries(admin: PulsarAdmin, topic: str) -> list[tuple[int, int]]:
    """The partition's ledgers and their entry counts (the open ledger's so far), from its internal stats."""
    return ledger_sizes(admin.get(f"{admin.topic_path(topic)}/internalStats"))


@dataclass(frozen=True)
class BegunBefore:
    """A chunked message whose chunks in the range lack its first: where its first chunk in the range is."""

    uuid: str
    position: Position


def begun_before(admin: PulsarAdmin, topic: str, skipped: SkippedEntries) -> BegunBefore | None:
    """The first chunked message among the entries passed over that has no first chunk in the range, or None.
    EntryUnanswered when an entry passed over outside a delivered chunked message's chunks cannot be read."""
    if skipped.too_many:
        log.warning("%s: more than %d entries passed over by the reader; chunked messages begun before the range "
                    "are not looked for", topic, MAX_LOOKUPS)
        return None
    firsts: set[str] = set()
    later: dict[str, Position] = {}
    untold: EntryUnanswered | None = None
    for position in skipped.positions:
        try:
            headers = admin.entry_headers(topic, position.ledger, position.entry)
        except EntryUnanswered as exc:
            # A compressed chunk (the broker does not show one): a delivered message's own, in its span; else
            # a message's that began before the range cannot be ruled out.
            if not any(first <= position < last for first, last in skipped.chunk_spans):
                untold = untold or exc
            continue
        chunks, chunk = chunk_fields(headers)
        if chunks <= 1:
            continue
        uuid = headers.get("X-Pulsar-uuid", "")
        if chunk == 0:
            firsts.add(uuid)
        else:
            later.setdefault(uuid, position)
    orphans = sorted((position, uuid) for uuid, position in later.items() if uuid not in firsts)
    if orphans:
        return BegunBefore(orphans[0][1], orphans[0][0])
    if untold is not None:
        raise untold
    return None
