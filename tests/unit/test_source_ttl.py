"""replication.source_ttl: which source topics have a message TTL, read per namespace where no topic policy can
set one, per topic elsewhere; the real brokers' answers (namespace and topic-level TTLs) are in
tests/integration/test_source_ttl.py."""

from __future__ import annotations

from pulsar_migration.admin import RUNTIME_CONFIGURATION, AdminError
from pulsar_migration.replication.source_ttl import (
    CLIENT_TOLERANCE,
    MARKER_TOLERANCE,
    STRICT,
    UNKNOWN,
    applied_ttls,
    client_gap_tolerance,
    reader_guards,
)

from tests.unit.answering_admin import AnsweringAdmin

EVENTS = "/persistent/t/{}/__change_events/internalStats"



def test_namespaces_without_topic_policies_answer_for_their_topics() -> None:
    admin = AnsweringAdmin({
        RUNTIME_CONFIGURATION: {"ttlDurationDefaultInSeconds": "600"},
        "/namespaces/t/kept": {"message_ttl_in_seconds": 3600},
        "/namespaces/t/plain": {},  # no namespace policy: the broker's default
        "/namespaces/t/off": {"message_ttl_in_seconds": 0},
        EVENTS.format("off"): {"numberOfEntries": 0, "compactedLedger": {"entries": -1}},  # never an event
    })
    topics = ["persistent://t/kept/a", "persistent://t/kept/b", "persistent://t/plain/c", "persistent://t/off/d"]
    assert applied_ttls(admin, topics, 4) == {  # type: ignore[arg-type]
        "persistent://t/kept/a": 3600, "persistent://t/kept/b": 3600, "persistent://t/plain/c": 600,
        "persistent://t/off/d": 0}
    assert not any(call.endswith("/messageTTL") for call in admin.calls)


def test_topics_of_a_namespace_with_topic_policies_are_read_one_by_one() -> None:
    admin = AnsweringAdmin({
        RUNTIME_CONFIGURATION: {"ttlDurationDefaultInSeconds": "0"},
        "/namespaces/t/ns": {},
        EVENTS.format("ns"): {"numberOfEntries": 3},
        "/persistent/t/ns/own/messageTTL": 60,
        "/persistent/t/ns/none/messageTTL": 0,
        "/persistent/t/ns/broken/messageTTL": AdminError("HTTP 500", 500),
    })
    topics = ["persistent://t/ns/own", "persistent://t/ns/none", "persistent://t/ns/broken"]
    assert applied_ttls(admin, topics, 2) == {  # type: ignore[arg-type]
        "persistent://t/ns/own": 60, "persistent://t/ns/none": 0, "persistent://t/ns/broken": UNKNOWN}


def test_an_unreadable_broker_configuration_reads_every_topic() -> None:
    admin = AnsweringAdmin({RUNTIME_CONFIGURATION: AdminError("HTTP 403", 403), "/namespaces/t/ns": {},
                      "/persistent/t/ns/a/messageTTL": 0})
    assert applied_ttls(admin, ["persistent://t/ns/a"], 2) == {"persistent://t/ns/a": 0}  # type: ignore[arg-type]


def test_readers_are_watched_strictly_where_no_marker_can_be_stored() -> None:
    """A single entry passed over is let go only where the broker can store markers a reader never gets: the
    transaction coordinator on, or the namespace replicating elsewhere (snapshot markers), or topic policies that
    may say so; a TTL keeps the guard strict."""
    never = {"numberOfEntries": 0, "compactedLedger": {"entries": -1}}
    answers = {
        "/namespaces/t/local": {"replication_clusters": ["a"]},
        "/namespaces/t/geo": {"replication_clusters": ["a", "b"]},
        "/namespaces/t/ttl": {"replication_clusters": ["a", "b"], "message_ttl_in_seconds": 60},
        "/namespaces/t/policies": {"replication_clusters": ["a"]},
        EVENTS.format("local"): never, EVENTS.format("geo"): never, EVENTS.format("ttl"): never,
        EVENTS.format("policies"): {"numberOfEntries": 2},
        "/persistent/t/policies/p/messageTTL": 0,
    }
    topics = ["persistent://t/local/a", "persistent://t/geo/b", "persistent://t/ttl/c", "persistent://t/policies/p"]
    off = AnsweringAdmin({RUNTIME_CONFIGURATION: {"transactionCoordinatorEnabled": "false"}, **answers})
    assert reader_guards(off, topics, 2) == {  # type: ignore[arg-type]
        "persistent://t/local/a": (0, STRICT), "persistent://t/geo/b": (0, MARKER_TOLERANCE),
        "persistent://t/ttl/c": (60, STRICT), "persistent://t/policies/p": (0, MARKER_TOLERANCE)}
    on = AnsweringAdmin({RUNTIME_CONFIGURATION: {"transactionCoordinatorEnabled": "true"}, **answers})
    assert reader_guards(on, topics[:1], 2) == {"persistent://t/local/a": (0, MARKER_TOLERANCE)}  # type: ignore[arg-type]
    unknown = AnsweringAdmin({RUNTIME_CONFIGURATION: AdminError("HTTP 403", 403), **answers})
    # An unknown TTL is read as one: strict.
    assert reader_guards(unknown, topics[:1], 2) == {"persistent://t/local/a": (UNKNOWN, STRICT)}  # type: ignore[arg-type]


def test_the_python_clients_readers_let_a_run_of_chunks_go_where_no_ttl_is_set() -> None:
    assert client_gap_tolerance((60, STRICT)) == STRICT  # a TTL expires single entries: strict, as the engine
    assert client_gap_tolerance((UNKNOWN, STRICT)) == STRICT
    assert client_gap_tolerance((0, STRICT)) == CLIENT_TOLERANCE == client_gap_tolerance((0, MARKER_TOLERANCE))
