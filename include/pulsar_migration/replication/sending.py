"""Re-publishing source entries on the target, one target entry per source entry, pipelined.

* A batched source entry is sent as `send_async` of its messages on a batching producer whose limits
  exceed any batch, then `flush_async`: the batch closes exactly there, without waiting for the broker.
* An unbatched message goes through a non-batching producer (which re-chunks a chunked message).
* A producer stamps its own schema version on every message, so there is one producer per (schema
  version, batched). Switching producers first drains the previous one, so the target keeps the
  source's order even across reconnects.
* Every message of a source entry carries the sequence id derived from the entry's position
  (positions.sequence_id), increasing over the partition: with deduplication on the target, a
  re-send after a kill or a retry is dropped by the broker instead of stored twice.
* An entry that would exceed the broker's message size as sent (decompressed, every message with the two added
  properties) goes through a producer compressing with the source entry's codec, LZ4 for an uncompressed source
  (its name ends in `z<codec>`, as the copy engine's): a stored entry fits as it did on the source. A batch's
  messages are held until its last one is read, so the choice is made before the first is sent.
* `resend_suffixes`: source messages sent under the producer name with a suffix, a chunked message a stopped run
  left incomplete on the target (partition.IncompleteMessage): under its first name its chunks would come again
  under the same chunk uuid, which the C++ consumer cannot assemble.
* With `identity_for` (the cutover's final delta), messages keep their source producer's name and
  sequence ids instead: the target's dedup then knows those producers, so a client that re-sends its
  unacknowledged messages to the target after the switch gets the ones already copied dropped as
  duplicates, as geo-replication does.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pulsar_migration.positions import MessageIdInfo, Position, SourceTag, sequence_id
from pulsar_migration.replication.content import SOURCE_PUBLISH_TIME_PROPERTY, SOURCE_TAG_PROPERTY

log = logging.getLogger(__name__)

# Batching limits far above anything a source batch can hold (the broker caps an entry at 5 MiB by
# default); the publish delay never fires because every entry is flushed explicitly.
BATCH_MAX_MESSAGES = 1_000_000
BATCH_MAX_BYTES = 256 * 1024 * 1024
BATCH_MAX_DELAY_MS = 3_600_000
SEND_TIMEOUT_MS = 30_000
# Below the broker's default maxMessageSize (5 MiB) by room for the metadata (the engine's RECOMPRESS_ABOVE_BYTES).
RECOMPRESS_ABOVE_BYTES = 5 * 1024 * 1024 - 256 * 1024
# What a message adds to an entry besides its payload, key and properties (the rest of its metadata and its
# length prefix in a batch), counted high.
MESSAGE_OVERHEAD_BYTES = 64


class SendError(RuntimeError):
    """The target refused or timed out a send; the message is one line."""


class InFlight:
    """Bounds the messages sent and not yet acknowledged by the target. An entry's messages are admitted
    together (a batch cannot be flushed half-way); an entry larger than the bound waits for an empty pipe."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self.count = 0
        self._cond = threading.Condition()

    def acquire(self, n: int) -> None:
        with self._cond:
            while self.count and self.count + n > self.limit:
                self._cond.wait()
            self.count += n

    def release(self, n: int = 1) -> None:
        with self._cond:
            self.count -= n
            self._cond.notify_all()

    def wait_empty(self, timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.count <= 0, timeout=timeout_s)


def producer_name(topic: str, schema_version: int | None, batched: bool) -> str:
    """Deterministic per (partition, schema version, batching): the target's dedup state is keyed on it."""
    digest = hashlib.sha1(topic.encode("utf-8")).hexdigest()[:12]
    return f"pm-copy-{digest}-{'b' if batched else 'u'}{'n' if schema_version is None else schema_version}"


def compression_of(codec: str | None) -> Any:
    """The Python client's compression type for an `X-Pulsar-compression` header value (absent: LZ4)."""
    import pulsar

    names = {"LZ4": "LZ4", "ZLIB": "ZLib", "ZSTD": "ZSTD", "SNAPPY": "SNAPPY"}
    return getattr(pulsar.CompressionType, names.get((codec or "LZ4").upper(), "LZ4"))


def raw_schema(schema_type: str, definition: str, name: str) -> Any:
    """A schema object that registers `definition` and leaves payloads as they are (already encoded)."""
    import _pulsar
    from pulsar.schema import Schema

    class _Encoded(Schema):
        def __init__(self) -> None:  # the base class would JSON-encode an already JSON definition again
            self._record_cls = bytes
            self._schema_info = _pulsar.SchemaInfo(getattr(_pulsar.SchemaType, schema_type), name, definition)

        def encode(self, obj: Any) -> Any:
            return obj

        def decode(self, data: Any) -> Any:
            return data

    return _Encoded()


# (schema version, batched, producer name or None for the default one, codec or None)
ProducerKey = tuple[int | None, bool, str | None, str | None]


@dataclass
class SendStats:
    messages: int = 0
    entries: int = 0
    bytes: int = 0
    deduplicated: int = 0
    # Source entries whose send the target's dedup answered as a duplicate (a re-send after a cut connection
    # of an entry an earlier attempt stored): their receipt names no target entry.
    deduplicated_sources: set[Position] = field(default_factory=set)
    delayed: int = 0
    errors: list[str] = field(default_factory=list)


class EntrySender:
    """Sends source messages to one target partition, entry shape kept, with bounded messages in flight.

    `schema_for(version)` returns the schema object to register for a source schema version;
    `deliver_at_for(message, info)` the delivery time (ms) of an unbatched message, or None;
    `codec_for(info)` the source entry's codec (`X-Pulsar-compression`, None when uncompressed), asked only about
    entries too large to send uncompressed.
    `on_receipt(source_tag, target_info)` is called (from a client thread) once per copied entry, when the
    target stored it.
    """

    def __init__(self, client: Any, topic: str, *, max_in_flight: int,
                 schema_for: Callable[[int], Any], deliver_at_for: Callable[[Any, MessageIdInfo], int | None],
                 on_receipt: Callable[[SourceTag, MessageIdInfo], None],
                 codec_for: Callable[[MessageIdInfo], str | None] = lambda info: None,
                 identity_for: Callable[[Any, MessageIdInfo], tuple[str, int]] | None = None,
                 cluster: str | None = None, resend_suffixes: dict[Position, str] | None = None) -> None:
        self.client = client
        self.topic = topic
        self.where = f"{topic} in cluster {cluster}" if cluster else topic  # for error lines
        self.stats = SendStats()
        self._inflight = InFlight(max_in_flight)
        # The client's own queue must take a whole batch (InFlight admits one larger than its bound when the pipe
        # is empty): past it the client refuses the batch's later messages and stores the rest as the entry.
        self._max_pending = BATCH_MAX_MESSAGES
        self._schema_for = schema_for
        self._deliver_at_for = deliver_at_for
        self._on_receipt = on_receipt
        self._codec_for = codec_for
        self._identity_for = identity_for
        self._resend_suffixes = resend_suffixes or {}
        self._producers: dict[ProducerKey, Any] = {}
        self._current: ProducerKey | None = None
        self._lock = threading.Lock()
        # The messages of the batch being read (built, payload bytes) and their size as sent.
        self._entry: list[tuple[Any, int]] = []
        self._entry_bytes = 0

    # -- producers ---------------------------------------------------------------------------------

    def _producer(self, key: ProducerKey) -> Any:
        producer = self._producers.get(key)
        if producer is None:
            version, batched, name, codec = key
            name = name or producer_name(self.topic, version, batched)
            # An identity (the source producer's name) is kept whatever the codec: the name's other producer goes
            # first, since the broker admits one producer per name on a topic. The switch drained it.
            for other in [k for k in self._producers if k[2] == key[2] and key[2] is not None]:
                self._close(self._producers.pop(other))
            kwargs: dict[str, Any] = {
                "producer_name": name,
                "send_timeout_millis": SEND_TIMEOUT_MS,
                "max_pending_messages": self._max_pending,
                "block_if_queue_full": False,  # InFlight keeps the queue below its limit
                "batching_enabled": batched,
                "chunking_enabled": not batched,
            }
            if batched:
                kwargs.update(batching_max_messages=BATCH_MAX_MESSAGES,
                              batching_max_allowed_size_in_bytes=BATCH_MAX_BYTES,
                              batching_max_publish_delay_ms=BATCH_MAX_DELAY_MS)
            if codec is not None:
                kwargs["compression_type"] = compression_of(codec)
            if version is not None:
                kwargs["schema"] = self._schema_for(version)
            try:
                producer = self.client.create_producer(self.topic, **kwargs)
            except Exception as exc:
                if not self._producers or "ProducerBusy" not in f"{type(exc).__name__} {exc}":
                    raise SendError(f"cannot create producer on {self.where}: {exc}") from exc
                # The topic's producer limit (maxProducers, which sync_metadata carries) reached by this copy's own
                # producers (one per schema version, batching, codec and identity): the others are drained (a
                # switch drains), so they go, and the producer is asked for again.
                log.info("%s: producer limit reached with %d open: closing them for %s", self.where,
                         len(self._producers), name)
                for other in list(self._producers):
                    self._close(self._producers.pop(other))
                try:
                    producer = self.client.create_producer(self.topic, **kwargs)
                except Exception as again:
                    raise SendError(f"cannot create producer on {self.where}: {again}") from again
            self._producers[key] = producer
        return producer

    # -- sending -----------------------------------------------------------------------------------

    def send(self, message: Any, info: MessageIdInfo, schema_version: int | None) -> None:
        """Sends one source message; `info` is its parsed source id. A batch's messages are sent together when
        its last one comes."""
        import _pulsar

        self.raise_if_failed()
        identity = self._identity_for(message, info) if self._identity_for else None
        tag = SourceTag.of(info)
        native = message._message
        builder = _pulsar.MessageBuilder()
        size = native.length()
        sent_bytes = size + MESSAGE_OVERHEAD_BYTES
        if native.has_null_value():
            builder.set_null_value()
        else:
            builder.content(native.data())
        properties = native.properties()
        properties[SOURCE_TAG_PROPERTY] = tag.encode()
        properties[SOURCE_PUBLISH_TIME_PROPERTY] = str(native.publish_timestamp())
        for k, v in properties.items():
            builder.property(k, v)
            sent_bytes += len(k.encode()) + len(v.encode()) + 4
        partition_key = native.partition_key()
        if partition_key:
            builder.partition_key(partition_key)
            sent_bytes += len(partition_key.encode())
        ordering_key = native.ordering_key()
        if ordering_key:
            builder.ordering_key(ordering_key if isinstance(ordering_key, str) else ordering_key.decode("latin-1"))
            sent_bytes += len(ordering_key)
        builder.sequence_id(identity[1] + max(info.batch_index, 0) if identity else sequence_id(info.position))
        if native.event_timestamp():
            builder.event_timestamp(native.event_timestamp())
        if not info.batched:
            deliver_at = self._deliver_at_for(message, info)
            if deliver_at:
                builder.deliver_at(deliver_at)
                self.stats.delayed += 1
        built = builder.build()
        if info.batched:
            self._entry.append((built, size))
            self._entry_bytes += sent_bytes
            if not info.last_in_entry:
                return
            entry, sent_bytes = self._entry, self._entry_bytes
            self._entry, self._entry_bytes = [], 0
        else:
            entry = [(built, size)]
        # Too large to send decompressed (a chunked message is chunked again instead).
        codec = None
        if sent_bytes > RECOMPRESS_ABOVE_BYTES and info.first_chunk is None:
            codec = (self._codec_for(info) or "LZ4").lower()
        suffix = self._resend_suffixes.get(info.position)
        if identity:
            name: str | None = identity[0]
        elif suffix or codec:
            name = producer_name(self.topic, schema_version, info.batched) + (suffix or "") + (
                f"z{codec}" if codec else "")
        else:
            name = None
        key = (schema_version, info.batched, name, codec)
        if key != self._current:
            if self._current is not None:
                self.drain()
            self._current = key
        producer = self._producer(key)
        self._inflight.acquire(len(entry))
        # A batch is stored or refused whole: one receipt per entry (its last message) is enough, and a Python
        # callback per message would cost more than the copy itself.
        for built, _ in entry[:-1]:
            producer._producer.send_async(built, None)
        messages = len(entry)
        producer._producer.send_async(entry[-1][0], lambda res, mid: self._receipt(tag, messages, res, mid))
        with self._lock:
            self.stats.messages += messages
            self.stats.bytes += sum(n for _, n in entry)
            self.stats.entries += 1
        if info.batched:
            producer._producer.flush_async(lambda res: self._flushed(res))

    def _receipt(self, tag: SourceTag, messages: int, result: Any, message_id: Any) -> None:
        """The receipt of an entry's last message, standing for all `messages` of the entry."""
        import _pulsar

        try:
            if result != _pulsar.Result.Ok:
                with self._lock:
                    self.stats.errors.append(f"send to {self.where} failed: {result}")
                return
            target = MessageIdInfo.of(message_id)
            if target.ledger < 0:  # the broker's dedup recognised a re-send
                with self._lock:
                    self.stats.deduplicated += messages
                    self.stats.deduplicated_sources.add(tag.position)
                return
            self._on_receipt(tag, target)
        except Exception as exc:  # never let an exception escape into the client's thread
            with self._lock:
                self.stats.errors.append(f"receipt handling on {self.topic} failed: {exc}")
        finally:
            self._inflight.release(messages)

    def _flushed(self, result: Any) -> None:
        import _pulsar

        if result != _pulsar.Result.Ok:
            with self._lock:
                self.stats.errors.append(f"flush to {self.where} failed: {result}")

    def raise_if_failed(self) -> None:
        if self.stats.errors:
            raise SendError(self.stats.errors[0])

    def drain(self, timeout_s: float = SEND_TIMEOUT_MS / 1000 + 30) -> None:
        """Waits until the target acknowledged everything sent so far."""
        if self._entry:
            raise SendError(f"a batch for {self.where} ended after {len(self._entry)} of its messages")
        if not self._inflight.wait_empty(timeout_s):
            raise SendError(f"{self._inflight.count} message(s) to {self.where} unacknowledged after {timeout_s:.0f}s")
        self.raise_if_failed()

    def close(self) -> None:
        for producer in self._producers.values():
            self._close(producer)
        self._producers.clear()

    def _close(self, producer: Any) -> None:
        try:
            producer.close()
        except Exception:
            log.debug("closing producer on %s failed", self.topic, exc_info=True)


def position_text(position: Position | None) -> str | None:
    return str(position) if position is not None else None
