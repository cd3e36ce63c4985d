"""reading.EntryGaps: where a reader of the source was moved past stored entries (a message TTL, an expiry of every
subscription). The engine's EntryCopy.Gaps applies the same rule; both are run against real brokers in
tests/integration/test_source_ttl.py."""

from __future__ import annotations

from pulsar_migration.positions import Position
from pulsar_migration.replication.reading import EntryGaps

LEDGERS = [(10, 3), (11, 0), (12, 2), (14, 5)]  # ledger 11 empty; 13 trimmed or never there


def test_the_entry_stored_next_crosses_empty_and_missing_ledgers() -> None:
    gaps = EntryGaps(LEDGERS)
    assert gaps.stored_after(None) == Position(10, 0)
    assert gaps.stored_after(Position(10, 1)) == Position(10, 2)
    assert gaps.stored_after(Position(10, 2)) == Position(12, 0)
    assert gaps.stored_after(Position(12, 1)) == Position(14, 0)
    assert gaps.stored_after(Position(9, 7)) == Position(10, 0)  # a place before the ledgers (a compacted view's)
    assert gaps.stored_after(Position(14, 4)) is None  # past what was stored when the run started


def test_entries_in_order_pass_and_a_jump_is_read_again_once() -> None:
    gaps = EntryGaps(LEDGERS)
    assert gaps.follows(None, Position(10, 0)) and gaps.follows(Position(10, 2), Position(12, 0))
    assert gaps.rereads == 0
    assert not gaps.follows(Position(10, 0), Position(12, 1))  # moved past 10:1 .. 12:0
    assert gaps.rereads == 1
    assert gaps.follows(Position(10, 0), Position(12, 1))  # the new reader skips them too: a marker, say
    assert not gaps.follows(Position(12, 1), Position(14, 3))  # another jump, elsewhere
    assert gaps.rereads == 2


def test_nothing_is_judged_past_the_ledgers_known() -> None:
    gaps = EntryGaps([(10, 3)])
    assert gaps.follows(Position(10, 2), Position(20, 5)) and gaps.rereads == 0


def test_stored_entries_between_two_places_cross_ledgers() -> None:
    gaps = EntryGaps(LEDGERS)
    assert gaps.stored_between(Position(10, 0), Position(10, 1)) == 0
    assert gaps.stored_between(Position(10, 0), Position(10, 2)) == 1
    assert gaps.stored_between(Position(10, 1), Position(12, 0)) == 1  # 10:2; ledger 11 holds nothing
    assert gaps.stored_between(Position(10, 0), Position(14, 1)) == 2 + 2 + 1
    assert gaps.stored_between(None, Position(10, 2)) == 2
    assert EntryGaps(LEDGERS, first=Position(12, 1)).stored_between(None, Position(14, 0)) == 1


def test_a_tolerance_lets_a_markers_entry_go_and_reads_again_past_it() -> None:
    gaps = EntryGaps(LEDGERS, tolerance=1)
    assert gaps.follows(Position(10, 0), Position(10, 2))  # 10:1 passed over: a transaction marker, say
    assert gaps.follows(Position(10, 2), Position(12, 1))  # 12:0 alone, across the empty ledger
    assert gaps.rereads == 0
    assert not gaps.follows(Position(10, 1), Position(12, 1))  # 10:2 and 12:0: two, read again
    assert gaps.rereads == 1

