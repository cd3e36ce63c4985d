"""Turning the target's deduplication on (real broker): the step returns only once every partition runs with it,
whether its namespace was just changed (a few partitions asked first, then all) or already on (each asked once)."""

from __future__ import annotations

from pathlib import Path

import requests
from localdev.pulsar_local import LocalCluster
from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.replication.step import enable_deduplication_on
from pulsar_migration.spec import MigrationSpec

from tests.conftest import unique
from tests.integration.replication_helpers import CountingAdmin, source_tenant
from tests.integration.tenant_builders import write_spec
from tests.integration.test_replicate_topics import cleanup


def deduplication_status(cluster: LocalCluster, topic: str) -> str | None:
    """As a plain HTTP client reads it from the broker."""
    answer = requests.get(f"{cluster.admin_url}/admin/v2/{topic.replace('://', '/')}/stats", timeout=30)
    answer.raise_for_status()
    return answer.json().get("deduplicationStatus")


def test_every_partition_runs_with_deduplication_when_the_step_goes_on(
    cluster_b: LocalCluster, cluster_a: LocalCluster, admin_b: PulsarAdmin, tmp_path: Path,
) -> None:
    tenant = source_tenant(admin_b, cluster_b, unique("it-dedup-on"), namespace="ns")
    admin_b.put(f"/namespaces/{tenant}/other")
    topics = [f"persistent://{tenant}/ns/t{i}" for i in range(60)]
    admin_b.put(f"/persistent/{tenant}/ns/parted/partitions", 4)
    topics += [f"persistent://{tenant}/ns/parted-partition-{i}" for i in range(4)]
    topics += [f"persistent://{tenant}/other/o{i}" for i in range(10)]
    spec = MigrationSpec.load(str(write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b)))
    admin = CountingAdmin(cluster_b.admin_url, name=cluster_b.name)
    try:
        for topic in topics:
            if "-partition-" not in topic:
                admin_b.put(admin_b.topic_path(topic))
        for topic in topics:  # loaded, without deduplication
            assert deduplication_status(cluster_b, topic) == "Disabled"

        changed = enable_deduplication_on(admin, spec, ["ns", "other"], topics)
        assert changed == ["ns", "other"]
        assert [t for t in topics if deduplication_status(cluster_b, t) != "Enabled"] == []
        assert admin.gets["stats"] >= len(topics)  # every partition was asked at least once

        admin.gets.clear()  # already on: nothing changed, each partition asked once
        assert enable_deduplication_on(admin, spec, ["ns", "other"], topics) == []
        assert admin.gets["stats"] == len(topics)
    finally:
        admin.close()
        cleanup(tenant, admin_b)
