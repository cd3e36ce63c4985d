"""Message ids and positions: what the broker calls ledger:entry, what clients add (batch index, batch
size, chunks), and the encodings this project derives from them (sequence ids, source tags).

The broker tracks acknowledgements per entry; a batch is one entry holding `batch_size` messages.
The Python client hides the batch size and the first chunk of a chunked message, but both are in the
protobuf `MessageIdData` that `MessageId.serialize()` returns, parsed here without a protobuf library.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import total_ordering
from typing import Any

# Sequence ids pack (ledger, entry) into one increasing number below 2^63 (a signed 64-bit id): 24 bits of entry id
# (brokers roll ledgers far earlier: managedLedgerMaxEntriesPerLedger defaults to 50,000) and 38 bits of ledger id.
# 39 bits filled all 63, and the +1 that keeps 0 out took the very last position to 2^63 (found by hypothesis).
ENTRY_BITS = 24
LEDGER_BITS = 38
MAX_ENTRY = (1 << ENTRY_BITS) - 1
MAX_LEDGER = (1 << LEDGER_BITS) - 1


class PositionError(ValueError):
    """A position or message id that cannot be parsed or encoded."""


@total_ordering
@dataclass(frozen=True)
class Position:
    """An entry of a managed ledger: `ledger:entry`. Entry -1 means "before the ledger's first entry"."""

    ledger: int
    entry: int

    def __lt__(self, other: Position) -> bool:
        return (self.ledger, self.entry) < (other.ledger, other.entry)

    def __str__(self) -> str:
        return f"{self.ledger}:{self.entry}"

    @classmethod
    def parse(cls, text: str) -> Position:
        try:
            ledger, entry = text.strip().split(":")
            return cls(int(ledger), int(entry))
        except ValueError:
            raise PositionError(f"not a position (ledger:entry): {text!r}") from None


@dataclass(frozen=True)
class MessageIdInfo:
    """Everything a serialized `MessageIdData` holds (batch_index -1 = unbatched; batch_size 0 = unknown
    or unbatched; first_chunk set only for a chunked message, whose ledger/entry are its last chunk's)."""

    ledger: int
    entry: int
    partition: int = -1
    batch_index: int = -1
    batch_size: int = 0
    first_chunk: Position | None = None

    @property
    def position(self) -> Position:
        return Position(self.ledger, self.entry)

    @property
    def batched(self) -> bool:
        return self.batch_index >= 0

    @property
    def messages_in_entry(self) -> int:
        """How many messages the entry holds (1 for an unbatched message or a chunk)."""
        return max(self.batch_size, 1) if self.batched else 1

    @property
    def last_in_entry(self) -> bool:
        return not self.batched or self.batch_index >= self.batch_size - 1

    @classmethod
    def of(cls, message_id: Any, previous: MessageIdInfo | None = None) -> MessageIdInfo:
        """From a pulsar.MessageId (received or returned by a send receipt). `previous`: the id read just
        before; a later message of the same batch then differs only in its index, read without serializing
        and parsing the id again (a tenth of the copy's CPU on small batched messages)."""
        if previous is not None and previous.batch_index >= 0:
            index = message_id.batch_index()
            if index > previous.batch_index and message_id.entry_id() == previous.entry \
                    and message_id.ledger_id() == previous.ledger:
                return cls(previous.ledger, previous.entry, previous.partition, index, previous.batch_size,
                           previous.first_chunk)
        return parse_message_id_data(message_id.serialize())


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise PositionError("truncated varint in MessageIdData")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 70:
            raise PositionError("varint too long in MessageIdData")


def _signed(value: int) -> int:
    """Protobuf int64/int32 fields encode negatives as 64-bit two's complement."""
    return value - (1 << 64) if value >= 1 << 63 else value


def parse_message_id_data(data: bytes) -> MessageIdInfo:
    """Parses protobuf MessageIdData: 1 ledgerId, 2 entryId, 3 partition, 4 batch_index, 6 batch_size,
    7 first_chunk_message_id (nested); others (ack_set, topic) are skipped."""
    fields: dict[int, int] = {}
    first_chunk: Position | None = None
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            fields[number] = _signed(value)
        elif wire == 2:
            length, pos = _varint(data, pos)
            chunk = data[pos:pos + length]
            pos += length
            if number == 7:
                first = parse_message_id_data(chunk)
                first_chunk = first.position
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise PositionError(f"unsupported wire type {wire} in MessageIdData")
    if 1 not in fields or 2 not in fields:
        raise PositionError("MessageIdData without ledgerId/entryId")
    return MessageIdInfo(ledger=fields[1], entry=fields[2], partition=fields.get(3, -1),
                         batch_index=fields.get(4, -1), batch_size=fields.get(6, 0), first_chunk=first_chunk)


def sequence_id(position: Position) -> int:
    """The target sequence id of every message copied from a source entry: increasing with the position,
    never 0 (the Python client ignores a 0 sequence id)."""
    if not 0 <= position.entry <= MAX_ENTRY or not 0 <= position.ledger <= MAX_LEDGER:
        raise PositionError(f"position {position} is outside the sequence-id encoding "
                            f"(ledger < 2^{LEDGER_BITS}, entry < 2^{ENTRY_BITS})")
    return ((position.ledger << ENTRY_BITS) | position.entry) + 1


def position_of_sequence_id(seq: int) -> Position:
    value = seq - 1
    return Position(value >> ENTRY_BITS, value & MAX_ENTRY)


@dataclass(frozen=True)
class SourceTag:
    """Where a copied message came from, carried on the copy as a property: `ledger:entry:index:size`
    (index -1 and size 0 for an unbatched message; for a chunked message the last chunk's entry, and
    `first` holds the first chunk's)."""

    position: Position
    batch_index: int
    batch_size: int
    first_chunk: Position | None = None

    def encode(self) -> str:
        text = f"{self.position}:{self.batch_index}:{self.batch_size}"
        return f"{text}:{self.first_chunk}" if self.first_chunk else text

    @classmethod
    def decode(cls, text: str) -> SourceTag:
        parts = text.split(":")
        try:
            if len(parts) not in (4, 6):
                raise ValueError
            first = Position(int(parts[4]), int(parts[5])) if len(parts) == 6 else None
            return cls(Position(int(parts[0]), int(parts[1])), int(parts[2]), int(parts[3]), first)
        except ValueError:
            raise PositionError(f"not a source tag (ledger:entry:index:size[:ledger:entry]): {text!r}") from None

    @classmethod
    def of(cls, info: MessageIdInfo) -> SourceTag:
        return cls(info.position, info.batch_index, info.batch_size if info.batched else 0, info.first_chunk)


@dataclass(frozen=True)
class AckRange:
    """Entries a cursor acknowledged past its markDeletePosition: `(lower..upper]`, lower exclusive, both in
    the same ledger as the broker splits them (lower entry -1: from the ledger's first entry)."""

    lower: Position
    upper: Position

    @property
    def entries(self) -> range:
        """The entry ids the range holds (upper.entry inclusive)."""
        return range(self.lower.entry + 1, self.upper.entry + 1)

    def __contains__(self, position: object) -> bool:
        return isinstance(position, Position) and self.lower < position <= self.upper


def ledger_sizes(internal_stats: dict[str, Any]) -> list[tuple[int, int]]:
    """A partition's ledgers in order with their entry counts, from its internalStats: the open (last) ledger's
    count is `currentLedgerEntries` (its ledger info says 0 until it closes)."""
    ledgers = internal_stats.get("ledgers") or []
    return [(int(ledger["ledgerId"]),
             int(internal_stats.get("currentLedgerEntries", 0) if index == len(ledgers) - 1
                 else ledger.get("entries", 0)))
            for index, ledger in enumerate(ledgers)]


def parse_ack_ranges(text: str | None) -> list[AckRange]:
    """Parses internalStats' `individuallyDeletedMessages`, e.g. `[(3:5..3:7],(4:-1..4:2]]` (spacing
    varies; `[]` or empty: none). A range spanning ledgers (older brokers) is refused: its entries
    cannot be listed without knowing where each ledger ends."""
    body = (text or "").strip()
    if body.startswith("[") and body.endswith("]"):
        body = body[1:-1]
    ranges: list[AckRange] = []
    for part in body.split("]"):
        part = part.strip().lstrip(",").strip()
        if not part:
            continue
        if not part.startswith("(") or ".." not in part:
            raise PositionError(f"not an acknowledged range (L:E..L:E]: {part!r} in {text!r}")
        lower_text, upper_text = part[1:].split("..", 1)
        lower, upper = Position.parse(lower_text), Position.parse(upper_text)
        if lower.ledger != upper.ledger:
            raise PositionError(f"acknowledged range ({lower}..{upper}] spans ledgers")
        if upper <= lower:
            raise PositionError(f"empty acknowledged range ({lower}..{upper}]")
        ranges.append(AckRange(lower, upper))
    return ranges
