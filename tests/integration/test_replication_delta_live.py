"""The cutover's delta count across ledgers, judged against a real broker's ledger list: a topic unloaded
between two batches of messages holds them in two ledgers."""

from __future__ import annotations

from localdev.pulsar_local import LocalCluster
from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.positions import Position
from pulsar_migration.replication.step import pending_across_ledgers

from tests.conftest import unique
from tests.integration.replication_helpers import client
from tests.integration.tenant_builders import drop_tenant


def test_entries_after_a_position_are_counted_across_a_reload(cluster_a: LocalCluster) -> None:
    admin = PulsarAdmin(cluster_a.admin_url, name=cluster_a.name)
    tenant = unique("it-delta")
    topic = f"persistent://{tenant}/ns/t"
    try:
        admin.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": [cluster_a.name]})
        admin.put(f"/namespaces/{tenant}/ns")
        c = client(cluster_a)
        producer = c.create_producer(topic, batching_enabled=False)
        first = [producer.send(f"a{i}".encode()) for i in range(30)]
        producer.close()
        admin.put(f"{admin.topic_path(topic)}/unload", expect_json=False)  # the reload opens a new ledger
        producer = c.create_producer(topic, batching_enabled=False)
        second = [producer.send(f"b{i}".encode()) for i in range(20)]
        producer.close()
        c.close()
        assert first[0].ledger_id() != second[0].ledger_id()
        after = Position(first[9].ledger_id(), first[9].entry_id())
        upper = admin.last_entry(topic)
        assert upper == Position(second[-1].ledger_id(), second[-1].entry_id())
        stats = admin.get(f"{admin.topic_path(topic)}/internalStats")
        assert pending_across_ledgers(stats, after, upper) == 20 + 20  # a10..a29, then all of b
        assert pending_across_ledgers(stats, after, Position(second[4].ledger_id(), second[4].entry_id())) == 25
    finally:
        drop_tenant(tenant, admin)
        admin.close()
