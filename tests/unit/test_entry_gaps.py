"""reading.EntryGaps: where a reader of a source with a message TTL was moved past stored entries. The engine's
EntryCopy.Gaps applies the same rule; both are run against real brokers in tests/integration/test_source_ttl.py."""

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
