"""How the cutover's first catch-up round picks driver threads or a Spark job: only a delta known to be small
runs in the driver."""

from __future__ import annotations

from pulsar_migration.positions import Position
from pulsar_migration.replication.partition import PartitionJob
from pulsar_migration.replication.step import DRIVER_DELTA_MAX_ENTRIES, pending_entries, pending_total, small_delta


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
