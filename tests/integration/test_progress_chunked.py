"""sync_progress over chunked messages (real brokers, a real copy, drained with fresh consumers of the plain
client on both clusters): a subscription whose first unacknowledged message is chunked must get all of it on the
target, whatever was acknowledged around it."""

from __future__ import annotations

import os
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
        for name, consumer in consumers.items():
            for m in receive_all(consumer):
                if label[m.data()] in ACKED[name]:
                    consumer.acknowledge(m)
            consumer.close()
        c.close()
        spec = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b)
        run_dir = tmp_path / "run"
        assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(run_dir)]) == 0
        assert replicate(spec, run_dir) == 0
        assert sync(spec, run_dir) == 0

        for name, acked in ACKED.items():
            source = drain(cluster_a, topic, name, pulsar.ConsumerType.Shared)
            target = drain(cluster_b, topic, name, pulsar.ConsumerType.Shared)
            expected = {payloads[k] for k in payloads if k not in acked}
            assert set(source) == expected, name  # the premise: the source delivers what was left
            assert sorted(label[d] for d in target) == sorted(label[d] for d in source), name
    finally:
        cleanup(tenant, admin_a, admin_b)
