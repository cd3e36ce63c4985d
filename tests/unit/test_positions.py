"""Message-id parsing, sequence-id and source-tag encodings, the map's end per partition, the in-flight bound."""

from __future__ import annotations

import threading

import pulsar
import pytest
from pulsar_migration.positions import (
    MessageIdInfo,
    Position,
    PositionError,
    SourceTag,
    parse_message_id_data,
    position_of_sequence_id,
    sequence_id,
)
from pulsar_migration.replication.posmap import MAP_SCHEMA, MapRow, map_ends
from pulsar_migration.replication.sending import InFlight, producer_name
from pyspark.sql import SparkSession


def test_batched_message_id_from_the_client_carries_batch_size() -> None:
    # bytes as a received batched message's id serializes (ledger 5, entry 0, index 1, batch of 3)
    info = parse_message_id_data(bytes.fromhex("0805100020013003"))
    assert info == MessageIdInfo(ledger=5, entry=0, partition=-1, batch_index=1, batch_size=3)
    assert info.batched and info.messages_in_entry == 3 and not info.last_in_entry
    unbatched = parse_message_id_data(bytes.fromhex("08051002"))
    assert (unbatched.batch_index, unbatched.messages_in_entry, unbatched.last_in_entry) == (-1, 1, True)


def test_client_built_ids_round_trip() -> None:
    for partition, ledger, entry, index in ((-1, 7, 0, -1), (3, 123456789, 49999, 0), (0, 2**40, 5, 999)):
        info = MessageIdInfo.of(pulsar.MessageId(partition, ledger, entry, index))
        assert (info.partition, info.ledger, info.entry, info.batch_index) == (partition, ledger, entry, index)


def test_nested_first_chunk_and_garbage() -> None:
    nested = bytes.fromhex("08011002")  # ledger 1, entry 2
    data = bytes.fromhex("08031009") + b"\x3a" + bytes([len(nested)]) + nested
    assert parse_message_id_data(data).first_chunk == Position(1, 2)
    with pytest.raises(PositionError):
        parse_message_id_data(b"\x08")
    with pytest.raises(PositionError):
        parse_message_id_data(b"")


def test_sequence_ids_increase_with_position_and_are_never_zero() -> None:
    positions = [Position(0, 0), Position(0, 1), Position(0, 49_999), Position(1, 0), Position(900_000, 3)]
    ids = [sequence_id(p) for p in positions]
    assert ids == sorted(ids) and len(set(ids)) == len(ids) and min(ids) >= 1
    assert [position_of_sequence_id(i) for i in ids] == positions
    with pytest.raises(PositionError, match="outside"):
        sequence_id(Position(1, 1 << 24))


def test_source_tag_round_trip_and_errors() -> None:
    for tag in (SourceTag(Position(4, 9), -1, 0), SourceTag(Position(4, 9), 2, 7),
                SourceTag(Position(8, 3), -1, 0, Position(8, 1))):
        assert SourceTag.decode(tag.encode()) == tag
    for bad in ("", "1:2", "a:b:c:d", "1:2:3:4:5"):
        with pytest.raises(PositionError):
            SourceTag.decode(bad)
    assert Position.parse(" 3:-1 ") == Position(3, -1) and Position(3, 5) < Position(4, 0)


def test_map_end_is_the_last_target_entry_per_topic(spark: SparkSession) -> None:
    def row(topic: str, tl: int, te: int, sl: int, se: int) -> tuple:
        return MapRow(topic, 0, sl, se, 1, False, None, tl, te, 1, False, None, 0, "copy").as_tuple()

    df = spark.createDataFrame([row("a", 5, 9, 1, 1), row("a", 6, 0, 1, 2), row("a", 5, 10, 1, 0),
                                row("b", 2, 2, 9, 9)], MAP_SCHEMA)
    ends = {r.topic: (r.target_ledger, r.target_entry, r.source_ledger, r.source_entry, r.first_target_ledger)
            for r in map_ends(df).collect()}
    assert ends == {"a": (6, 0, 1, 2, 5), "b": (2, 2, 9, 9, 2)}  # and the lowest target ledger mapped


def test_in_flight_admits_whole_entries_and_an_oversized_one_alone() -> None:
    bound = InFlight(10)
    bound.acquire(6)
    admitted = threading.Event()

    def second() -> None:
        bound.acquire(6)  # 12 > 10: waits until the first entry is acknowledged
        admitted.set()

    thread = threading.Thread(target=second)
    thread.start()
    assert not admitted.wait(0.2)
    bound.release(6)
    assert admitted.wait(2)
    thread.join()
    bound.release(6)
    bound.acquire(50)  # larger than the bound, but the pipe is empty
    assert bound.count == 50 and not bound.wait_empty(0.01)


def test_producer_names_are_deterministic_per_partition_version_and_batching() -> None:
    p0, p1 = "persistent://t/ns/x-partition-0", "persistent://t/ns/x-partition-1"
    a = producer_name(p0, 1, True)
    assert a == producer_name(p0, 1, True)
    others = {producer_name(p1, 1, True), producer_name(p0, 2, True), producer_name(p0, 1, False),
              producer_name(p0, None, True)}
    assert a not in others and len(others) == 4


def test_a_later_message_of_the_same_batch_is_read_without_parsing_its_id_again() -> None:
    import pulsar
    from pulsar_migration.positions import MessageIdInfo, parse_message_id_data

    first = MessageIdInfo.of(pulsar.MessageId(2, 7, 3, 0))
    assert (first.ledger, first.entry, first.partition, first.batch_index) == (7, 3, 2, 0)
    previous = first
    for index in range(1, 4):
        message_id = pulsar.MessageId(2, 7, 3, index)
        fast = MessageIdInfo.of(message_id, previous)
        assert fast == parse_message_id_data(message_id.serialize())
        previous = fast
    # Another entry, an earlier index (a redelivery) or an unbatched message: parsed in full.
    for message_id in (pulsar.MessageId(2, 7, 4, 0), pulsar.MessageId(2, 7, 3, 1), pulsar.MessageId(2, 7, 5, -1)):
        assert MessageIdInfo.of(message_id, previous) == parse_message_id_data(message_id.serialize())


def test_the_same_batch_fast_path_does_not_serialize() -> None:
    from pulsar_migration.positions import MessageIdInfo

    class NoSerialize:  # the accessors of a pulsar.MessageId, without its serialized form
        def __init__(self, ledger: int, entry: int, index: int) -> None:
            self.ids = (ledger, entry, index)

        def ledger_id(self) -> int:
            return self.ids[0]

        def entry_id(self) -> int:
            return self.ids[1]

        def batch_index(self) -> int:
            return self.ids[2]

        def serialize(self) -> bytes:
            raise AssertionError("parsed in full")

    previous = MessageIdInfo(7, 3, 2, 0, 500)
    assert MessageIdInfo.of(NoSerialize(7, 3, 1), previous) == MessageIdInfo(7, 3, 2, 1, 500)
