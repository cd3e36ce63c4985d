"""A reader started again (reading.EntryGaps) between the chunks of a chunked message: the Python client drops a
message whose first chunk its reader did not read, so a reader restarted at the last entry taken lost a message
whose chunks another producer's entries came between, silently (both sides' hashes leave it out). A scripted topic
read by a scripted client that drops such messages as the Pulsar client does (ConsumerImpl's "uncached chunk"); the
restart now goes back to the message's first chunk (reading.restart_at), and to the first chunk of any other
message begun and not delivered (skipped.RestartPoints); one it cannot see is named after the read.

The live counterpart (a real broker, the Python path, chunks from SplitChunks.java) is in
tests/integration/test_copy_chunked_engine.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulsar
import pytest
from pulsar_migration.admin import EntryUnanswered
from pulsar_migration.positions import Position
from pulsar_migration.replication import reading
from pulsar_migration.replication.reading import EntryGaps, ReadError, read_range
from pulsar_migration.replication.skipped import (
    SkippedEntries,
    check_chunked_delivered,
    guide_restarts,
    undelivered_chunked,
)

LEDGER = 7
TOLERANCE = 64  # source_ttl.CLIENT_TOLERANCE: a topic without a message TTL


@dataclass(frozen=True)
class Chunk:
    uuid: str
    chunk: int
    count: int


MARKER = Chunk("", -1, 0)  # an entry no reader is given (a transaction marker's, say)
Entry = str | Chunk  # a plain message's text, or one chunk of a chunked message (or MARKER)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _id_data(entry: int, first_chunk: int | None = None) -> bytes:
    """MessageIdData: ledgerId, entryId, and first_chunk_message_id for a chunked message."""
    data = b"\x08" + _varint(LEDGER) + b"\x10" + _varint(entry)
    if first_chunk is not None:
        nested = b"\x08" + _varint(LEDGER) + b"\x10" + _varint(first_chunk)
        data += b"\x3a" + _varint(len(nested)) + nested
    return data


class Id:
    def __init__(self, entry: int, first_chunk: int | None) -> None:
        self.entry, self.first_chunk = entry, first_chunk

    def serialize(self) -> bytes:
        return _id_data(self.entry, self.first_chunk)

    def ledger_id(self) -> int:
        return LEDGER

    def entry_id(self) -> int:
        return self.entry

    def batch_index(self) -> int:
        return -1


class Inner:
    def encryption_context(self) -> None:
        return None


class Message:
    def __init__(self, text: str, entry: int, first_chunk: int | None = None) -> None:
        self.text, self._id, self._message = text, Id(entry, first_chunk), Inner()

    def message_id(self) -> Id:
        return self._id

    def producer_name(self) -> str:
        return producer_of(self.text)


def producer_of(text: str) -> str:
    """"text@name" was sent by `name`; any other message (and chunked message `uuid`) by a producer of its own."""
    return text.split("@", 1)[1] if "@" in text else f"p-{text}"


def delivered_from(entries: list[Entry], start: int, skip: set[int]) -> list[Message]:
    """What a reader started at `start` gets, as the client puts chunks together: a chunk whose message's first
    chunk it did not read is dropped; a message is delivered at its last chunk. `skip`: entries it is moved past."""
    cached: dict[str, int] = {}
    out = []
    for entry in range(start, len(entries)):
        stored = entries[entry]
        if entry in skip:
            continue
        if isinstance(stored, str):
            out.append(Message(stored, entry))
        elif stored == MARKER:
            continue
        elif stored.chunk == 0:
            cached[stored.uuid] = entry
        elif stored.uuid in cached and stored.chunk == stored.count - 1:
            out.append(Message(stored.uuid, entry, cached.pop(stored.uuid)))
    return out


class Reader:
    def __init__(self, messages: list[Message]) -> None:
        self.messages = messages

    def has_message_available(self) -> bool:
        return bool(self.messages)

    def read_next(self, timeout_ms: int) -> Message:
        if not self.messages:
            raise pulsar.Timeout()
        return self.messages.pop(0)

    def close(self) -> None:
        pass


class Topic:
    """One ledger of entries; the first reader is moved past `skip` (a message TTL's expiry), later ones are not."""

    def __init__(self, entries: list[Entry], skip: set[int] | None = None, unanswered: set[int] | None = None,
                 ) -> None:
        self.entries, self.skip, self.unanswered = entries, set(skip or ()), set(unanswered or ())
        self.starts: list[int] = []
        self.name = "a"

    def create_reader(self, topic: str, start: Any, **_: Any) -> Reader:
        at = max(start.entry_id(), 0)
        self.starts.append(at)
        skip, self.skip = self.skip, set()
        return Reader(delivered_from(self.entries, at, skip))

    def entry_headers(self, topic: str, ledger: int, entry: int) -> dict[str, str]:
        if entry in self.unanswered:
            raise EntryUnanswered(f"no answer for {ledger}:{entry}")
        stored = self.entries[entry]
        if isinstance(stored, str) or stored == MARKER:
            return {"X-Pulsar-publish-time": "1"}
        return {"X-Pulsar-uuid": stored.uuid, "X-Pulsar-chunk-id": str(stored.chunk),
                "X-Pulsar-num-chunks-from-msg": str(stored.count), "X-Pulsar-producer-name": producer_of(stored.uuid)}


def chunks(uuid: str, count: int, ids: range | None = None) -> list[Chunk]:
    return [Chunk(uuid, i, count) for i in (ids if ids is not None else range(count))]


def read(topic: Topic, tolerance: int = TOLERANCE, guided: bool = True) -> tuple[list[str], SkippedEntries, EntryGaps]:
    gaps = EntryGaps([(LEDGER, len(topic.entries))], tolerance=tolerance)
    passed = guide_restarts(topic, "t", gaps, Position(LEDGER, -1)) if guided else SkippedEntries(  # type: ignore[arg-type]
        Position(LEDGER, -1), lambda: [])
    upper = Position(LEDGER, len(topic.entries) - 1)
    texts = []
    for message, info in read_range(topic, "t", None, upper, gaps=gaps):
        if not guided:
            passed.saw(info.position, info.first_chunk)
        texts.append(message.text)
    passed.finish(upper)
    return texts, passed, gaps


def expected(entries: list[Entry]) -> list[str]:
    return [m.text for m in delivered_from(entries, 0, set())]


def spanning(count: int = 70) -> list[Entry]:
    """"first"; a message of `count` chunks with "between" after its first chunk; "last"."""
    return ["first", *chunks("M", count, range(1)), "between", *chunks("M", count, range(1, count)), "last"]


def test_a_message_with_more_chunks_than_the_tolerance_and_a_neighbour_between_them_is_read_again_whole() -> None:
    entries = spanning()
    topic = Topic(entries)
    texts, passed, gaps = read(topic)
    assert texts == expected(entries) == ["first", "between", "M", "last"]
    assert gaps.rereads == 1 and topic.starts == [0, 1]  # again from its first chunk (was: 2, "between": lost)
    check_chunked_delivered(topic, "t", passed, begun_before=False, restarted=True)  # type: ignore[arg-type]


def test_a_message_begun_before_the_one_read_again_is_read_whole_too() -> None:
    # P's first chunk comes before M's; M's delivery past more than the tolerance starts a reader again.
    entries: list[Entry] = [*chunks("P", 3, range(1)), "a", *chunks("M", 70, range(1)), "b",
                            *chunks("M", 70, range(1, 70)), *chunks("P", 3, range(1, 3)), "last"]
    topic = Topic(entries)
    texts, passed, _ = read(topic)
    assert texts == expected(entries) == ["a", "b", "M", "P", "last"]
    assert topic.starts == [0, 0]  # at P's first chunk: the guide looked it up
    # Without the guide the restart at M's first chunk drops P, and the check after the read names it.
    topic = Topic(entries)
    texts, passed, _ = read(topic, guided=False)
    assert "P" not in texts and topic.starts == [0, 2]
    with pytest.raises(ReadError, match=r"chunked message P .* was not delivered"):
        check_chunked_delivered(topic, "t", passed, begun_before=False, restarted=True)  # type: ignore[arg-type]


def expiring() -> list[Entry]:
    """"a", P's first chunk, four messages, P's last chunk, "f": a reader moved past "c" and "d" (a message TTL's
    expiry) gets "e" after "b" while P is pending."""
    return ["a", *chunks("P", 2, range(1)), "b", "c", "d", "e", *chunks("P", 2, range(1, 2)), "f"]


def test_an_expiry_moving_the_reader_while_a_message_is_pending_reads_again_from_its_first_chunk() -> None:
    topic = Topic(expiring(), skip={3, 4})
    texts, passed, gaps = read(topic, tolerance=1)  # a marker's entry let go; two passed over are not
    assert texts == expected(expiring()) == ["a", "b", "c", "d", "e", "P", "f"] and gaps.rereads == 1
    assert topic.starts == [0, 1]  # P's first chunk, not "b" (the last taken): P was lost there
    check_chunked_delivered(topic, "t", passed, begun_before=False, restarted=True)  # type: ignore[arg-type]
    topic = Topic(expiring(), skip={3, 4})
    texts, _, _ = read(topic, tolerance=1, guided=False)
    assert texts == ["a", "b", "c", "d", "e", "f"] and topic.starts == [0, 2]  # the old restart: P lost


def test_a_compressed_chunk_the_broker_does_not_show_is_where_the_reader_starts_again() -> None:
    topic = Topic(expiring(), skip={3, 4}, unanswered={1})
    texts, _, _ = read(topic, tolerance=1)
    assert texts == expected(expiring()) and topic.starts == [0, 1]


def test_a_markers_entry_and_a_delivered_messages_chunks_do_not_move_the_start() -> None:
    entries: list[Entry] = [*chunks("Q", 2), MARKER, "a", "b", "c", "d"]
    topic = Topic(entries, skip={4, 5})
    texts, _, _ = read(topic, tolerance=1)
    assert texts == ["Q", "a", "b", "c", "d"] and topic.starts == [0, 3]  # at "a": the marker and Q's chunk looked at


def test_a_message_begun_inside_a_delivered_ones_chunks_is_named_after_the_read() -> None:
    # P's first chunk lies inside N's chunks (delivered): the guide passes it over, the check names it.
    entries: list[Entry] = [*chunks("N", 2, range(1)), *chunks("P", 2, range(1)), *chunks("N", 2, range(1, 2)),
                            "a", *chunks("M", 70, range(1)), "b", *chunks("M", 70, range(1, 70)),
                            *chunks("P", 2, range(1, 2)), "last"]
    topic = Topic(entries)
    texts, passed, _ = read(topic)
    assert "P" not in texts
    with pytest.raises(ReadError, match=r"chunked message P .* was not delivered"):
        check_chunked_delivered(topic, "t", passed, begun_before=False, restarted=True)  # type: ignore[arg-type]


def test_a_last_chunk_stored_again_beside_its_delivered_message_is_not_named() -> None:
    p = Position
    passed = SkippedEntries(p(LEDGER, -1), lambda: [])
    passed.saw(p(LEDGER, 2), first_chunk=p(LEDGER, 0))  # R: chunks 0, 1 passed over, 2 delivered
    passed.finish(p(LEDGER, 3))  # 3: R's last chunk stored again (a producer's resend)
    topic = Topic([*chunks("R", 3), Chunk("R", 2, 3)])
    assert undelivered_chunked(topic, "t", passed, begun_before=False, restarted=True) is None  # type: ignore[arg-type]
    assert undelivered_chunked(topic, "t", passed, begun_before=False) is None  # type: ignore[arg-type]


def test_compressed_first_chunks_at_the_end_after_a_restart_are_not_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # A compressed message whose producer is still sending it: its first chunks (the broker does not show them) end
    # the range. Only the check for messages begun before the range refuses what it cannot read.
    entries: list[Entry] = [*expiring(), *chunks("Z", 3, range(2))]
    topic = Topic(entries, skip={3, 4}, unanswered={len(entries) - 2, len(entries) - 1})
    monkeypatch.setattr(reading, "END_CONFIRM_S", 0.2)  # the reader's "no more" before the range's end, believed
    texts, passed, gaps = read(topic, tolerance=1)
    assert texts == expected(expiring()) and gaps.rereads == 1
    check_chunked_delivered(topic, "t", passed, begun_before=False, restarted=True)  # type: ignore[arg-type]
    with pytest.raises(ReadError, match="does not show"):
        check_chunked_delivered(topic, "t", passed, begun_before=True)  # type: ignore[arg-type]


def test_a_message_its_producer_left_unfinished_is_not_waited_for() -> None:
    """A producer killed inside a message (D@k: its first chunk, then a message of its own): no restart goes back
    to that first chunk (every one did, re-reading from it on each)."""
    entries: list[Entry] = ["a", *chunks("D@k", 3, range(1)), "x@k", "b", "c", "d", "e", "f"]
    topic = Topic(entries, skip={5, 6})
    texts, passed, gaps = read(topic, tolerance=1)
    assert texts == ["a", "x@k", "b", "c", "d", "e", "f"] and gaps.rereads == 1
    assert topic.starts == [0, 4]  # at "c", the last taken, not at D's first chunk (1)
    check_chunked_delivered(topic, "t", passed, begun_before=False, restarted=True)  # type: ignore[arg-type]
