"""Topic and subscription names Pulsar accepts but that need care in URLs: a space, '+', '%', '?', '#', ':' and '=',
'|' (sync_metadata's key separator: a topic 'a|b' was split into 'a' and 'b|<name>' until 2026-11-29),
non-ASCII letters. Each topic holds Avro messages (the copy engine reads their schema over HTTP) and four
subscriptions, odd names among them, each acked to its own point; the whole migration must carry them exactly,
through the engine and through the Python path."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import pulsar
import pytest
from localdev.pulsar_local import LocalCluster
from pulsar.schema import AvroSchema
from pulsar_migration.admin import seg, seg_twice
from pulsar_migration.metadata.step import run as sync_metadata
from pulsar_migration.stepjob import run_step
from pyspark.sql import SparkSession

from tests.conftest import unique
from tests.integration.replication_helpers import client, drain
from tests.integration.tenant_builders import write_spec
from tests.integration.test_replicate_topics import OrderV1, cleanup, content
from tests.integration.test_sync_progress import drains_differ, progress_report, sync
from tests.integration.test_tls import ENGINES, CopiedTenant, copy_per_engine

NAMES = ["with space", "plus+sign", "per%cent", "q?mark", "hash#tag", "colon:eq=ok", "ünïcode-заказы", "bar|pipe"]
# Subscription names decode twice in a topic's /subscription/ paths too: 'a+b' was created as 'a b' on the target.
SUBSCRIPTIONS = {name: (pulsar.ConsumerType.Exclusive, "cumulative") for name in ("half", "a+b", "p%c", "sp ace")}


@dataclass
class OddMigration:
    copied: CopiedTenant
    schemas_created: int  # sync_metadata's schema.CREATE count
    # namespace -> topic name -> (schema versions, subscriptions) on the target right after sync_metadata
    after_metadata: dict[str, dict[str, tuple[int, list[str]]]]


@pytest.fixture(scope="module")
def odd_migration(cluster_a: LocalCluster, cluster_b: LocalCluster, spark: SparkSession,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[OddMigration]:
    """A tenant on cluster-a with every name in one namespace per engine, migrated to cluster-b: sync_metadata once
    (the target's schemas and subscriptions noted right after it), each engine's namespace copied by that engine,
    one sync_progress over both (neither sync_metadata nor sync_progress depends on the engine). Each step exits 0."""
    admin_a, admin_b = cluster_a.admin(timeout_s=30), cluster_b.admin(timeout_s=30)
    tenant = unique("it-odd")
    try:
        admin_a.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": [cluster_a.name]})
        c = client(cluster_a)
        for ns in ENGINES:
            admin_a.put(f"/namespaces/{tenant}/{ns}")
            for name in NAMES:
                topic = f"persistent://{tenant}/{ns}/{name}"
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
            assert sorted(admin_a.get(f"/persistent/{tenant}/{ns}")) == sorted(
                f"persistent://{tenant}/{ns}/{n}" for n in NAMES)
        c.close()

        spec = write_spec(tmp_path_factory.mktemp("odd") / "spec.json", tenant, cluster_a, cluster_b)
        run_dir = spec.with_name("run")
        assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(run_dir)]) == 0
        schemas_created = json.loads((run_dir / "sync_metadata.json").read_text())["counts"]["schema.CREATE"]
        after_metadata = {ns: {name: (
            len(admin_b.get(f"/schemas/{tenant}/{ns}/{seg_twice(name)}/schemas")["getSchemaResponses"]),
            sorted(admin_b.get(f"/persistent/{tenant}/{ns}/{seg(name)}/subscriptions"))) for name in NAMES}
            for ns in ENGINES}
        copied = copy_per_engine(tenant, spec, run_dir)
        assert sync(spec, run_dir) == 0, progress_report(run_dir).get("error")
        yield OddMigration(copied, schemas_created, after_metadata)
    finally:
        cleanup(tenant, admin_a, admin_b)
        admin_a.close()
        admin_b.close()


@pytest.mark.parametrize("engine", ENGINES)
def test_topics_with_names_that_need_escaping_are_migrated_exactly(
        odd_migration: OddMigration, cluster_a: LocalCluster, cluster_b: LocalCluster, engine: str) -> None:
    tenant = odd_migration.copied.tenant
    # Every topic's schema found on the source and created on the target (read once encoded, two of them were
    # not found and silently had none).
    assert odd_migration.schemas_created == len(NAMES) * len(ENGINES)
    for name, (schemas, subscriptions) in odd_migration.after_metadata[engine].items():
        assert schemas == 1, name
        assert subscriptions == sorted(SUBSCRIPTIONS), name
    copy = odd_migration.copied.copies[engine]
    assert copy["details"]["copy_engine"] == engine
    for name in NAMES:
        topic = f"persistent://{tenant}/{engine}/{name}"
        assert content(drain(cluster_b, topic)) == content(drain(cluster_a, topic)), name
    differences, drained = drains_differ(cluster_a, cluster_b, tenant, SUBSCRIPTIONS, [f"{engine}/{n}" for n in NAMES])
    assert differences == {} and drained == sum(20 - 5 - k for k in range(len(SUBSCRIPTIONS))) * len(NAMES)
