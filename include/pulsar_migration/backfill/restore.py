"""Replaying an archived window into a cluster, exactly once.

Each (topic partition, window) gets its own producer name and its messages the sequence ids 0..n-1 in archive
order (partition, ledger, entry, batch index); deduplication is on for the namespace, so a re-send after a kill
is dropped by the broker, and the producer's `last_sequence_id` says where a re-run resumes. Brokers forget an
idle producer's dedup state (brokerDeduplicationProducerInactivityTimeoutMinutes, 6 h by default), so when the
broker knows nothing the target partition is scanned for this window's tagged messages instead. Verification
reads the window's restored messages back and compares them one by one (ordinal, payload, key, properties).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from pulsar_migration.replication.content import SOURCE_PUBLISH_TIME_PROPERTY
from pulsar_migration.replication.reading import read_range
from pulsar_migration.replication.sending import SEND_TIMEOUT_MS
from pulsar_migration.spec import MigrationSpec

log = logging.getLogger(__name__)

WINDOW_PROPERTY = "pm-restore-window"
ORDINAL_PROPERTY = "pm-restore-ordinal"
ORIGIN_PROPERTY = "pm-restore-origin"  # ledger:entry:batch on the cluster the archive was taken from
_OWN_PROPERTIES = (WINDOW_PROPERTY, ORDINAL_PROPERTY, ORIGIN_PROPERTY, SOURCE_PUBLISH_TIME_PROPERTY)
MAX_PENDING = 1000


@dataclass
class RestoreOutcome:
    topic: str
    status: str = "ok"
    error: str | None = None
    archived: int = 0
    resumed_after: int = -1  # ordinal the target already held
    sent: int = 0
    restored: int = 0  # the window's messages on the target after the run
    archive_digest: str = ""
    restored_digest: str = ""
    problems: list[str] = field(default_factory=list)

    def fail(self, problem: str) -> None:
        self.status = "failed"
        self.error = self.error or problem
        self.problems.append(problem)


def producer_name(topic: str, label: str) -> str:
    return f"pm-restore-{hashlib.sha1(f'{topic}|{label}'.encode()).hexdigest()[:16]}"


def message_digest(ordinal: int, payload: bytes, key: str | None, properties: dict[str, str]) -> str:
    user = {k: v for k, v in properties.items() if k not in _OWN_PROPERTIES}
    line = json.dumps([ordinal, key or None, sorted(user.items()), hashlib.sha256(payload).hexdigest()])
    return hashlib.sha256(line.encode()).hexdigest()


class _Digest:
    """Order-sensitive: the ordinals come in order on both sides."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()
        self.count = 0

    def add(self, digest: str) -> None:
        self._h.update(digest.encode())
        self.count += 1

    @property
    def hexdigest(self) -> str:
        return self._h.hexdigest()


def target_topic(spec: MigrationSpec, namespace: str, topic: str, partition: int) -> str:
    base = f"persistent://{spec.tenant}/{namespace}/{topic}"
    return f"{base}-partition-{partition}" if partition >= 0 else base


def restore_rows(spec: MigrationSpec, label: str) -> Any:
    """mapPartitions function over archive rows sorted by (namespace, topic, partition, position): restores each
    topic partition's run of rows and yields one RestoreOutcome (as a dict) per partition."""

    def run(rows: Iterable[Any]) -> Iterator[dict[str, Any]]:
        client = spec.target_cluster.pulsar_client()
        try:
            current: tuple[str, str, int] | None = None
            batch: list[Any] = []
            for row in rows:
                key = (row["namespace"], row["topic"], row["partition"])
                if key != current and batch:
                    assert current is not None
                    yield asdict(_restore_partition(client, spec, label, current, batch))
                    batch = []
                current = key
                batch.append(row)
            if batch and current is not None:
                yield asdict(_restore_partition(client, spec, label, current, batch))
        finally:
            client.close()

    return run


def _restore_partition(client: Any, spec: MigrationSpec, label: str, key: tuple[str, str, int],
                       rows: list[Any]) -> RestoreOutcome:
    topic = target_topic(spec, *key)
    outcome = RestoreOutcome(topic, archived=len(rows))
    try:
        _send(client, topic, label, rows, outcome)
        _verify(client, topic, label, rows, outcome)
    except Exception as exc:  # one line per partition; the driver turns them into the step's error
        log.warning("restoring %s failed", topic, exc_info=True)
        outcome.fail(f"{topic}: {type(exc).__name__}: {exc}")
    return outcome


def _send(client: Any, topic: str, label: str, rows: list[Any], outcome: RestoreOutcome) -> None:
    import pulsar

    # Chunking on: the archive holds chunked messages whole, and a payload past the broker's maximum message size
    # is refused (MessageTooBig) by a producer without it, on every retry.
    producer = client.create_producer(topic, producer_name=producer_name(topic, label), batching_enabled=False,
                                      chunking_enabled=True, send_timeout_millis=SEND_TIMEOUT_MS,
                                      max_pending_messages=MAX_PENDING, block_if_queue_full=True)
    try:
        held = int(producer.last_sequence_id())
        if held < 0:  # the broker kept no dedup state: look at what the target holds
            held = max(_restored_ordinals(client, topic, label), default=-1)
        outcome.resumed_after = held
        errors: list[str] = []

        def done(result: Any, _msg_id: Any) -> None:
            if result != pulsar.Result.Ok:
                errors.append(str(result))

        for ordinal, row in enumerate(rows):
            if ordinal <= held:
                continue
            properties = dict(row["properties"] or {})
            properties.update({WINDOW_PROPERTY: label, ORDINAL_PROPERTY: str(ordinal),
                               ORIGIN_PROPERTY: f"{row['ledger_id']}:{row['entry_id']}:{row['batch_index']}",
                               SOURCE_PUBLISH_TIME_PROPERTY: str(row["publish_time_ms"])})
            kwargs: dict[str, Any] = {"properties": properties, "sequence_id": ordinal}
            if row["key"]:
                kwargs["partition_key"] = row["key"]
            if row["event_time_ms"]:
                kwargs["event_timestamp"] = int(row["event_time_ms"])
            producer.send_async(bytes(row["payload"]), done, **kwargs)
            outcome.sent += 1
        producer.flush()
        if errors:
            raise RuntimeError(f"{len(errors)} send(s) failed, first: {errors[0]}")
    finally:
        producer.close()


def _restored_ordinals(client: Any, topic: str, label: str) -> list[int]:
    return [int(message.properties()[ORDINAL_PROPERTY]) for message, _ in read_range(client, topic, None)
            if message.properties().get(WINDOW_PROPERTY) == label]


def _verify(client: Any, topic: str, label: str, rows: list[Any], outcome: RestoreOutcome) -> None:
    archived, restored = _Digest(), _Digest()
    for ordinal, row in enumerate(rows):
        archived.add(message_digest(ordinal, bytes(row["payload"]), row["key"], dict(row["properties"] or {})))
    seen: set[int] = set()
    for message, _ in read_range(client, topic, None):
        props = message.properties()
        if props.get(WINDOW_PROPERTY) != label:
            continue
        ordinal = int(props[ORDINAL_PROPERTY])
        if ordinal in seen:
            outcome.fail(f"{topic}: ordinal {ordinal} of window {label} is stored twice")
        seen.add(ordinal)
        restored.add(message_digest(ordinal, message.data(), message.partition_key() or None, dict(props)))
    outcome.restored = restored.count
    outcome.archive_digest, outcome.restored_digest = archived.hexdigest, restored.hexdigest
    if (archived.count, archived.hexdigest) != (restored.count, restored.hexdigest):
        outcome.fail(f"{topic}: {archived.count} archived message(s) of window {label}, {restored.count} restored; "
                     f"digests {archived.hexdigest[:12]} vs {restored.hexdigest[:12]}")
