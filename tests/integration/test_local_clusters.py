"""The local environment is made of real Pulsar brokers: produce/consume, admin calls, registration."""

from __future__ import annotations

import pulsar
from localdev.pulsar_local import LocalCluster
from pulsar_migration.admin import PulsarAdmin

from tests.conftest import unique


def test_both_clusters_healthy_and_each_lists_the_other(cluster_a: LocalCluster, cluster_b: LocalCluster,
                                                         admin_a: PulsarAdmin, admin_b: PulsarAdmin) -> None:
    assert admin_a.healthy() and admin_b.healthy()
    assert set(admin_a.clusters()) >= {cluster_a.name, cluster_b.name}
    assert set(admin_b.clusters()) >= {cluster_a.name, cluster_b.name}
    assert admin_a.cluster(cluster_b.name)["brokerServiceUrl"] == cluster_b.service_url
    assert admin_b.cluster(cluster_a.name)["brokerServiceUrl"] == cluster_a.service_url


def test_produce_1000_messages_on_cluster_a_and_read_them_back(cluster_a: LocalCluster,
                                                                 admin_a: PulsarAdmin) -> None:
    tenant = unique("it-produce")
    admin_a.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": [cluster_a.name]})
    admin_a.put(f"/namespaces/{tenant}/ns")
    topic = f"persistent://{tenant}/ns/events"
    client = pulsar.Client(cluster_a.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        consumer = client.subscribe(topic, "reader-check", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic, batching_enabled=True)
        sent = [f"message-{i}".encode() for i in range(1000)]
        for payload in sent:
            producer.send_async(payload, None)
        producer.flush()
        received = []
        for _ in range(1000):
            msg = consumer.receive(timeout_millis=10_000)
            received.append(msg.data())
            consumer.acknowledge(msg)
        assert received == sent
        consumer.close()  # flushes the client's grouped acknowledgments
        stats = admin_a.get(f"/persistent/{tenant}/ns/events/stats")
        assert stats["msgInCounter"] == 1000
        assert stats["subscriptions"]["reader-check"]["msgBacklog"] == 0
    finally:
        client.close()


def test_admin_creates_tenant_namespace_and_partitioned_topic_on_both(cluster_a: LocalCluster,
                                                                       cluster_b: LocalCluster,
                                                                       admin_a: PulsarAdmin,
                                                                       admin_b: PulsarAdmin) -> None:
    tenant = unique("it-admin")
    for admin in (admin_a, admin_b):
        admin.put(f"/tenants/{tenant}",
                  {"adminRoles": ["ops"], "allowedClusters": [cluster_a.name, cluster_b.name]})
        admin.put(f"/namespaces/{tenant}/ns1")
        admin.put(f"/persistent/{tenant}/ns1/orders/partitions", 3)
        assert tenant in admin.get("/tenants")
        assert admin.get(f"/tenants/{tenant}")["allowedClusters"] == [cluster_a.name, cluster_b.name]
        assert admin.get(f"/namespaces/{tenant}") == [f"{tenant}/ns1"]
        assert admin.get(f"/persistent/{tenant}/ns1/partitioned") == [f"persistent://{tenant}/ns1/orders"]
        assert admin.get(f"/persistent/{tenant}/ns1/orders/partitions")["partitions"] == 3
