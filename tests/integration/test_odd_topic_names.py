"""Topic and subscription names Pulsar accepts but that need care in URLs: a space, '+', '%', '?', '#', ':' and '=',
non-ASCII letters. Each topic holds Avro messages (the copy engine reads their schema over HTTP) and four
subscriptions, odd names among them, each acked to its own point; the whole migration must carry them exactly,
through the engine and through the Python path."""

from __future__ import annotations

import json
from pathlib import Path

import pulsar
import pytest
from localdev.pulsar_local import LocalCluster
from pulsar.schema import AvroSchema
from pulsar_migration.admin import seg, seg_twice
from pulsar_migration.metadata.step import run as sync_metadata
from pulsar_migration.stepjob import run_step
from pyspark.sql import SparkSession

from tests.conftest import unique
from tests.integration.replication_helpers import client, drain, replicate, replicate_report
from tests.integration.tenant_builders import write_spec
from tests.integration.test_replicate_topics import OrderV1, cleanup, content
from tests.integration.test_sync_progress import drains_differ, progress_report, sync

NAMES = ["with space", "plus+sign", "per%cent", "q?mark", "hash#tag", "colon:eq=ok", "ünïcode-заказы"]
# Subscription names decode twice in a topic's /subscription/ paths too: 'a+b' was created as 'a b' on the target.
SUBSCRIPTIONS = {name: (pulsar.ConsumerType.Exclusive, "cumulative") for name in ("half", "a+b", "p%c", "sp ace")}


@pytest.mark.parametrize("engine", ["java", "python"])
def test_topics_with_names_that_need_escaping_are_migrated_exactly(
        cluster_a: LocalCluster, cluster_b: LocalCluster, spark: SparkSession, tmp_path: Path, engine: str) -> None:
    admin_a, admin_b = cluster_a.admin(timeout_s=30), cluster_b.admin(timeout_s=30)
    tenant = unique(f"it-odd-{engine}")
    try:
        admin_a.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": [cluster_a.name]})
        admin_a.put(f"/namespaces/{tenant}/ns")
        c = client(cluster_a)
        for name in NAMES:
            topic = f"persistent://{tenant}/ns/{name}"
            consumers = [c.subscribe(topic, sub, initial_position=pulsar.InitialPosition.Earliest)
                         for sub in SUBSCRIPTIONS]
            producer = c.create_producer(topic, schema=AvroSchema(OrderV1), batching_enabled=False)
            for i in range(20):
                producer.send(OrderV1(id=i))
            producer.close()
            for k, consumer in enumerate(consumers):  # each subscription acked up to its own point
                for _ in range(5 + k):
                    message = consumer.receive(10_000)
                consumer.acknowledge_cumulative(message)
                consumer.close()
        c.close()
        assert sorted(admin_a.get(f"/persistent/{tenant}/ns")) == sorted(f"persistent://{tenant}/ns/{n}" for n in NAMES)

        spec = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b, options={"copy_engine": engine})
        run_dir = tmp_path / "run"
        assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(run_dir)]) == 0
        # Every topic's schema found on the source and created on the target (read once encoded, two of them were
        # not found and silently had none).
        assert json.loads((run_dir / "sync_metadata.json").read_text())["counts"]["schema.CREATE"] == len(NAMES)
        for name in NAMES:
            path = f"/schemas/{tenant}/ns/{seg_twice(name)}/schemas"
            assert len(admin_b.get(path)["getSchemaResponses"]) == 1, name
            assert sorted(admin_b.get(f"/persistent/{tenant}/ns/{seg(name)}/subscriptions")) == sorted(SUBSCRIPTIONS)
        assert replicate(spec, run_dir) == 0, replicate_report(run_dir).get("error")
        assert sync(spec, run_dir) == 0, progress_report(run_dir).get("error")
        for name in NAMES:
            topic = f"persistent://{tenant}/ns/{name}"
            assert content(drain(cluster_b, topic)) == content(drain(cluster_a, topic)), name
        differences, drained = drains_differ(cluster_a, cluster_b, tenant, SUBSCRIPTIONS, [f"ns/{n}" for n in NAMES])
        assert differences == {} and drained == sum(20 - 5 - k for k in range(len(SUBSCRIPTIONS))) * len(NAMES)
    finally:
        cleanup(tenant, admin_a, admin_b)
        admin_a.close()
        admin_b.close()
