"""replication.skipped: the entries a reader passed over, from the positions it delivered, and a chunked message
among them begun before the range (what the Python path's reader never delivers)."""

from __future__ import annotations

import pytest
from pulsar_migration.admin import EntryUnanswered
from pulsar_migration.positions import Position
from pulsar_migration.replication import skipped
from pulsar_migration.replication.skipped import SkippedEntries, Undelivered, undelivered_chunked


def follow(after: Position, delivered: list[Position], upper: Position,
           ledgers: list[tuple[int, int]] | None = None) -> SkippedEntries:
    asked = []

    def read_ledgers() -> list[tuple[int, int]]:
        asked.append(1)
        assert ledgers is not None, "ledgers asked for within one ledger"
        return ledgers

    entries = SkippedEntries(after, read_ledgers)
    for position in delivered:
        entries.saw(position)
    entries.finish(upper)
    assert len(asked) <= 1
    return entries


def test_gaps_in_one_ledger_and_the_tail_up_to_the_bound_need_no_ledger_list() -> None:
    p = Position
    found = follow(p(5, 2), [p(5, 3), p(5, 3), p(5, 6)], p(5, 8))  # a batch's messages repeat a position
    assert found.positions == [p(5, 4), p(5, 5), p(5, 7), p(5, 8)]
    assert follow(p(5, 2), [p(5, 3), p(5, 4)], p(5, 4)).positions == []


def test_crossing_ledgers_takes_each_ones_tail_and_head_from_its_entry_count() -> None:
    p = Position
    ledgers = [(3, 50), (5, 10), (9, 4), (12, 7)]
    found = follow(p(5, 8), [p(9, 2)], p(12, 1), ledgers)
    assert found.positions == [p(5, 9), p(9, 0), p(9, 1), p(9, 3), p(12, 0), p(12, 1)]


def test_past_the_lookup_bound_nothing_is_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(skipped, "MAX_LOOKUPS", 3)
    found = follow(Position(5, 0), [Position(5, 9)], Position(5, 9))
    assert found.too_many and found.positions == []


class Headers:
    """Entry headers by position, as the admin API gives them (a unit test of the parsing only)."""

    def __init__(self, chunks: dict[Position, tuple[str, int, int]]) -> None:
        self.chunks = chunks
        self.asked: list[Position] = []

    def entry_headers(self, topic: str, ledger: int, entry: int) -> dict[str, str]:
        position = Position(ledger, entry)
        self.asked.append(position)
        if position not in self.chunks:
            return {"X-Pulsar-marker-type": "2"}  # say, a transaction marker
        uuid, chunk, count = self.chunks[position]
        return {"X-Pulsar-uuid": uuid, "X-Pulsar-chunk-id": str(chunk), "X-Pulsar-num-chunks-from-msg": str(count)}


def test_a_message_with_later_chunks_and_no_first_in_the_range_is_named() -> None:
    p = Position
    passed = SkippedEntries(p(1, 0), lambda: [])
    passed.positions = [p(1, 1), p(1, 2), p(1, 4), p(1, 5), p(1, 7)]
    # "whole": first and middle chunk passed over (its last one delivered); "late": its first chunk before the range;
    # 1:5 a marker.
    admin = Headers({p(1, 1): ("whole", 0, 3), p(1, 2): ("whole", 1, 3), p(1, 4): ("late", 2, 4),
                     p(1, 7): ("late", 3, 4)})
    assert undelivered_chunked(admin, "t", passed) == Undelivered("late", p(1, 4))  # type: ignore[arg-type]
    assert admin.asked == passed.positions
    passed.positions = passed.positions[:2]
    assert undelivered_chunked(Headers(admin.chunks), "t", passed) is None  # type: ignore[arg-type]


class Unanswered(Headers):
    """As the broker answers for compressed chunks: never (EntryUnanswered)."""

    def __init__(self, chunks: dict[Position, tuple[str, int, int]], unanswered: set[Position]) -> None:
        super().__init__(chunks)
        self.unanswered = unanswered

    def entry_headers(self, topic: str, ledger: int, entry: int) -> dict[str, str]:
        if Position(ledger, entry) in self.unanswered:
            raise EntryUnanswered(f"no answer for {ledger}:{entry}")
        return super().entry_headers(topic, ledger, entry)


def test_an_entry_the_broker_does_not_show_is_a_delivered_messages_chunk_only_within_its_span() -> None:
    p = Position
    passed = SkippedEntries(p(1, 0), lambda: [])
    passed.saw(p(1, 1))
    passed.saw(p(1, 5), first_chunk=p(1, 2))  # a compressed chunked message: chunks 1:2..1:5, the last delivered
    passed.finish(p(1, 5))
    assert passed.positions == [p(1, 2), p(1, 3), p(1, 4)]
    admin = Unanswered({}, {p(1, 2), p(1, 3), p(1, 4)})
    assert undelivered_chunked(admin, "t", passed) is None  # type: ignore[arg-type]
    # The same entries after the last delivered message: chunks of one begun before the range cannot be ruled out.
    tail = SkippedEntries(p(1, 0), lambda: [])
    tail.saw(p(1, 1))
    tail.finish(p(1, 4))
    with pytest.raises(EntryUnanswered, match="1:2"):
        undelivered_chunked(admin, "t", tail)  # type: ignore[arg-type]
    # A message named as begun before is named even so.
    named = Unanswered({p(1, 4): ("late", 2, 3)}, {p(1, 2), p(1, 3)})
    assert undelivered_chunked(named, "t", tail) == Undelivered("late", p(1, 4))  # type: ignore[arg-type]


def test_what_follows_a_place_is_unknown_unless_a_reader_stopped_there() -> None:
    from pulsar_migration.replication.partition import only_undeliverable_after

    p = Position
    admin = Unanswered({p(1, 3): ("tail", 0, 4)}, {p(1, 4)})
    with pytest.raises(EntryUnanswered):
        only_undeliverable_after(admin, "t", p(1, 2), p(1, 4))  # type: ignore[arg-type]
    assert only_undeliverable_after(admin, "t", p(1, 2), p(1, 4), reader_stopped=True)  # type: ignore[arg-type]
    complete = Unanswered({p(1, 3): ("whole", 3, 4)}, {p(1, 4)})  # a last chunk: delivered, so not undeliverable
    assert not only_undeliverable_after(complete, "t", p(1, 2), p(1, 4), reader_stopped=True)  # type: ignore[arg-type]


def test_a_message_begun_before_the_range_that_a_rewound_reader_delivered_is_no_orphan() -> None:
    p = Position
    passed = SkippedEntries(p(1, 2), lambda: [])
    passed.saw(p(1, 3))
    passed.saw(p(1, 5), first_chunk=p(1, 1))  # begun at 1:1 (before the range), delivered at 1:5
    passed.finish(p(1, 5))
    admin = Headers({p(1, 4): ("early", 1, 3)})
    assert undelivered_chunked(admin, "t", passed) is None  # type: ignore[arg-type]
    assert undelivered_chunked(Headers(admin.chunks), "t", SkippedEntries(p(1, 2), lambda: [],  # not delivered
                                                                          positions=[p(1, 4)])) is not None  # type: ignore[arg-type]
