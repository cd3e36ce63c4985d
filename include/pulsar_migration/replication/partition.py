"""One source partition's replication, run inside a Spark task: copy (or, in geo mode, wait for and pair)
then verify by reading the target back.

Ranges: the run covers source entries after the position map's end for this partition (or from the
earliest, in a new run dir) up to `upper`, the source's last entry when the run started. Entries the
target already holds (a run killed after sending them) are recognised from the target's last message,
which carries its source position: they are hashed, not sent again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from pulsar_migration import rundir
from pulsar_migration.admin import EntryUnanswered, NotFound, PulsarAdmin, base_topic, schema_path
from pulsar_migration.positions import MessageIdInfo, Position, PositionError, SourceTag
from pulsar_migration.replication import posmap
from pulsar_migration.replication.content import (
    SOURCE_PUBLISH_TIME_PROPERTY,
    SOURCE_TAG_PROPERTY,
    ContentHash,
    PairDigest,
    schema_version_of,
)
from pulsar_migration.replication.engine import (
    EngineError,
    EngineJob,
    EngineProcess,
    EngineResult,
    EngineScan,
    receiver_queue_for,
)
from pulsar_migration.replication.posmap import MapRow
from pulsar_migration.replication.reading import EntryGaps, ReadError, chunk_fields, read_range
from pulsar_migration.replication.sending import EntrySender, SendError, raw_schema
from pulsar_migration.replication.skipped import (
    SkippedEntries,
    before_first_entry,
    check_chunked_delivered,
    guide_restarts,
    ledger_entries,
)
from pulsar_migration.replication.source_ttl import client_gap_tolerance
from pulsar_migration.spec import PROGRESS_INTERVAL_DEFAULT_S, MigrationSpec
from pulsar_migration.throttle import Caps, Throttle, throttle

log = logging.getLogger(__name__)

OK, FAILED, PLANNED = "ok", "failed", "planned"
HEADERS_LOOKAHEAD = 64  # entries read ahead of the sender, their header fetches under way


@dataclass(frozen=True)
class EngineCopy:
    """What the Java engine did for one partition: the resume point it was given, its result (or its one-line
    error) and the wall time of its process (start-up included: partitions share it)."""

    resume_after: Position | None
    result: EngineResult | str
    copy_s: float
    process: dict[str, Any] = field(default_factory=dict)  # the process's start-up times (PM-DONE)
    rows_file: str | None = None  # the map rows of its read-back of the target (EngineResult.scan)


@dataclass(frozen=True)
class PartitionJob:
    topic: str  # persistent://t/ns/name or persistent://t/ns/name-partition-N
    local: str  # ns/name, as the spec's topic filter sees it
    partition: int  # -1: non-partitioned
    upper: Position | None  # the source's last entry when the run started (None: empty)
    map_end: tuple[Position, Position] | None = None  # (target, source) of the last mapped entry
    target_exists: bool = True  # False only in a dry run before sync_metadata created the topic
    keep_identity: bool = False  # the cutover's final delta: source producer names and sequence ids
    # The cutover's final delta: the source is fenced (its end cannot move or vanish before the quiet check,
    # which proves it did not) and the target's last entry was just read (target_last, None: empty).
    fenced: bool = False
    target_last: Position | None = None
    target_last_known: bool = False
    # The copy phase already done by the Java engine (engine_phase), for the verification to judge.
    engine: EngineCopy | None = None
    # The source partition's average message size when the driver already read its stats (the rate caps' intake
    # check): 0.0 read and unknown, None not read (engine_phase reads it then).
    average_message_bytes: float | None = None
    # Whether the source partition has a compaction cursor (its stats list COMPACTION_CURSOR; None: not read).
    compacted: bool | None = None
    # The source topic's (message TTL, gap tolerance) for its readers' guard (reading.EntryGaps; source_ttl); None: no
    # guard (the cutover's deltas and small driver deltas: recent entries, clients held).
    reader_guard: tuple[int, int] | None = None

    @property
    def base_topic(self) -> str:
        return base_topic(self.topic, self.partition)


@dataclass
class PartitionOutcome:
    topic: str
    local: str
    partition: int
    status: str = OK
    error: str | None = None
    range_from: str | None = None  # exclusive, source "L:E" (None: from the earliest)
    range_to: str | None = None  # inclusive
    resumed_after: str | None = None  # last source entry the target already held
    source_messages: int = 0
    source_entries: int = 0
    source_bytes: int = 0
    source_hash: str = ""
    copied_messages: int = 0
    copied_entries: int = 0
    copied_bytes: int = 0
    skipped_messages: int = 0  # already on the target
    deduplicated: int = 0
    delayed_messages: int = 0
    delivery_time_lookups: int = 0
    target_messages: int = 0
    target_entries: int = 0
    target_hash: str = ""
    receipts: int = 0
    receipts_digest: str = ""
    target_pairs_digest: str = ""
    shape_errors: int = 0
    mapped_entries: int = 0
    lag_entries: int | None = None  # source entries after `range_to` when the run ended (same ledger only)
    unchanged: bool = False  # neither side moved since the map's last pair (unchanged_since_map)
    copy_engine: str | None = None  # java, python, or java+python (the engine left an encrypted or huge entry)
    verified_by: str | None = None  # java (the engine's read-back of the target) or python
    # Chunked messages begun before the run's range whose earlier chunks the engine read again (EntryCopy
    # gatherEarlierChunks): an earlier run's bound lay inside them, with other producers' entries between chunks.
    earlier_chunk_messages: int = 0
    # Chunked messages of the range no reader delivers (a chunk missing, their first chunks gone): not copied.
    unassembled_chunked_messages: int = 0
    # Messages of the range read through the compacted view (partition.compacted_gap): the ledgers no longer hold them.
    compacted_messages: int = 0
    # Readings again after the source's reader was moved past stored entries (its message TTL: reading.EntryGaps).
    reader_rereads: int = 0
    engine_times: dict[str, Any] | None = None  # the engine process's start-up and this partition's copy and waits
    copy_s: float = 0.0
    throttled_s: float = 0.0  # of copy_s, held back by the run's rate caps (options.copy_max_mb/msgs_per_s)
    verify_s: float = 0.0
    problems: list[str] = field(default_factory=list)

    def fail(self, problem: str) -> None:
        self.status = FAILED
        self.problems.append(problem)
        self.error = self.error or problem


# -- target side ----------------------------------------------------------------------------------

def last_copied(admin: PulsarAdmin, client: Any, topic: str, map_target: Position | None = None,
                map_source: Position | None = None, *, known: tuple[Position | None] | None = None) -> SourceTag | None:
    """The source position of the target's last message (None: the target partition is empty). When that
    message is the position map's last target entry, the map says where it came from: a rollback's reverse
    map ends at the source's own messages, which carry no tag. `known`: the target's last entry, just read."""
    entry = known[0] if known is not None else admin.last_entry(topic)
    if entry is None:
        return None
    if map_target is not None and map_source is not None and entry == map_target:
        return SourceTag(map_source, -1, 0)
    tag = chunk_tag(admin, topic, entry)
    if tag is not None:
        return tag
    for message, info in read_range(client, topic, None, entry, inclusive_start=entry, cluster=admin.name):
        if info.position != entry:
            continue
        text = message.properties().get(SOURCE_TAG_PROPERTY)
        if text is None:
            raise untagged(topic, entry, "")
        tag = SourceTag.decode(text)
    if tag is None:
        raise ReadError(f"cannot read the last entry {entry} of {topic} on the target")
    return tag


def chunk_tag(admin: PulsarAdmin, topic: str, entry: Position) -> SourceTag | None:
    """The source tag of `entry` when it is a chunk of a chunked message (None otherwise), from one admin read of
    its stored metadata (every chunk carries the message's properties). A reader started at a chunk after the
    first drops it ("uncached chunk") and never delivers the message that ends there: the resume point of a
    target whose last message is chunked stalled for 60 s and failed, on every run.

    A chunk before the message's last one is what a run stopped inside that message left: the rest never came,
    so the message is not on the target (IncompleteMessage). Pulsar's consumers drop (and acknowledge) such an
    incomplete message, as after a producer's crash, and the broker's deduplication checks a chunked message at
    its last chunk only: the copy sends it again whole (resume_point)."""
    headers = admin.entry_headers(topic, entry.ledger, entry.entry)
    chunks, chunk = chunk_fields(headers)
    if chunks <= 1:
        return None
    text = json.loads(headers.get("X-Pulsar-PROPERTY") or "{}").get(SOURCE_TAG_PROPERTY)
    if text is None:
        raise untagged(topic, entry, ", a chunk,")
    tag = SourceTag.decode(text)
    if chunk != chunks - 1:
        log.info("%s: the target's last entry %s is chunk %d of %d of the message from source %s, whose later "
                 "chunks are missing (a run stopped inside it): it is sent again whole", topic, entry, chunk,
                 chunks, tag.position)
        return IncompleteMessage(tag.position, tag.batch_index, tag.batch_size, tag.first_chunk, stored_until=entry)
    return tag


@dataclass(frozen=True)
class IncompleteMessage(SourceTag):
    """A chunked message of which the target holds only the first chunks, up to `stored_until`."""

    stored_until: Position | None = None

    @property
    def resend_suffix(self) -> str:
        """Added to the copy's producer name for the message's second sending. Clients name a chunked message by
        producer name and sequence id: the C++ client (Python 3.13) drops a message whose first chunk comes
        again under the same name (pulsar-client-cpp#587), and a message sent again under the same name would
        never be delivered. One name per stop (where its chunks end) keeps a second stop inside it apart too."""
        assert self.stored_until is not None
        return f"-resent-{self.stored_until.ledger}.{self.stored_until.entry}"


def hash_message(content: ContentHash, message: Any, info: MessageIdInfo, topic: str, cluster: str | None, *,
                 new_entry: bool) -> None:
    """ContentHash.add, with one line for a key or ordering key the Python client cannot read (bytes that are not
    UTF-8, as Java producers may set: it raised a bare UnicodeDecodeError)."""
    try:
        content.add(message, new_entry=new_entry)
    except UnicodeDecodeError:
        where = f" in cluster {cluster}" if cluster else ""
        raise ReadError(f"{topic}{where}: message {info.position}:{info.batch_index} has a key or ordering key that is "
                        "not UTF-8, which the Python path cannot read; the copy engine carries it (options.copy_engine "
                        "auto, with a JDK)") from None


class TargetNotCopied(ReadError):
    """The target partition holds messages no copy made (run_partition adds what to do: not_copied_hint)."""


def untagged(topic: str, entry: Position, what: str) -> ReadError:
    return TargetNotCopied(f"{topic} on the target holds messages that were not copied from the source "
                           f"(last entry {entry}{what} has no {SOURCE_TAG_PROPERTY} property)")


def not_copied_hint(spec: MigrationSpec) -> str:
    """What to do about target messages neither a copy nor the replicator made, the likely reason named: clients
    published them there between a switch and its rollback (nothing to say inside a rollback's reverse run)."""
    if spec.rolling_back:
        return ""
    if spec.follows_run_dir:
        return (f"; published there after the run this one continues ({spec.follows_run_dir}) was switched? "
                "continue from the latest rolled-back migration run of the tenant instead")
    return ("; published there between a switch and its rollback? continue from the rolled-back run "
            "(options.follows_run_dir, the form's 'Continue from run')")


@dataclass
class _Entry:
    target: MessageIdInfo
    tag: SourceTag
    publish_time: int
    count: int = 1


@dataclass
class TargetScan:
    content: ContentHash = field(default_factory=ContentHash)
    rows: list[MapRow] = field(default_factory=list)
    pairs: PairDigest = field(default_factory=PairDigest)
    shape_errors: list[str] = field(default_factory=list)  # the first ones, when not all are listed
    unlisted_shape_errors: int = 0
    rows_elsewhere: int = 0  # rows in the engine's rows file, not in `rows`

    @property
    def shape_error_count(self) -> int:
        return len(self.shape_errors) + self.unlisted_shape_errors

    @property
    def row_count(self) -> int:
        return len(self.rows) + self.rows_elsewhere


def engine_target_scan(scan: EngineScan) -> TargetScan:
    """The engine's read-back of the target (the same reading as scan_copied_target, done in Java right after
    its copy) as a TargetScan; its map rows stay in the engine's rows file (engine_rows_to_map)."""
    content = ContentHash(scan.messages, scan.entries, scan.bytes, bytes.fromhex(scan.hash))
    pairs = PairDigest()
    pairs.value, pairs.count = int(scan.pairs_digest, 16), scan.pairs
    listed = list(scan.first_shape_errors)
    return TargetScan(content, [], pairs, listed, scan.shape_errors - len(listed), rows_elsewhere=scan.rows)


def scan_copied_target(client: Any, job: PartitionJob, after: Position | None,
                       sent_after: Position | None, end: Position | None = None,
                       unreceipted: frozenset[Position] = frozenset(), cluster: str | None = None) -> TargetScan:
    """Reads the target partition after `after` (up to at least `end`, its last entry when known): content
    hash, one map row per entry, the entry-shape check (each target entry = one source entry, same messages in
    the same order), and the digest of (source entry, target entry) pairs for entries sent after `sent_after`
    that got a receipt naming their target entry (not those in `unreceipted`)."""
    scan = TargetScan()
    current: _Entry | None = None

    def finish(entry: _Entry | None) -> None:
        if entry is None:
            return
        want = entry.tag.batch_size if entry.tag.batch_index >= 0 else 1
        have = entry.target.messages_in_entry
        if entry.count != want or have != want or entry.target.batched != (entry.tag.batch_index >= 0):
            scan.shape_errors.append(f"target entry {entry.target.position} holds {entry.count} of {have} "
                                     f"message(s) for source entry {entry.tag.position} of {want}")
        row = MapRow(topic=job.topic, partition=job.partition, source_ledger=entry.tag.position.ledger,
                     source_entry=entry.tag.position.entry, source_messages=want,
                     source_batched=entry.tag.batch_index >= 0,
                     source_first_chunk=str(entry.tag.first_chunk) if entry.tag.first_chunk else None,
                     target_ledger=entry.target.ledger, target_entry=entry.target.entry, target_messages=have,
                     target_batched=entry.target.batched,
                     target_first_chunk=str(entry.target.first_chunk) if entry.target.first_chunk else None,
                     source_publish_time=entry.publish_time, mode="copy")
        scan.rows.append(row)
        if (sent_after is None or entry.tag.position > sent_after) and entry.tag.position not in unreceipted:
            scan.pairs.add(entry.tag.position, entry.target.position)

    for message, info in read_range(client, job.topic, after, expect_end=end, cluster=cluster):
        new_entry = current is None or info.position != current.target.position
        hash_message(scan.content, message, info, job.topic, cluster, new_entry=new_entry)
        props = message.properties()
        try:
            tag = SourceTag.decode(props[SOURCE_TAG_PROPERTY])
        except (KeyError, PositionError):
            scan.shape_errors.append(f"target message {info.position}:{info.batch_index} has no source tag")
            continue
        if new_entry:
            finish(current)
            current = _Entry(info, tag, int(props.get(SOURCE_PUBLISH_TIME_PROPERTY, "0") or 0))
        else:
            assert current is not None
            expected = current.tag.batch_index + current.count
            if tag.position != current.tag.position or tag.batch_index != expected:
                scan.shape_errors.append(f"target entry {info.position} mixes source {current.tag.position} "
                                         f"and {tag.position}:{tag.batch_index}")
            current.count += 1
    finish(current)
    return scan


# -- source side ----------------------------------------------------------------------------------

class SchemaCache:
    """Source schema definitions by version, fetched once per partition task."""

    def __init__(self, admin: PulsarAdmin, base_topic: str) -> None:
        self.admin = admin
        self.path = schema_path(*base_topic.split("://", 1)[1].split("/", 2))
        self.name = base_topic
        self._cache: dict[int, Any] = {}

    def __call__(self, version: int) -> Any:
        if version not in self._cache:
            info = self.admin.get(f"{self.path}/schema/{version}")
            self._cache[version] = raw_schema(info["type"], info["data"], self.name)
        return self._cache[version]


class EntryHeaders:
    """The admin API's `X-Pulsar-*` headers of the entries being copied, fetched once per entry (the
    delivery-time and the identity lookups both read them). `prefetch` starts the fetch of an entry the copy
    will reach soon in a small thread pool, so a partition of unbatched messages costs one admin round trip
    per PREFETCH_WORKERS entries rather than one per entry."""

    PREFETCH_WORKERS = 8

    def __init__(self, admin: PulsarAdmin, topic: str) -> None:
        self.admin, self.topic = admin, topic
        self._pending: dict[Position, Future[dict[str, str]]] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._position: Position | None = None
        self._headers: dict[str, str] = {}

    def prefetch(self, info: MessageIdInfo) -> None:
        if info.position == self._position or info.position in self._pending:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.PREFETCH_WORKERS, thread_name_prefix="entry-headers")
        self._pending[info.position] = self._pool.submit(self.admin.entry_headers, self.topic, info.ledger,
                                                         info.entry)

    def __call__(self, info: MessageIdInfo) -> dict[str, str]:
        if info.position != self._position:
            pending = self._pending.pop(info.position, None)
            self._headers = pending.result() if pending is not None else self.admin.entry_headers(
                self.topic, info.ledger, info.entry)
            self._position = info.position
        return self._headers

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._pending.clear()


def lookahead(items: Iterator[tuple[Any, MessageIdInfo]], depth: int,
              on_enter: Callable[[Any, MessageIdInfo], None]) -> Iterator[tuple[Any, MessageIdInfo]]:
    """Yields `items` unchanged, calling `on_enter` on each up to `depth` items before it is yielded."""
    buffer: deque[tuple[Any, MessageIdInfo]] = deque()
    for item in items:
        on_enter(*item)
        buffer.append(item)
        if len(buffer) > depth:
            yield buffer.popleft()
    yield from buffer


def delivery_time_lookup(headers_of: EntryHeaders, horizon_s: int, outcome: PartitionOutcome) -> Any:
    """Returns f(message, info) -> deliver-at ms or None. The Python client cannot read a message's
    delivery time, so unbatched entries (delayed messages are never batched) published within the horizon
    are looked up through the admin API's entry endpoint; horizon 0 turns this off, -1 looks at all."""
    if horizon_s == 0:
        return lambda message, info: None
    wanted = headers_wanted(horizon_s, keep_identity=False)

    def lookup(message: Any, info: MessageIdInfo) -> int | None:
        if not wanted(message, info):
            return None
        outcome.delivery_time_lookups += 1
        value = headers_of(info).get("X-Pulsar-deliver-at-time")
        if not value:
            return None
        return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)

    return lookup


def headers_wanted(horizon_s: int, *, keep_identity: bool) -> Callable[[Any, MessageIdInfo], bool]:
    """Whether the copy will ask for an entry's headers: every entry for identities, else unbatched ones
    within the delivery-time horizon (the sender asks only about unbatched messages)."""
    oldest = (time.time() - horizon_s) * 1000 if horizon_s > 0 else None

    def wanted(message: Any, info: MessageIdInfo) -> bool:
        if keep_identity:
            return True
        if horizon_s == 0 or info.batched:
            return False
        return oldest is None or message.publish_timestamp() >= oldest

    return wanted


def identity_lookup(headers_of: EntryHeaders) -> Any:
    """Returns f(message, info) -> (producer name, sequence id of the entry's first message), from the entry's
    headers (the Python client does not show the sequence id)."""

    def identity(message: Any, info: MessageIdInfo) -> tuple[str, int]:
        headers = headers_of(info)
        return headers.get("X-Pulsar-producer-name") or message.producer_name(), int(headers["X-Pulsar-sequence-id"])

    return identity


@dataclass
class PartitionTask:
    """What one partition's work needs: its outcome, both clusters' admin and data clients, the map's end."""

    job: PartitionJob
    outcome: PartitionOutcome
    src_admin: PulsarAdmin
    tgt_admin: PulsarAdmin
    src_client: Any
    tgt_client: Any
    spec: MigrationSpec | None = None
    throttle: Throttle | None = None  # the copier's part of the run's rate caps, shared by its partitions
    # Source messages to send under a producer name of their own (IncompleteMessage.resend_suffix).
    resend_suffixes: dict[Position, str] = field(default_factory=dict)

    @property
    def map_target(self) -> Position | None:
        return self.job.map_end[0] if self.job.map_end else None

    @property
    def map_source(self) -> Position | None:
        return self.job.map_end[1] if self.job.map_end else None


@dataclass
class SharedClients:
    """Both clusters' admin and data clients, opened once for many partitions run in one process (the driver
    path: a client per partition would cost a connection set-up each, seconds over a hundred partitions)."""

    src_admin: PulsarAdmin
    tgt_admin: PulsarAdmin
    src_client: Any
    tgt_client: Any

    @classmethod
    def open(cls, spec: MigrationSpec) -> SharedClients:
        return cls(spec.source_cluster.admin(), spec.target_cluster.admin(), spec.source_cluster.pulsar_client(),
                   spec.target_cluster.pulsar_client())

    def close(self) -> None:
        for closable in (self.src_client, self.tgt_client, self.src_admin, self.tgt_admin):
            try:
                closable.close()
            except Exception:
                log.debug("close failed", exc_info=True)


def run_partition(spec: MigrationSpec, job: PartitionJob, body: Callable[[PartitionTask], list[MapRow]],
                  expected: tuple[type[Exception], ...], shared: SharedClients | None = None,
                  throttle: Throttle | None = None) -> tuple[PartitionOutcome, list[MapRow]]:
    """The frame of every partition task (copy or geo): opens the clients (unless `shared` are given), runs
    `body` (which returns the map rows), turns failures into the outcome (an `expected` error is its own line),
    closes what it opened. Never raises; rows are returned only for a partition that verified."""
    outcome = PartitionOutcome(job.topic, job.local, job.partition)
    map_source = job.map_end[1] if job.map_end else None
    outcome.range_from = str(map_source) if map_source else None
    outcome.range_to = str(job.upper) if job.upper else None
    clients = shared or SharedClients.open(spec)
    rows: list[MapRow] = []
    try:
        rows = body(PartitionTask(job, outcome, clients.src_admin, clients.tgt_admin, clients.src_client,
                                  clients.tgt_client, spec, throttle))
    except expected as exc:
        outcome.fail(str(exc) + (not_copied_hint(spec) if isinstance(exc, TargetNotCopied) else ""))
    except Exception as exc:  # one line per partition; the driver turns them into the step's error
        log.warning("partition %s failed", job.topic, exc_info=True)
        outcome.fail(f"{type(exc).__name__}: {exc}")
    finally:
        if shared is None:
            clients.close()
    return outcome, rows if outcome.status == OK else []


def copy_partition(spec: MigrationSpec, job: PartitionJob, *, dry_run: bool, max_in_flight: int,
                   delivery_horizon_s: int, shared: SharedClients | None = None,
                   throttle: Throttle | None = None) -> tuple[PartitionOutcome, list[MapRow]]:
    """Copies one partition (unless the engine did: `job.engine`) and verifies it; never raises (failures are in
    the outcome). `throttle`: the copier's part of the run's rate caps."""
    return run_partition(spec, job, lambda task: _copy(task, dry_run, max_in_flight, delivery_horizon_s),
                         (ReadError, SendError, PositionError), shared, throttle)


def unchanged_since_map(task: PartitionTask) -> bool:
    """Neither side moved past the map's last pair: the source's end (this run's bound) is the last mapped
    source entry and the target's last entry the last mapped target entry. The round that wrote that pair
    verified everything up to it, so there is nothing to copy or to read back. One admin call, where the full
    path opens three readers and a producer (the cutover's final delta pays that for every partition while
    the tenant's clients are held)."""
    job, map_source = task.job, task.map_source
    if not (job.target_exists and job.upper is not None and map_source is not None and task.map_target is not None
            and job.upper >= map_source and target_last(task) == task.map_target):
        return False
    if job.upper == map_source:
        return True
    try:
        return only_undeliverable_after(task.src_admin, job.topic, map_source, job.upper)
    except EntryUnanswered as exc:  # e.g. a compressed message's chunk: the full path's reader tells
        log.info("%s: cannot tell what follows %s: %s", job.topic, map_source, exc)
        return False


UNDELIVERABLE_LOOKUPS = 8  # entries looked up one by one at most (a transaction's tail holds one or two)


def only_undeliverable_after(admin: PulsarAdmin, topic: str, after: Position, upper: Position, *,
                             reader_stopped: bool = False) -> bool:
    """Whether every source entry in (after, upper] is one no consumer is given on its own: a transaction marker, a
    message of an aborted transaction, or a chunk before a message's last one (with no last chunk in the range,
    the chunks of a producer stopped inside a message, e.g. by the cutover's fence: it sends the message again
    whole wherever it reconnects). A short tail in one ledger, entry by entry through the admin API. A partition
    written in transactions ends in a marker when it is quiet, beyond the map's last entry: without this it
    went the whole way every run, and the Python path (the cutover's final delta) waits out END_CONFIRM_S there.

    An entry the broker does not show (EntryUnanswered: a chunk of a compressed chunked message) makes the answer
    unknown (raised), unless `reader_stopped`: a reader was given nothing after `after` for END_CONFIRM_S, so the
    entry is one no reader is given on its own (a complete message's chunks are delivered at its last)."""
    if upper.ledger != after.ledger or not 0 < upper.entry - after.entry <= UNDELIVERABLE_LOOKUPS:
        return False
    for entry in range(after.entry + 1, upper.entry + 1):
        try:
            headers = admin.entry_headers(topic, upper.ledger, entry)
        except EntryUnanswered:
            if not reader_stopped:
                raise
            log.info("%s: entry %d:%d, not delivered and not shown by the broker, is taken for a chunk of a "
                     "compressed message whose last chunk is not stored", topic, upper.ledger, entry)
            continue
        chunks, chunk = chunk_fields(headers)
        first_chunks = chunks > 1 and chunk < chunks - 1
        if ("X-Pulsar-marker-type" not in headers and headers.get("X-Pulsar-txn-aborted") != "true"
                and not first_chunks):
            return False
    return True


def target_last(task: PartitionTask) -> Position | None:
    job = task.job
    return job.target_last if job.target_last_known else task.tgt_admin.last_entry(job.topic)


# A property of the target partition's managed ledger, set before the first map rows of it are written: it
# survives unloads and the trimming of consumed ledgers and goes with the topic when it is deleted. Its value names
# the source cluster (for whoever finds it).
COPY_TARGET_PROPERTY = "pulsar-migration.copy-target"
# The same on the source partition, value the target cluster: a rollback copies back into it, and after the switch's
# unload a partition no subscription holds (readers only, no retention) has its ledgers trimmed, so only this tells
# it from one deleted and created again.
COPY_SOURCE_PROPERTY = "pulsar-migration.copy-source"


def resume_point(task: PartitionTask, *, mark: bool = False) -> Position | None:
    """The last source entry the target already holds (None: nothing of this run's range), capped at the run's
    bound (a target ahead of it has nothing to receive). With a map, the target must still be the topic the map
    describes (check_same_target); `mark`: a copy follows, so the target is marked first (mark_target)."""
    job = task.job
    if not job.target_exists:
        return None
    last = target_last(task)
    if task.map_target is not None and last != task.map_target:
        check_same_target(task, last)
    elif mark and job.upper is not None and job.upper != task.map_source:
        mark_target(task, empty=last is None)
        if task.map_source is None:  # the partition's first map rows follow
            mark_partition(task.src_admin, job.topic, COPY_SOURCE_PROPERTY, task.tgt_admin.name)
    resumed = last_copied(task.tgt_admin, task.tgt_client, job.topic, task.map_target, task.map_source,
                          known=(last,))
    resume_after = resumed.position if resumed else None
    if isinstance(resumed, IncompleteMessage):
        # Just before the message's last source entry (where its id is): every message the target holds whole was
        # sent before it, so it completed before it on the source.
        resume_after = Position(resumed.position.ledger, resumed.position.entry - 1)
        task.resend_suffixes[resumed.position] = resumed.resend_suffix
    task.outcome.resumed_after = str(resume_after) if resume_after else None
    if resume_after and job.upper and resume_after > job.upper:
        return job.upper
    return resume_after


def check_same_target(task: PartitionTask, last: Position | None) -> None:
    """The map records entries up to `map_target` on this target partition, and its last entry is another one
    (new entries after it, or none left). Ledger ids are unique in a cluster, so only the mark (COPY_TARGET_PROPERTY)
    tells a topic whose consumed ledgers were trimmed from one deleted and created again since: copied into from
    the map's end, a recreated topic would verify while everything before that end is missing."""
    job = task.job
    # A rollback's target is the migration's source: marked as copied from (COPY_SOURCE_PROPERTY).
    if {COPY_TARGET_PROPERTY, COPY_SOURCE_PROPERTY} & set(target_properties(task.tgt_admin, job.topic)):
        return
    raise ReadError(f"{job.topic} on the target is not the topic the position map describes (the map ends at "
                    f"its entry {task.map_target}, the topic's last entry is {last or 'none'} and it lacks the "
                    f"{COPY_TARGET_PROPERTY} mark): it was deleted and created again since; copy it into a new run "
                    "dir")


def mark_target(task: PartitionTask, *, empty: bool = False) -> None:
    """Marks the target partition as copied into (once: one read when it already is), before any map row of it.
    An `empty` partition (a first copy, mostly) is marked without the read: setting the mark again is harmless."""
    mark_partition(task.tgt_admin, task.job.topic, COPY_TARGET_PROPERTY, task.src_admin.name, known_absent=empty)


def mark_both_sides(task: PartitionTask) -> None:
    """Geo mode's marks, before a partition's first map rows are written (the replicator wrote the target): the
    copy marks on both sides, for a cleanup that later finds the target's consumed copies trimmed."""
    mark_partition(task.tgt_admin, task.job.topic, COPY_TARGET_PROPERTY, task.src_admin.name)
    mark_partition(task.src_admin, task.job.topic, COPY_SOURCE_PROPERTY, task.tgt_admin.name)


def mark_partition(admin: PulsarAdmin, topic: str, mark: str, value: str, *, known_absent: bool = False) -> None:
    """Sets the managed-ledger property `mark` unless the partition has it (a read first, unless `known_absent`).
    The broker merges the given properties into the ledger's own."""
    if known_absent or mark not in target_properties(admin, topic):
        admin.put(f"{admin.topic_path(topic)}/properties", {mark: value})


def target_properties(admin: PulsarAdmin, topic: str) -> dict[str, str]:
    """The partition's own (managed ledger) properties."""
    return admin.get(f"{admin.topic_path(topic)}/properties") or {}


@dataclass
class Copied:
    """What the copy phase saw and did, whichever path did it: the source range's content hash, the send
    receipts' digest, and the source entries whose re-send the target's dedup dropped (no receipt position)."""

    source_messages: int = 0
    source_entries: int = 0
    source_bytes: int = 0
    source_hash: str = ContentHash().hexdigest
    receipts: int = 0
    receipts_digest: str = PairDigest().hexdigest
    deduplicated_sources: frozenset[Position] = frozenset()
    # The source's last message id as check_source_intact read it after the copy (None: not read), for lag_after.
    source_last: dict[str, Any] | None = None


def _copy(task: PartitionTask, dry_run: bool, max_in_flight: int, delivery_horizon_s: int) -> list[MapRow]:
    job, outcome = task.job, task.outcome
    src_admin, tgt_admin, tgt_client = task.src_admin, task.tgt_admin, task.tgt_client
    map_target, map_source = task.map_target, task.map_source
    # A partition the engine copied was found changed by the engine phase already: no second look.
    if not dry_run and job.engine is None and unchanged_since_map(task):
        outcome.resumed_after = str(map_source)
        outcome.source_hash = outcome.target_hash = ContentHash().hexdigest  # both ranges are empty
        outcome.receipts_digest = outcome.target_pairs_digest = PairDigest().hexdigest
        outcome.unchanged = True
        outcome.lag_entries = lag_after(src_admin, job)
        return []
    started = time.monotonic()
    copied: Copied | None = None
    if job.engine is not None and not dry_run:
        resume_after = job.engine.resume_after
        outcome.resumed_after = str(resume_after) if resume_after else None
        copied = engine_copied(task, job.engine)
        if copied is None:  # the engine left the rest (from an encrypted entry, a chunk) to the Python path
            resume_after = resume_point(task, mark=True)
    else:
        if not dry_run:
            refuse_compacted_gap(task)
        resume_after = resume_point(task, mark=not dry_run)
    if copied is None:
        copied = copy_with_client(task, resume_after, dry_run, max_in_flight, delivery_horizon_s)
    outcome.copy_s = round(time.monotonic() - started + (job.engine.copy_s if job.engine else 0), 3)
    outcome.source_messages, outcome.source_entries = copied.source_messages, copied.source_entries
    outcome.source_bytes, outcome.source_hash = copied.source_bytes, copied.source_hash
    outcome.receipts, outcome.receipts_digest = copied.receipts, copied.receipts_digest
    if dry_run:
        outcome.status = PLANNED
        return []

    started = time.monotonic()
    engine_scan = engine_scan_of(job)
    if engine_scan is not None:
        scan = engine_target_scan(engine_scan)
        outcome.verify_s = round(engine_scan.scan_s + time.monotonic() - started, 3)
        outcome.verified_by = "java"
    else:
        scan = scan_copied_target(tgt_client, job, map_target, resume_after, tgt_admin.last_entry(job.topic),
                                  copied.deduplicated_sources, tgt_admin.name)
        outcome.verify_s = round(time.monotonic() - started, 3)
        outcome.verified_by = "python"
    outcome.target_messages, outcome.target_entries = scan.content.messages, scan.content.entries
    outcome.target_hash, outcome.target_pairs_digest = scan.content.hexdigest, scan.pairs.hexdigest
    outcome.shape_errors, outcome.mapped_entries = scan.shape_error_count, scan.row_count
    judge(outcome, scan.shape_errors)
    outcome.lag_entries = lag_after(src_admin, job, copied.source_last)
    return scan.rows


COMPACTION_CURSOR = "__compaction"
LAST_POSITION = Position(2**63 - 1, 2**63 - 1)


def compacted_gap(admin: PulsarAdmin, topic: str, after: Position | None, *,
                  compacted: bool | None = None) -> Position | None:
    """The source partition's first stored entry when a compaction kept messages from before it and the range
    (after `after`) starts before it: the entries a compaction read may be trimmed since (no retention, no
    subscription behind them), and its compacted ledger alone still holds each key's last message there. None: no
    compacted ledger, or nothing of the range is gone. `compacted`: whether its stats list the compaction's cursor
    (compacted_from_stats; None: they are read here); only then is its internalStats read."""
    if compacted is None:
        compacted = compacted_from_stats(admin.get(f"{admin.topic_path(topic)}/stats"))
    if not compacted:
        return None
    stats = admin.get(f"{admin.topic_path(topic)}/internalStats")
    compacted = stats.get("compactedLedger") or {}
    if int(compacted.get("ledgerId", -1)) < 0 or int(compacted.get("entries", 0)) <= 0:
        return None
    ledgers = stats.get("ledgers") or []
    first = Position(int(ledgers[0]["ledgerId"]), 0) if ledgers else LAST_POSITION
    return first if after is None or after < Position(first.ledger, -1) else None


def refuse_compacted_gap(task: PartitionTask) -> None:
    """The Python path reads no compacted view: a partition that needs one (compacted_gap) fails in one line."""
    topic = task.job.topic
    gap = compacted_gap(task.src_admin, topic, task.map_source)
    if gap is not None:
        raise ReadError(f"{topic} on the source holds messages from before {gap} only in its compacted ledger (a "
                        "compaction kept them and their ledgers were trimmed since): the Python path cannot read "
                        "that view; the copy engine can (copy_engine auto, with a JDK)")


def compacted_from_stats(stats: dict[str, Any]) -> bool:
    """Whether a partition's stats list the compaction's cursor: a compaction ran on it at some time."""
    return COMPACTION_CURSOR in (stats.get("subscriptions") or {})


def average_from_stats(stats: dict[str, Any]) -> float | None:
    """The average message size a partition's stats give (None: no message counted since it was loaded)."""
    messages, size = int(stats.get("msgInCounter") or 0), int(stats.get("bytesInCounter") or 0)
    return size / messages if messages else None


def engine_phase(spec: MigrationSpec, jobs: list[PartitionJob], max_in_flight: int,
                 clients: SharedClients | None = None, rows_dir: str | None = None,
                 process: EngineProcess | None = None, prepare_threads: int = 16,
                 caps: Caps | None = None) -> list[PartitionJob]:
    """The copy phase of `jobs` in one Java engine process (replication.engine), run inside a Spark task: each
    partition's resume point is read from the target first; partitions unchanged since the map are left out. With
    `rows_dir` the engine also reads each partition's target back (EngineScan), its map rows in a file there.
    Returns the jobs with what the engine did attached (PartitionJob.engine); never raises. `clients`: opened by
    the caller (else here); `process`: the caller's, kept for its next round (the cutover's: one warm JVM for its
    catch-up rounds and final delta), else one started here for this phase; `prepare_threads`: partitions whose
    resume point is read at once; `caps`: the started process's part of the run's rate caps."""
    started = time.monotonic()
    shared_process = process is not None
    if process is not None and not process.alive():
        log.warning("copy engine phase skipped: the engine process has ended")
        return jobs
    try:
        if process is None:
            # Its JVM starts while the resume points are read.
            process = EngineProcess(spec, max_in_flight, caps=caps)
    except Exception:  # e.g. the engine does not build: the Python path copies, one line per failure
        log.warning("copy engine phase skipped", exc_info=True)
        return jobs
    own = clients is None
    try:
        active = clients if clients is not None else SharedClients.open(spec)
    except Exception:  # e.g. a cluster unreachable: the partitions' own tasks report it, one line each
        log.warning("copy engine phase skipped", exc_info=True)
        if not shared_process:
            process.abandon()
        return jobs
    todo: dict[str, tuple[PartitionJob, Position | None, int, dict[Position, str], Position | None,
                          list[tuple[int, int]] | None]] = {}
    try:
        def prepare(job: PartitionJob) -> None:
            task = PartitionTask(job, PartitionOutcome(job.topic, job.local, job.partition), active.src_admin,
                                 active.tgt_admin, active.src_client, active.tgt_client, spec)
            try:
                if job.upper is None or unchanged_since_map(task):
                    return
                # Every partition, whatever its messages' size: batches of 16 KiB messages went through the Python
                # path for its 1.06-1.13x speed there until 2026-11-26, and lost Java producers' binary-key flag.
                average, compacted = job.average_message_bytes, job.compacted
                if average is None or compacted is None:
                    stats = active.src_admin.get(f"{active.src_admin.topic_path(job.topic)}/stats")
                    average = average_from_stats(stats) if average is None else average
                    compacted = compacted_from_stats(stats)
                after = job.map_end[1] if job.map_end else None
                gap = compacted_gap(active.src_admin, job.topic, after, compacted=compacted)
                ledgers = ledger_entries(active.src_admin, job.topic) if job.reader_guard is not None else None
                resume = resume_point(task, mark=True)
                todo[job.topic] = (job, resume, receiver_queue_for(average), dict(task.resend_suffixes), gap,
                                   ledgers)
            except Exception:  # left to the Python path: the partition's own task meets it and reports it
                log.debug("%s: no resume point for the engine", job.topic, exc_info=True)

        with ThreadPoolExecutor(max(1, min(prepare_threads, len(jobs)))) as pool:
            list(pool.map(prepare, jobs))
    finally:
        if own:
            active.close()
    if not todo:
        if not shared_process:
            process.abandon()
        return jobs
    rows_files = {topic: f"{rows_dir}/{index}.rows" for index, topic in enumerate(todo)} if rows_dir else {}
    work = [EngineJob(job.topic, job.base_topic, job.map_end[1] if job.map_end else None, resume, job.upper,
                      scan_after=job.map_end[0] if job.map_end else None, rows_file=rows_files.get(job.topic),
                      receiver_queue=queue, keep_identity=job.keep_identity, resend_suffixes=suffixes,
                      compacted_before=gap, ledgers=ledgers,
                      gap_tolerance=job.reader_guard[1] if job.reader_guard is not None else 0)
            for job, resume, queue, suffixes, gap, ledgers in todo.values() if job.upper is not None]
    try:
        results, timings = process.run_round(work) if shared_process else process.run(work)
    except EngineError as exc:
        results, timings = {job.topic: str(exc) for job in work}, {}
    elapsed = time.monotonic() - started
    log.info("copy engine: %d partition(s) in %.1fs (%s)", len(work), elapsed, timings)
    out = []
    for job in jobs:
        if job.topic in todo and job.topic in results:
            job = replace(job, engine=EngineCopy(todo[job.topic][1], results[job.topic], round(elapsed, 3),
                                                 {**timings, "partitions": len(work)}, rows_files.get(job.topic)))
        out.append(job)
    return out


ENGINE_DONE, ENGINE_LEFT = "done", "left"
ENGINE_JUDGE_THREADS = 8


def engine_group(spec: MigrationSpec, jobs: list[PartitionJob], max_in_flight: int,
                 run_dir: str, caps: Caps | None = None) -> Iterator[tuple[str, Any]]:
    """A group of partitions through one engine process, inside one Spark task, to the end: copied, read back
    and judged. Yields (ENGINE_DONE, (outcome, rows)) for each partition the engine took and (ENGINE_LEFT, job) for
    the others (unchanged since the map, large messages under auto, the engine unavailable): the caller runs
    those as Python-path tasks of their own. The map rows of a partition the engine verified go straight from
    its rows file into a Parquet part of the map when the run dir is local (no Python object per row), else they
    are yielded for the caller's Spark write."""
    with tempfile.TemporaryDirectory(prefix="pm-engine-rows-") as rows_dir:
        try:
            clients: SharedClients | None = SharedClients.open(spec)
        except Exception:  # a cluster unreachable: each partition's own task says so in one line
            log.warning("copy engine group skipped", exc_info=True)
            clients = None
        if clients is None:
            for job in jobs:
                yield ENGINE_LEFT, job
            return
        try:
            done = engine_phase(spec, jobs, max_in_flight, clients, rows_dir, caps=caps)
            for job in done:
                if job.engine is None:
                    yield ENGINE_LEFT, job
            active = clients
            limit = throttle(caps)  # for what the engine leaves (chunked, encrypted entries)

            def judge(job: PartitionJob) -> tuple[PartitionOutcome, list[MapRow]]:
                outcome, rows = copy_partition(spec, job, dry_run=False, max_in_flight=max_in_flight,
                                               delivery_horizon_s=spec.delayed_delivery_horizon_s, shared=active,
                                               throttle=limit)
                if outcome.status == OK and outcome.verified_by == "java":
                    rows = engine_rows_to_map(run_dir, job, outcome)
                return outcome, rows

            taken = [job for job in done if job.engine is not None]
            # A few admin calls each (the source intact, the target's end): at once, for groups of many partitions.
            with ThreadPoolExecutor(max(1, min(ENGINE_JUDGE_THREADS, len(taken)))) as pool:
                for result in pool.map(judge, taken):
                    yield ENGINE_DONE, result
        finally:
            clients.close()


def engine_rows_to_map(run_dir: str, job: PartitionJob, outcome: PartitionOutcome) -> list[MapRow]:
    """A verified partition's map rows from the engine's rows file, checked against the count its read-back
    reported: written as a part of the map here (a local run dir; named by the partition's mapped range, so a
    retried task replaces its file), else returned for the caller's Spark write."""
    assert job.engine is not None and job.engine.rows_file is not None
    table = posmap.engine_rows_table(job.engine.rows_file, job.topic, job.partition)
    if table.num_rows != outcome.mapped_entries:
        outcome.fail(f"{job.topic}: the engine wrote {table.num_rows} map rows of {outcome.mapped_entries}")
        return []
    if not rundir.is_local(run_dir):
        return [MapRow(**row) for row in table.to_pylist()]
    if table.num_rows:
        first, last = table.slice(0, 1), table.slice(table.num_rows - 1, 1)
        span = "-".join(f"{t['target_ledger'][0].as_py()}.{t['target_entry'][0].as_py()}" for t in (first, last))
        key = hashlib.sha1(job.topic.encode()).hexdigest()[:12]
        posmap.write_part(run_dir, table, f"part-engine-{key}-{span}.parquet")
    return []


def engine_copied(task: PartitionTask, done: EngineCopy) -> Copied | None:
    """The engine's copy phase as the partition's (None when it stopped at an entry it leaves to the Python
    path: everything it sent before is stored, as after a kill). Its error is the partition's error."""
    job, outcome = task.job, task.outcome
    if isinstance(done.result, str):
        raise SendError(done.result)
    result = done.result
    outcome.copy_engine = "java"
    outcome.throttled_s = result.throttle_wait_s
    outcome.engine_times = {**done.process, "process_s": done.copy_s, "partition_copy_s": result.copy_s,
                            "read_wait_s": result.read_wait_s, "send_wait_s": result.send_wait_s,
                            "read_back_wait_s": result.read_back_wait_s, "throttle_wait_s": result.throttle_wait_s,
                            "partition_scan_s": result.scan.scan_s if result.scan else None,
                            "partition_scan_busy_s": result.scan.busy_s if result.scan else None}
    outcome.copied_messages, outcome.copied_entries = result.copied_messages, result.copied_entries
    outcome.copied_bytes, outcome.deduplicated = result.copied_bytes, result.deduplicated
    outcome.skipped_messages, outcome.delayed_messages = result.skipped_messages, result.delayed_messages
    outcome.earlier_chunk_messages = result.earlier_chunk_messages
    outcome.unassembled_chunked_messages = result.unassembled_chunked_messages
    outcome.compacted_messages = result.compacted_messages
    outcome.reader_rereads = result.reader_rereads
    if result.unassembled_chunked_messages:
        log.warning("%s: %d chunked message(s) miss a chunk or their first ones on the source; no reader delivers "
                    "them there, and they are not copied", job.topic, result.unassembled_chunked_messages)
    if result.fallback_at is not None:
        log.info("%s: entry %s is encrypted or a chunk of a message past the engine's bound; the Python path copies "
                 "from there", job.topic, result.fallback_at)
        outcome.copy_engine = "java+python"
        return None
    source_last = check_source_intact(task.src_admin, job)
    if job.fenced:  # the engine ends quietly where nothing more is delivered: before the bound, what is left?
        check_read_to_bound(job, result.read_to, rest_undeliverable_of(task))
    return Copied(result.source_messages, result.source_entries, result.source_bytes, result.source_hash,
                  result.receipts, result.receipts_digest, result.deduplicated_sources, source_last)


def engine_scan_of(job: PartitionJob) -> EngineScan | None:
    """The engine's read-back of a partition it copied whole (None: not the engine's, it stopped at an entry
    for the Python path, or it made none: the Python client reads the target back)."""
    result = job.engine.result if job.engine is not None else None
    return result.scan if isinstance(result, EngineResult) and result.fallback_at is None else None


def copy_with_client(task: PartitionTask, resume_after: Position | None, dry_run: bool, max_in_flight: int,
                     delivery_horizon_s: int) -> Copied:
    """The copy phase through the Python client: every message read, hashed and re-published (replication.sending);
    the only path for a dry run and for the cutover's final delta (source identities kept)."""
    job, outcome = task.job, task.outcome
    src_admin, tgt_admin, src_client, tgt_client = task.src_admin, task.tgt_admin, task.src_client, task.tgt_client
    receipts = PairDigest()

    def on_receipt(tag: SourceTag, target: MessageIdInfo) -> None:
        receipts.add(tag.position, target.position)

    source_hash = ContentHash()
    headers_of = EntryHeaders(src_admin, job.topic)
    sender = None if dry_run else EntrySender(
        tgt_client, job.topic, max_in_flight=max_in_flight, schema_for=SchemaCache(src_admin, job.base_topic),
        deliver_at_for=delivery_time_lookup(headers_of, delivery_horizon_s, outcome),
        on_receipt=on_receipt, codec_for=lambda info: headers_of(info).get("X-Pulsar-compression"),
        identity_for=identity_lookup(headers_of) if job.keep_identity else None,
        cluster=tgt_admin.name, resend_suffixes=task.resend_suffixes)
    wanted = headers_wanted(delivery_horizon_s, keep_identity=job.keep_identity)

    def prefetch(message: Any, info: MessageIdInfo) -> None:
        if not dry_run and info.batch_index <= 0 and wanted(message, info) and (
                resume_after is None or info.position > resume_after):
            headers_of.prefetch(info)

    skipped = 0
    # After the engine stopped at an entry it leaves to this path: what it copied counts as copied, not as found.
    by_engine = outcome.copied_messages, outcome.copied_entries, outcome.copied_bytes, outcome.deduplicated
    if sender is not None:
        outcome.copy_engine = "python" if outcome.copy_engine is None else outcome.copy_engine
    last_read = task.map_source
    rest_undeliverable = rest_undeliverable_of(task)
    progress = PartitionProgress(job, task.spec.progress_interval_s if task.spec else PROGRESS_INTERVAL_DEFAULT_S)
    passed_over: SkippedEntries | None = None
    try:
        if job.upper is not None:
            gaps = EntryGaps(ledger_entries(src_admin, job.topic), tolerance=client_gap_tolerance(job.reader_guard)) \
                if job.reader_guard is not None else None
            passed_over = passed_entries(task, gaps)
            entries = read_range(src_client, job.topic, task.map_source, job.upper, cluster=src_admin.name,
                                 rest_undeliverable=rest_undeliverable, gaps=gaps)
            for message, info in lookahead(entries, HEADERS_LOOKAHEAD, prefetch):
                last_read = info.position
                if passed_over is not None and gaps is None:  # with gaps, its guide is told by the reader
                    passed_over.saw(info.position, info.first_chunk)
                size = message._message.length()
                progress.read(size, info.position)
                hash_message(source_hash, message, info, job.topic, src_admin.name, new_entry=info.batch_index <= 0)
                if task.throttle is not None and not dry_run:  # every source byte read, as the engine counts
                    outcome.throttled_s += task.throttle.take(size, 1)
                if resume_after is not None and info.position <= resume_after:
                    skipped += 1
                    continue
                if sender is None:
                    outcome.copied_messages += 1
                    outcome.copied_entries += info.batch_index <= 0
                    outcome.copied_bytes += size
                    continue
                sender.send(message, info, schema_version_of(message))
            if gaps is not None:
                outcome.reader_rereads += gaps.rereads
            if passed_over is not None:
                passed_over.finish(job.upper)
                check_chunked_delivered(src_admin, job.topic, passed_over, begun_before=task.map_source is not None,
                                        restarted=gaps is not None and gaps.rereads > 0)
        source_last = check_source_intact(src_admin, job)
        if job.fenced:
            check_read_to_bound(job, last_read, rest_undeliverable)
        if sender is not None:
            sender.drain()
            stats = sender.stats
            outcome.copied_messages = by_engine[0] + stats.messages
            outcome.copied_entries = by_engine[1] + stats.entries
            outcome.copied_bytes = by_engine[2] + stats.bytes
            outcome.deduplicated = by_engine[3] + stats.deduplicated
            outcome.delayed_messages += stats.delayed
    finally:
        headers_of.close()
        if sender is not None:
            sender.close()
    outcome.skipped_messages = skipped - by_engine[0]  # the engine's copies were found on the target here
    return Copied(source_hash.messages, source_hash.entries, source_hash.bytes, source_hash.hexdigest,
                  receipts.count, receipts.hexdigest,
                  frozenset(sender.stats.deduplicated_sources) if sender is not None else frozenset(), source_last)


def rest_undeliverable_of(task: PartitionTask) -> Callable[[Position, bool], bool]:
    """Whether only undeliverable source entries follow a place up to the bound, looked up once per place: the
    reader asks where it ran dry before the bound, the fenced delta's guard asks again where the read ended."""
    job, src_admin = task.job, task.src_admin
    return functools.cache(
        lambda after, waited: job.upper is not None and only_undeliverable_after(src_admin, job.topic, after,
                                                                                 job.upper, reader_stopped=waited))


def passed_entries(task: PartitionTask, gaps: EntryGaps | None) -> SkippedEntries | None:
    """The entries the Python path's reader will pass over, followed for what it may not deliver (replication.
    skipped): after a map's end, a chunked message begun before it; with `gaps` (readers started again), one a
    reader started between its chunks. With `gaps`, the reader tells them (and asks them where to start again)."""
    src_admin, topic = task.src_admin, task.job.topic
    after = task.map_source
    if after is None and gaps is not None:
        after = before_first_entry(gaps.ledgers)
    if after is None:
        return None
    if gaps is not None:
        return guide_restarts(src_admin, topic, gaps, after)
    return SkippedEntries(after, lambda: ledger_entries(src_admin, topic))


class PartitionProgress:
    """The Python path's progress lines for one partition: every `interval_s` while it reads, what it has read."""

    def __init__(self, job: PartitionJob, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.job, self.interval_s, self.clock = job, interval_s, clock
        self.started = self.last = clock()
        self.messages = self.bytes = 0

    def read(self, size: int, position: Position) -> None:
        self.messages += 1
        self.bytes += size
        now = self.clock()
        if now - self.last >= self.interval_s:
            self.last = now
            log.info("%s: %s message(s), %.1f MB read from the source in %.0fs, at %s of %s", self.job.topic,
                     f"{self.messages:,}", self.bytes / 1e6, now - self.started, position, self.job.upper)


def judge(outcome: PartitionOutcome, shape_errors: list[str]) -> None:
    """The partition's verdict: both sides' content hashes and counts equal, entries 1:1, every receipt
    matched by what the target holds."""
    if outcome.source_hash != outcome.target_hash or outcome.source_messages != outcome.target_messages:
        outcome.fail(f"{outcome.topic}: content differs: source {outcome.source_messages} message(s) hash "
                     f"{outcome.source_hash[:12]}, target {outcome.target_messages} hash {outcome.target_hash[:12]}")
    if outcome.source_entries != outcome.target_entries:
        outcome.fail(f"{outcome.topic}: {outcome.source_entries} source entries but {outcome.target_entries} "
                     "on the target")
    if shape_errors:
        outcome.fail(f"{outcome.topic}: {len(shape_errors)} entry-shape error(s), first: {shape_errors[0]}")
    if outcome.receipts_digest != outcome.target_pairs_digest:
        outcome.fail(f"{outcome.topic}: send receipts ({outcome.receipts}) do not match the entries read back")


def check_source_intact(admin: PulsarAdmin, job: PartitionJob) -> dict[str, Any] | None:
    """A reader of a deleted topic just runs dry (and may auto-create it again, empty): after reading, the
    source must still hold the run's bound, or the copy would look complete while it is not. (Under the
    cutover's fence the quiet check makes the same read after the final sync.) Returns the source's last
    message id it read (None: it did not ask), which lag_after takes instead of asking again."""
    if job.upper is None or job.fenced:
        return None
    try:
        last = admin.last_message_id(job.topic)
    except NotFound:
        raise ReadError(f"{job.topic} was deleted on the source during the run") from None
    if Position(int(last.get("ledgerId", -1)), int(last.get("entryId", -1))) < job.upper:
        raise ReadError(f"{job.topic} on the source ends before this run's bound {job.upper}: it was deleted or "
                        "truncated during the run")
    return last


def check_read_to_bound(job: PartitionJob, last_read: Position | None,
                        rest_undeliverable: Callable[[Position, bool], bool]) -> None:
    """The cutover's final delta must end at the source's end: clients move to the target after it. A reader stops
    short of the bound when the rest is not deliverable yet (messages behind an open transaction, which become
    deliverable when it ends) or when it took "no more" for the end (read_range's END_CONFIRM_S): either way what
    it left would be missing on the target. Only transaction markers, aborted messages and the first chunks of a
    message whose last chunk never came may be left (`rest_undeliverable`: only_undeliverable_after up to the bound)."""
    if job.upper is None or (last_read is not None and last_read >= job.upper):
        return
    # A read that ended before the bound without being told so waited END_CONFIRM_S for more (read_range): an
    # entry the broker does not show is then taken for a chunk (only_undeliverable_after's reader_stopped).
    if last_read is not None and rest_undeliverable(last_read, True):
        return
    raise ReadError(f"{job.topic}: the source read ended at {last_read or 'its start'}, before the source's end "
                    f"{job.upper}, and what lies between is not only transaction markers, aborted messages or "
                    "incomplete chunks (an open transaction holds messages back?): the final delta would leave them "
                    "behind")


def lag_after(admin: PulsarAdmin, job: PartitionJob, last: dict[str, Any] | None = None) -> int | None:
    """Source entries written after the run's bound, when countable (same ledger); none under the cutover's
    fence (the quiet check proves the source did not move). `last`: the source's last message id as read
    right after the copy (check_source_intact's; one admin call a partition fewer), else asked now."""
    if job.upper is None:
        return None
    if job.fenced:
        return 0
    if last is None:
        last = admin.last_message_id(job.topic)
    ledger, entry = int(last.get("ledgerId", -1)), int(last.get("entryId", -1))
    if ledger == job.upper.ledger:
        return max(entry - job.upper.entry, 0)
    return None
