"""sync_progress over chunked messages (real brokers, a real copy, drained with fresh consumers of the plain
client on both clusters): a subscription whose first unacknowledged message is chunked must get all of it on the
target, whatever was acknowledged around it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pulsar
from localdev.pulsar_local import LocalCluster
from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.metadata.step import run as sync_metadata
from pulsar_migration.stepjob import run_step
from pyspark.sql import SparkSession

from tests.conftest import unique
from tests.integration.replication_helpers import client, replicate, source_tenant
from tests.integration.tenant_builders import write_spec
from tests.integration.test_replicate_topics import cleanup
from tests.integration.test_sync_progress import drain, receive_all, subscribe, sync

CHUNKED = 6 * 1024 * 1024  # two chunks at the broker's 5 MB
# name -> the payloads it acknowledges (by label) before the migration
ACKED = {
    "nothing": set(),  # the first unacknowledged message is the chunked first one, with nothing before it
    "after-first": {"a", "c", "large-2"},  # the same, with acknowledgements after it
    "prefix": {"large-1", "a"},  # the chunked second one follows an acknowledged prefix
}


def ack_and_migrate(consumers: dict[str, pulsar.Consumer], acks: Callable[[str, bytes], bool], tenant: str,
                    cluster_a: LocalCluster, cluster_b: LocalCluster, tmp_path: Path) -> None:
    """Each subscription acknowledges what `acks(name, payload)` says of everything it gets; then sync_metadata,
    replicate_topics and sync_progress into `tmp_path / "run"`."""
    for name, consumer in consumers.items():
        for m in receive_all(consumer):
            if acks(name, m.data()):
                consumer.acknowledge(m)
        consumer.close()
    migrate(tenant, cluster_a, cluster_b, tmp_path)


def migrate(tenant: str, cluster_a: LocalCluster, cluster_b: LocalCluster, tmp_path: Path) -> None:
    """sync_metadata, replicate_topics and sync_progress of `tenant` into `tmp_path / "run"`."""
    spec = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b)
    run_dir = tmp_path / "run"
    assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(run_dir)]) == 0
    assert replicate(spec, run_dir) == 0
    assert sync(spec, run_dir) == 0


def test_a_chunked_first_unacknowledged_message_is_delivered_whole(
    cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin, admin_b: PulsarAdmin,
    spark: SparkSession, tmp_path: Path,
) -> None:
    tenant = source_tenant(admin_a, cluster_a, unique("it-progress-chunk"))
    topic = f"persistent://{tenant}/ns/t"
    admin_a.put(f"/persistent/{tenant}/ns/t")
    payloads = {"large-1": b"1" + os.urandom(CHUNKED), "a": b"a", "b": b"b", "c": b"c",
                "large-2": b"2" + os.urandom(CHUNKED), "d": b"d"}
    try:
        c = client(cluster_a)
        consumers = {name: subscribe(c, topic, name, pulsar.ConsumerType.Shared) for name in ACKED}
        producer = c.create_producer(topic, chunking_enabled=True, batching_enabled=False)
        for data in payloads.values():
            producer.send(data)
        label = {data: name for name, data in payloads.items()}
        ack_and_migrate(consumers, lambda name, data: label[data] in ACKED[name], tenant, cluster_a, cluster_b,
                        tmp_path)
        c.close()

        for name, acked in ACKED.items():
            source = drain(cluster_a, topic, name, pulsar.ConsumerType.Shared)
            target = drain(cluster_b, topic, name, pulsar.ConsumerType.Shared)
            expected = {payloads[k] for k in payloads if k not in acked}
            assert set(source) == expected, name  # the premise: the source delivers what was left
            assert sorted(label[d] for d in target) == sorted(label[d] for d in source), name
    finally:
        cleanup(tenant, admin_a, admin_b)


# name -> the messages it acknowledges (by payload prefix) before the migration
def spanning_message(cluster: LocalCluster, c: pulsar.Client, topic: str, uuid: str) -> None:
    """"first", a message in six 10 KB chunks ("0123456789" repeated) with "between-0..2" stored between its third
    and fourth chunk, then "last" (test_copy_chunked_engine's spanning message, stored in one go)."""
    from tests.integration.test_copy_chunked_engine import begin_spanning_message, end_spanning_message

    producer = c.create_producer(topic, batching_enabled=False)
    end_spanning_message(cluster, producer, begin_spanning_message(cluster, producer, topic, uuid))


SPAN_ACKED = {
    "none": set(),
    "around": {b"first", b"between-0", b"between-2", b"last"},  # acked around the chunked one, not it
    "it": {b"0123456789"},  # the chunked one only: its first chunk lies before unacknowledged entries
    "all-but-last": {b"first", b"between-0", b"between-1", b"between-2", b"0123456789"},
}


def test_a_message_chunked_small_between_other_entries_keeps_every_subscriptions_progress(
    cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin, admin_b: PulsarAdmin,
    spark: SparkSession, tmp_path: Path,
) -> None:
    """A message in 10 KB chunks with another producer's entries between its chunks: the engine (since 2026-11-27)
    sends it whole at its last chunk, and the target, whose limit is 5 MB, stores it unchunked in that place. Every
    subscription's acknowledgements around it, of it, or of everything but the last message translate exactly."""
    tenant = source_tenant(admin_a, cluster_a, unique("it-progress-split"))
    topic = f"persistent://{tenant}/ns/t"
    admin_a.put(f"/persistent/{tenant}/ns/t")
    try:
        c = client(cluster_a)
        consumers = {name: subscribe(c, topic, name, pulsar.ConsumerType.Shared) for name in SPAN_ACKED}
        spanning_message(cluster_a, c, topic, "progress-span")

        def label(data: bytes) -> bytes:
            return data[:10] if data.startswith(b"0123456789") else data

        ack_and_migrate(consumers, lambda name, data: label(data) in SPAN_ACKED[name], tenant, cluster_a, cluster_b,
                        tmp_path)
        c.close()

        everything = {b"first", b"between-0", b"between-1", b"between-2", b"0123456789", b"last"}
        for name, acked in SPAN_ACKED.items():
            source = drain(cluster_a, topic, name, pulsar.ConsumerType.Shared)
            target = drain(cluster_b, topic, name, pulsar.ConsumerType.Shared)
            assert {label(d) for d in source} == everything - acked, name  # the premise
            assert sorted(label(d) for d in target.elements()) == sorted(label(d) for d in source.elements()), name
    finally:
        cleanup(tenant, admin_a, admin_b)


# name -> the payload it acknowledges cumulatively (Failover), having received everything before it
CUMULATIVE_AT = {
    "before-the-chunks": b"first",  # the message's first chunk stays unacknowledged: it is delivered
    "inside-the-chunks": b"between-2",  # its first chunks are acknowledged with the entries before between-2
}


def test_a_cumulative_acknowledgement_inside_a_chunked_message_translates_as_the_source_delivers(
    cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin, admin_b: PulsarAdmin,
    spark: SparkSession, tmp_path: Path,
) -> None:
    """A consumer acknowledges cumulatively an entry that lies between a chunked message's chunks (it got the
    entry before the message, which completes at its last chunk): the message's first chunks are acknowledged with
    it. On the source the subscription then gets the message's later chunks without their first one, which no
    client puts together: the message is never delivered. The target, where the message is one entry after the
    acknowledged one, must not deliver it either."""
    tenant = source_tenant(admin_a, cluster_a, unique("it-progress-cumul"))
    topic = f"persistent://{tenant}/ns/t"
    admin_a.put(f"/persistent/{tenant}/ns/t")
    try:
        c = client(cluster_a)
        consumers = {name: subscribe(c, topic, name, pulsar.ConsumerType.Failover) for name in CUMULATIVE_AT}
        spanning_message(cluster_a, c, topic, "progress-cumulative")

        for name, consumer in consumers.items():
            for m in receive_all(consumer):
                if m.data() == CUMULATIVE_AT[name]:
                    consumer.acknowledge_cumulative(m)
                    break
            consumer.close()
        migrate(tenant, cluster_a, cluster_b, tmp_path)
        c.close()

        def label(data: bytes) -> bytes:
            return data[:10] if data.startswith(b"0123456789") else data

        expected = {"before-the-chunks": [b"between-0", b"between-1", b"between-2", b"0123456789", b"last"],
                    "inside-the-chunks": [b"last"]}
        for name in CUMULATIVE_AT:
            source = drain(cluster_a, topic, name, pulsar.ConsumerType.Failover)
            target = drain(cluster_b, topic, name, pulsar.ConsumerType.Failover)
            assert sorted(label(d) for d in source.elements()) == sorted(expected[name]), name  # the premise
            assert sorted(label(d) for d in target.elements()) == sorted(expected[name]), name
    finally:
        cleanup(tenant, admin_a, admin_b)
