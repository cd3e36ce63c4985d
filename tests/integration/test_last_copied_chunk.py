"""The resume point when the target's last entry is a chunk: a reader started at a chunk after the first drops it
("uncached chunk"), so the tag has to come from the entry's stored metadata (real broker, real client)."""

from __future__ import annotations

import os

from localdev.pulsar_local import LocalCluster
from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.positions import Position
from pulsar_migration.replication.partition import last_copied

from tests.conftest import unique
from tests.integration.replication_helpers import client, source_tenant
from tests.integration.tenant_builders import drop_tenant


def test_a_chunked_last_message_gives_its_source_tag(admin_b: PulsarAdmin, cluster_b: LocalCluster) -> None:
    tenant = source_tenant(admin_b, cluster_b, unique("it-chunklast"))
    topic = f"persistent://{tenant}/ns/t"
    c = client(cluster_b)
    try:
        producer = c.create_producer(topic, chunking_enabled=True, batching_enabled=False)
        producer.send(b"small", properties={"__pm_source": "7:1:-1:0"})
        # Over the broker's 5 MB message size: stored as two chunks, the last entry the second.
        producer.send(os.urandom(7 * 1024 * 1024), properties={"__pm_source": "7:3:-1:0:7:2", "k": "v"})
        producer.close()
        last = admin_b.last_entry(topic)
        headers = admin_b.entry_headers(topic, last.ledger, last.entry)
        assert headers["X-Pulsar-chunk-id"] == "1"  # the premise: the last entry is a chunk after the first

        tag = last_copied(admin_b, c, topic)

        assert tag is not None
        assert tag.position == Position(7, 3)
        assert tag.encode() == "7:3:-1:0:7:2"
    finally:
        c.close()
        drop_tenant(tenant, admin_b)
