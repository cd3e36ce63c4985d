"""What a message *is* for verification, and the properties a copy adds.

Both sides of a partition are hashed the same way: an order-sensitive chain over each message's key,
ordering key, payload, properties (without the ones replication adds), event time, schema version and
null-value flag. Equal chains mean the same messages in the same order.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Carried by every Spark copy: where the message came from (positions.SourceTag) and its source publish time.
SOURCE_TAG_PROPERTY = "__pm_source"
SOURCE_PUBLISH_TIME_PROPERTY = "__pm_source_publish_time"
# Stamped by native geo-replication (4.0.4+) on the copy: "<ledger>:<entry>" of the source entry.
GEO_SOURCE_PROPERTY = "__MSG_PROP_REPL_SOURCE_POSITION"
ADDED_PROPERTIES = frozenset({SOURCE_TAG_PROPERTY, SOURCE_PUBLISH_TIME_PROPERTY, GEO_SOURCE_PROPERTY})


def user_properties(properties: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in properties.items() if k not in ADDED_PROPERTIES}


def schema_version_of(message: Any) -> int | None:
    """The message's schema version as a number (None when it carries none); `message` is a
    pulsar.Message or the native _pulsar.Message."""
    native = getattr(message, "_message", message)
    version = native.int_schema_version()
    return None if version is None or version < 0 else int(version)


def _field(value: bytes) -> bytes:
    return struct.pack(">I", len(value)) + value


def properties_text(props: Mapping[str, str]) -> bytes:
    """The properties as hashed: sorted by key (its UTF-8 bytes, i.e. code points), each key and value
    length-prefixed. Joined by separators before 2026-11-27, `{"a": "b\0c\1d"}` and `{"a": "b", "c": "d"}` had
    the same text, and a copy that turned one into the other would have passed verification."""
    pairs = sorted((k.encode("utf-8"), v.encode("utf-8")) for k, v in props.items())
    return b"".join(_field(k) + _field(v) for k, v in pairs)


def message_digest(message: Any) -> bytes:
    """sha256 of one message's canonical content (a pulsar.Message)."""
    native = getattr(message, "_message", message)
    props = user_properties(native.properties())
    parts = [
        _field(native.partition_key().encode("utf-8")),
        _field(native.ordering_key() if isinstance(native.ordering_key(), bytes)
               else str(native.ordering_key()).encode("utf-8")),
        _field(native.data()),
        _field(properties_text(props)),
        struct.pack(">qq?", native.event_timestamp(), schema_version_of(native) or -1, native.has_null_value()),
    ]
    return hashlib.sha256(b"".join(parts)).digest()


@dataclass
class ContentHash:
    """Order-sensitive hash and counts of a sequence of messages and entries."""

    messages: int = 0
    entries: int = 0
    bytes: int = 0
    _chain: bytes = field(default=b"\x00" * 32, repr=False)

    def add(self, message: Any, *, new_entry: bool) -> None:
        native = getattr(message, "_message", message)
        self._chain = hashlib.sha256(self._chain + message_digest(native)).digest()
        self.messages += 1
        self.bytes += native.length() if hasattr(native, "length") else len(native.data())
        if new_entry:
            self.entries += 1

    @property
    def hexdigest(self) -> str:
        return self._chain.hex()


class PairDigest:
    """An order-independent digest of (source entry, target entry) pairs: the send receipts and a read of
    the target must describe the same pairs."""

    def __init__(self) -> None:
        self.value = 0
        self.count = 0

    def add(self, source: Any, target: Any) -> None:
        digest = hashlib.sha256(f"{source}>{target}".encode()).digest()
        self.value = (self.value + int.from_bytes(digest, "big")) % (1 << 256)
        self.count += 1

    @property
    def hexdigest(self) -> str:
        return f"{self.value:064x}"
