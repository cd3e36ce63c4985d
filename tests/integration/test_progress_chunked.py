"""sync_progress over chunked messages (real brokers, a real copy, drained with fresh consumers of the plain
client on both clusters): a subscription whose first unacknowledged message is chunked must get all of it on the
target, whatever was acknowledged around it.

One tenant holds the three cases, a topic each, migrated once (sync_metadata, replicate_topics, sync_progress):
each case's subscriptions are translated on their own topic, so sharing the run changes nothing a case judges."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pulsar
import pytest
from localdev.pulsar_local import LocalCluster
from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.metadata.step import run as sync_metadata
from pulsar_migration.stepjob import run_step
from pyspark.sql import SparkSession

from tests.conftest import unique
from tests.integration.replication_helpers import client, replicate, source_tenant
from tests.integration.tenant_builders import write_spec
from tests.integration.test_replicate_topics import cleanup
from tests.integration.test_sync_progress import (
    PATIENT_FIRST_MS,
    PATIENT_IDLE_MS,
    drain,
    receive_all,
    subscribe,
    sync,
)

CHUNKED = 6 * 1024 * 1024  # two chunks at the broker's 5 MB
# name -> the payloads it acknowledges (by label) before the migration
ACKED = {
    "nothing": set(),  # the first unacknowledged message is the chunked first one, with nothing before it
    "after-first": {"a", "c", "large-2"},  # the same, with acknowledgements after it
    "prefix": {"large-1", "a"},  # the chunked second one follows an acknowledged prefix
}
# name -> the messages it acknowledges (by payload prefix) before the migration
SPAN_ACKED = {
    "none": set(),
    "around": {b"first", b"between-0", b"between-2", b"last"},  # acked around the chunked one, not it
    "it": {b"0123456789"},  # the chunked one only: its first chunk lies before unacknowledged entries
    "all-but-last": {b"first", b"between-0", b"between-1", b"between-2", b"0123456789"},
}
# name -> the payload it acknowledges cumulatively (Failover), having received everything before it
CUMULATIVE_AT = {
    "before-the-chunks": b"first",  # the message's first chunk stays unacknowledged: it is delivered
    "inside-the-chunks": b"between-2",  # its first chunks are acknowledged with the entries before between-2
}
WHOLE, SPAN, CUMULATIVE = "ns/whole", "ns/span", "ns/cumulative"


def migrate(tenant: str, cluster_a: LocalCluster, cluster_b: LocalCluster, tmp_path: Path) -> None:
    """sync_metadata, replicate_topics and sync_progress of `tenant` into `tmp_path / "run"`."""
    spec = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b)
    run_dir = tmp_path / "run"
    assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(run_dir)]) == 0
    assert replicate(spec, run_dir) == 0
    assert sync(spec, run_dir) == 0


def spanning_message(cluster: LocalCluster, c: pulsar.Client, topic: str, uuid: str) -> None:
    """"first", a message in six 10 KB chunks ("0123456789" repeated) with "between-0..2" stored between its third
    and fourth chunk, then "last" (test_copy_chunked_engine's spanning message, stored in one go)."""
    from tests.integration.test_copy_chunked_engine import begin_spanning_message, end_spanning_message

    producer = c.create_producer(topic, batching_enabled=False)
    end_spanning_message(cluster, producer, begin_spanning_message(cluster, producer, topic, uuid))


def span_label(data: bytes) -> bytes:
    return data[:10] if data.startswith(b"0123456789") else data


def acknowledge(consumer: pulsar.Consumer, acks: Callable[[bytes], bool], cumulative_at: bytes | None = None) -> None:
    """Acknowledges what `acks(payload)` says of everything the subscription gets (or, with `cumulative_at`,
    that payload cumulatively, having received everything before it); then closes the consumer."""
    for m in receive_all(consumer, PATIENT_FIRST_MS, PATIENT_IDLE_MS):  # a few messages: wait for each patiently
        if cumulative_at is not None:
            if m.data() == cumulative_at:
                consumer.acknowledge_cumulative(m)
                break
        elif acks(m.data()):
            consumer.acknowledge(m)
    consumer.close()


@pytest.fixture(scope="module")
def migrated(cluster_a: LocalCluster, cluster_b: LocalCluster, spark: SparkSession,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The three cases' topics written and acknowledged on the source (the subscriptions side by side: each waits
    out its idle time), then the tenant migrated once."""
    admin_a = PulsarAdmin(cluster_a.admin_url, name=cluster_a.name)
    admin_b = PulsarAdmin(cluster_b.admin_url, name=cluster_b.name)
    tenant = source_tenant(admin_a, cluster_a, unique("it-progress-chunk"))
    topics = {case: f"persistent://{tenant}/{case}" for case in (WHOLE, SPAN, CUMULATIVE)}
    for case in topics:
        admin_a.put(f"/persistent/{tenant}/{case}")
    payloads = {"large-1": b"1" + os.urandom(CHUNKED), "a": b"a", "b": b"b", "c": b"c",
                "large-2": b"2" + os.urandom(CHUNKED), "d": b"d"}
    label = {data: name for name, data in payloads.items()}
    try:
        c = client(cluster_a)
        whole = {n: subscribe(c, topics[WHOLE], n, pulsar.ConsumerType.Shared) for n in ACKED}
        span = {n: subscribe(c, topics[SPAN], n, pulsar.ConsumerType.Shared) for n in SPAN_ACKED}
        cumulative = {n: subscribe(c, topics[CUMULATIVE], n, pulsar.ConsumerType.Failover) for n in CUMULATIVE_AT}
        producer = c.create_producer(topics[WHOLE], chunking_enabled=True, batching_enabled=False)
        for data in payloads.values():
            producer.send(data)
        spanning_message(cluster_a, c, topics[SPAN], "progress-span")
        spanning_message(cluster_a, c, topics[CUMULATIVE], "progress-cumulative")
        work = [(consumer, lambda d, n=n: label[d] in ACKED[n], None) for n, consumer in whole.items()]
        work += [(consumer, lambda d, n=n: span_label(d) in SPAN_ACKED[n], None) for n, consumer in span.items()]
        work += [(consumer, lambda d: False, CUMULATIVE_AT[n]) for n, consumer in cumulative.items()]
        with ThreadPoolExecutor(len(work)) as pool:
            list(pool.map(lambda w: acknowledge(*w), work))
        migrate(tenant, cluster_a, cluster_b, tmp_path_factory.mktemp("progress-chunked"))
        c.close()
        yield {"topics": topics, "payloads": payloads, "label": label}
    finally:
        cleanup(tenant, admin_a, admin_b)
        admin_a.close()
        admin_b.close()


def drains(cluster_a: LocalCluster, cluster_b: LocalCluster, topic: str, names: list[str],
           kind: pulsar.ConsumerType) -> dict[str, tuple[Counter[bytes], Counter[bytes]]]:
    """Each subscription drained on the source and on the target, side by side, waiting patiently for each of
    their few messages: name -> (source, target)."""
    with ThreadPoolExecutor(2 * len(names)) as pool:
        got = list(pool.map(lambda job: drain(job[0], topic, job[1], kind, patient=True),
                            [(cluster, name) for name in names for cluster in (cluster_a, cluster_b)]))
    return {name: (got[2 * i], got[2 * i + 1]) for i, name in enumerate(names)}


def test_a_chunked_first_unacknowledged_message_is_delivered_whole(
        migrated: dict[str, Any], cluster_a: LocalCluster, cluster_b: LocalCluster) -> None:
    payloads, label = migrated["payloads"], migrated["label"]
    drained = drains(cluster_a, cluster_b, migrated["topics"][WHOLE], list(ACKED), pulsar.ConsumerType.Shared)
    for name, acked in ACKED.items():
        source, target = drained[name]
        expected = {payloads[k] for k in payloads if k not in acked}
        assert set(source) == expected, name  # the premise: the source delivers what was left
        assert sorted(label[d] for d in target) == sorted(label[d] for d in source), name


def test_a_message_chunked_small_between_other_entries_keeps_every_subscriptions_progress(
        migrated: dict[str, Any], cluster_a: LocalCluster, cluster_b: LocalCluster) -> None:
    """A message in 10 KB chunks with another producer's entries between its chunks: the engine (since 2026-11-27)
    sends it whole at its last chunk, and the target, whose limit is 5 MB, stores it unchunked in that place. Every
    subscription's acknowledgements around it, of it, or of everything but the last message translate exactly."""
    drained = drains(cluster_a, cluster_b, migrated["topics"][SPAN], list(SPAN_ACKED), pulsar.ConsumerType.Shared)
    everything = {b"first", b"between-0", b"between-1", b"between-2", b"0123456789", b"last"}
    for name, acked in SPAN_ACKED.items():
        source, target = drained[name]
        assert {span_label(d) for d in source} == everything - acked, name  # the premise
        assert sorted(span_label(d) for d in target.elements()) == sorted(span_label(d) for d in source.elements()), \
            name


def test_a_cumulative_acknowledgement_inside_a_chunked_message_translates_as_the_source_delivers(
        migrated: dict[str, Any], cluster_a: LocalCluster, cluster_b: LocalCluster) -> None:
    """A consumer acknowledges cumulatively an entry that lies between a chunked message's chunks (it got the
    entry before the message, which completes at its last chunk): the message's first chunks are acknowledged with
    it. On the source the subscription then gets the message's later chunks without their first one, which no
    client puts together: the message is never delivered. The target, where the message is one entry after the
    acknowledged one, must not deliver it either."""
    drained = drains(cluster_a, cluster_b, migrated["topics"][CUMULATIVE], list(CUMULATIVE_AT),
                     pulsar.ConsumerType.Failover)
    expected = {"before-the-chunks": [b"between-0", b"between-1", b"between-2", b"0123456789", b"last"],
                "inside-the-chunks": [b"last"]}
    for name in CUMULATIVE_AT:
        source, target = drained[name]
        assert sorted(span_label(d) for d in source.elements()) == sorted(expected[name]), name  # the premise
        assert sorted(span_label(d) for d in target.elements()) == sorted(expected[name]), name
