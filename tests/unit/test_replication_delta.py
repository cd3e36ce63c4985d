"""How the cutover's first catch-up round picks driver threads or a Spark job: only a delta known to be small
runs in the driver."""

from __future__ import annotations

from pulsar_migration.positions import Position
from pulsar_migration.replication.partition import PartitionJob
from pulsar_migration.replication.step import (
    DRIVER_DELTA_MAX_ENTRIES,
    pending_across_ledgers,
    pending_entries,
    pending_total,
    small_delta,
)


def job(upper: Position | None, source_end: Position | None) -> PartitionJob:
    map_end = (Position(900, 0), source_end) if source_end else None
    return PartitionJob("persistent://t/ns/x", "ns/x", -1, upper, map_end)  # type: ignore[arg-type]


def test_entries_past_the_map_end_are_counted_within_one_ledger() -> None:
    assert pending_entries(job(Position(7, 120), Position(7, 100))) == 20
    assert pending_entries(job(Position(7, 100), Position(7, 100))) == 0
    assert pending_entries(job(None, None)) == 0  # an empty source partition has nothing to copy


def test_a_new_ledger_or_a_partition_the_map_lacks_is_not_known() -> None:
    assert pending_entries(job(Position(8, 3), Position(7, 100))) is None
    assert pending_entries(job(Position(7, 3), None)) is None


def test_small_only_when_every_partition_is_known_and_the_sum_is_under_the_bound() -> None:
    few = [job(Position(7, 110), Position(7, 100)), job(Position(5, 40), Position(5, 0))]
    assert pending_total(few) == 50 and small_delta(few)
    assert not small_delta([*few, job(Position(9, 1), Position(8, 0))])
    many = [job(Position(7, DRIVER_DELTA_MAX_ENTRIES), Position(7, -1)), job(Position(5, 1), Position(5, 0))]
    assert not small_delta(many)
    assert small_delta([])


STATS = {"currentLedgerEntries": 7, "ledgers": [{"ledgerId": 5, "entries": 100}, {"ledgerId": 9, "entries": 40},
                                              {"ledgerId": 12, "entries": 0}]}  # 12 is open, 7 entries so far


def test_a_delta_across_ledgers_is_counted_from_the_ledger_list() -> None:
    # after 5:89 -> 10 more in ledger 5, 40 in ledger 9, entries 0..4 of the open ledger 12
    assert pending_across_ledgers(STATS, Position(5, 89), Position(12, 4)) == 10 + 40 + 5
    assert pending_across_ledgers(STATS, Position(9, 39), Position(12, 6)) == 7
    assert pending_across_ledgers(STATS, Position(5, 99), Position(9, 9)) == 10
    assert pending_across_ledgers(STATS, Position(3, 0), Position(12, 6)) == 100 + 40 + 7  # ledger 3 was trimmed


class _Admin:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def topic_path(self, topic: str) -> str:
        return "/persistent/" + topic.split("://", 1)[1]

    def get(self, path: str) -> dict:
        self.calls.append(path)
        return STATS


def test_only_partitions_whose_delta_crosses_ledgers_cost_a_call() -> None:
    admin = _Admin()
    same = job(Position(12, 6), Position(12, 1))  # 5 entries, known without a call
    crossed = job(Position(12, 4), Position(5, 89))  # 55 entries, from the ledger list
    assert pending_total([same, crossed]) is None
    assert pending_total([same, crossed], admin) == 60  # type: ignore[arg-type]
    assert admin.calls == ["/persistent/t/ns/x/internalStats"]
    assert small_delta([same, crossed], admin)  # type: ignore[arg-type]
    assert pending_total([job(Position(12, 4), None)], admin) == 100 + 40 + 5  # new to the map: from its start
