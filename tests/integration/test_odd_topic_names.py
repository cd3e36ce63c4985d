"""Topic names Pulsar accepts but that need care in URLs: a space, '+', '%', '?', '#', ':' and '=', non-ASCII
letters. Each topic holds Avro messages (the copy engine reads their schema over HTTP) and a subscription acked
half way; the whole migration must carry them exactly, through the engine and through the Python path."""

from __future__ import annotations

import json
from pathlib import Path

import pulsar
import pytest
from localdev.pulsar_local import LocalCluster
from pulsar.schema import AvroSchema
from pulsar_migration.admin import schema_seg
from pulsar_migration.metadata.step import run as sync_metadata
from pulsar_migration.stepjob import run_step
from pyspark.sql import SparkSession

from tests.conftest import unique
from tests.integration.replication_helpers import client, drain, replicate, replicate_report
from tests.integration.tenant_builders import write_spec
from tests.integration.test_replicate_topics import OrderV1, cleanup, content
from tests.integration.test_sync_progress import drains_differ, progress_report, sync

NAMES = ["with space", "plus+sign", "per%cent", "q?mark", "hash#tag", "colon:eq=ok", "ünïcode-заказы"]
SUBSCRIPTIONS = {"half": (pulsar.ConsumerType.Exclusive, "cumulative")}


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
            consumer = c.subscribe(topic, "half", initial_position=pulsar.InitialPosition.Earliest)
            producer = c.create_producer(topic, schema=AvroSchema(OrderV1), batching_enabled=False)
            for i in range(20):
                producer.send(OrderV1(id=i))
            producer.close()
            for i in range(10):
                message = consumer.receive(10_000)
                if i == 9:
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
            path = f"/schemas/{tenant}/ns/{schema_seg(name)}/schemas"
            assert len(admin_b.get(path)["getSchemaResponses"]) == 1, name
        assert replicate(spec, run_dir) == 0, replicate_report(run_dir).get("error")
        assert sync(spec, run_dir) == 0, progress_report(run_dir).get("error")
        for name in NAMES:
            topic = f"persistent://{tenant}/ns/{name}"
            assert content(drain(cluster_b, topic)) == content(drain(cluster_a, topic)), name
        differences, drained = drains_differ(cluster_a, cluster_b, tenant, SUBSCRIPTIONS, [f"ns/{n}" for n in NAMES])
        assert differences == {} and drained == 10 * len(NAMES)
    finally:
        cleanup(tenant, admin_a, admin_b)
        admin_a.close()
        admin_b.close()
