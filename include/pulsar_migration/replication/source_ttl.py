"""The message TTL in force on source topics (topic, else namespace, else the broker's default), and how strictly a
copy's readers are watched for being moved past stored entries (reading.EntryGaps; the engine: EntryCopy.Gaps).

Where a TTL is set, the broker's expiry check moves every cursor past messages older than it, the copy's readers'
included. Any topic's readers are moved the same way by an operator's expiry of all its subscriptions
(`topics expire-messages-all-subscriptions`): a copy then had a hole in its range with verdict ok (found by a probe,
2026-11-27: 12,500 of 30,000 messages). So every partition is read with the guard. It reads again from the last
entry taken whenever stored entries were passed over; the broker itself passes over transaction markers and
replicated subscriptions' snapshot markers, one entry each and as often as once a second, so where either can be
stored (the broker's transaction coordinator on, or the namespace replicating to other clusters) a single entry
passed over is let go (`MARKER_TOLERANCE`) unless the topic has a TTL."""

from __future__ import annotations

import logging
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

from pulsar_migration.admin import RUNTIME_CONFIGURATION, PulsarAdmin
from pulsar_migration.metadata.inventory import may_hold_topic_policies

log = logging.getLogger(__name__)

UNKNOWN = -1  # the TTL could not be read: the partition is read as if one were set
STRICT = 0  # stored entries a reader may pass over without being read again
MARKER_TOLERANCE = 1  # where markers can be stored: one, a marker's entry
# The Python client's readers (Python path, archive) on topics without a TTL: a chunk the client holds until its
# message's last chunk is passed over like a skipped entry, and a reader started again between two chunks of a
# message never gets that message; so only jumps past more entries than this are read again there (an operator's
# expiry moves a reader by the backlog it expires). Looking the entries up is no way out: the broker's entry
# endpoint never answers for a chunk of a compressed chunked message (4.0.8 fails decompressing it in a callback).
CLIENT_TOLERANCE = 64


def client_gap_tolerance(guard: tuple[int, int]) -> int:
    """The gap tolerance of the Python client's readers for a topic's (message TTL, gap tolerance): strict as the
    engine where a TTL moves readers by single expired entries, else at least CLIENT_TOLERANCE."""
    ttl, tolerance = guard
    return tolerance if ttl else max(tolerance, CLIENT_TOLERANCE)


def applied_ttls(admin: PulsarAdmin, topics: list[str], concurrency: int) -> dict[str, int]:
    """Each topic's message TTL in seconds (0: none; UNKNOWN when it could not be read)."""
    return {topic: ttl for topic, (ttl, _) in _read(admin, topics, concurrency).items()}


def reader_guards(admin: PulsarAdmin, topics: list[str], concurrency: int) -> dict[str, tuple[int, int]]:
    """Each topic's (message TTL, gap tolerance): STRICT where a TTL is set or unknown or no marker can be stored,
    else MARKER_TOLERANCE."""
    return {topic: (ttl, STRICT if ttl or not markers else MARKER_TOLERANCE)
            for topic, (ttl, markers) in _read(admin, topics, concurrency).items()}


def _read(admin: PulsarAdmin, topics: list[str], concurrency: int) -> dict[str, tuple[int, bool]]:
    """Each topic's (message TTL, whether markers can be stored). A topic-level TTL can only be where the namespace
    holds topic policies at all (metadata.inventory.may_hold_topic_policies); elsewhere the namespace's policy, else
    the broker's default, is the topic's: one read of the broker's configuration and two per namespace, and one per
    topic only in namespaces with topic policies (1,000 topics one by one: 1.4 s). Markers are taken as possible
    wherever something is unknown."""
    if not topics:
        return {}
    by_namespace: dict[str, list[str]] = defaultdict(list)
    for topic in topics:
        by_namespace[topic.split("://", 1)[-1].rsplit("/", 1)[0]].append(topic)
    try:
        config = admin.get(RUNTIME_CONFIGURATION) or {}
        default = int(config.get("ttlDurationDefaultInSeconds") or 0)
        transactions = str(config.get("transactionCoordinatorEnabled", "true")).lower() != "false"
    except Exception:  # no superuser role: the per-topic reads answer instead
        log.debug("broker configuration unreadable", exc_info=True)
        default, transactions = UNKNOWN, True

    def one(topic: str) -> tuple[str, int]:
        try:
            return topic, int(admin.get(f"{admin.topic_path(topic)}/messageTTL", params={"applied": "true"}) or 0)
        except Exception:  # read as if set: the guard costs one internalStats call and a reader per gap
            log.debug("%s: message TTL unknown", topic, exc_info=True)
            return topic, UNKNOWN

    def namespace(item: tuple[str, list[str]]) -> tuple[list[str], dict[str, int], bool]:
        """(topics to read one by one, TTLs known from the namespace, whether markers can be stored)."""
        name, members = item
        markers = True
        try:
            policies = admin.get(f"/namespaces/{name}") or {}
            ttl = policies.get("message_ttl_in_seconds")
            # Snapshot markers need a replicator; topic policies may add replication clusters of their own.
            topic_policies = may_hold_topic_policies(admin, f"/persistent/{name}")
            markers = transactions or len(policies.get("replication_clusters") or ()) > 1 or topic_policies
            if default != UNKNOWN and not topic_policies:
                return [], dict.fromkeys(members, int(ttl) if ttl is not None else default), markers
        except Exception:
            log.debug("%s: namespace TTL unknown", name, exc_info=True)
        return members, {}, markers

    with ThreadPoolExecutor(max(1, min(concurrency, len(by_namespace)))) as pool:
        answers = list(pool.map(namespace, by_namespace.items()))
    ttls = {topic: ttl for _, known, _ in answers for topic, ttl in known.items()}
    each = [topic for members, _, _ in answers for topic in members]
    if each:
        with ThreadPoolExecutor(max(1, min(concurrency, len(each)))) as pool:
            ttls.update(pool.map(one, each))
    markers = {topic: m for members, known, m in answers for topic in (*members, *known)}
    return {topic: (ttls[topic], markers.get(topic, True)) for topic in ttls}
