"""After a copy, one look at the source's end (real broker) serves two checks: the source still holds the run's
bound (check_source_intact) and how many entries were written past it (lag_after, the report's lag_entries)."""

from __future__ import annotations

import pytest
from localdev.pulsar_local import LocalCluster
from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.replication.partition import PartitionJob, check_source_intact, lag_after
from pulsar_migration.replication.reading import ReadError

from tests.conftest import unique
from tests.integration.replication_helpers import CountingAdmin, source_tenant
from tests.integration.test_replicate_topics import cleanup, produce_unbatched


def test_one_look_at_the_source_end_checks_the_bound_and_counts_the_lag(
    cluster_a: LocalCluster, admin_a: PulsarAdmin,
) -> None:
    tenant = source_tenant(admin_a, cluster_a, unique("it-copy-lag"))
    topic = f"persistent://{tenant}/ns/t"
    admin = CountingAdmin(cluster_a.admin_url, name=cluster_a.name)
    try:
        produce_unbatched(cluster_a, topic, 5)
        bound = admin.last_entry(topic)
        assert bound is not None
        job = PartitionJob(topic, "ns/t", -1, bound)
        produce_unbatched(cluster_a, topic, 3)  # written after the run's bound, in the same ledger

        admin.gets.clear()
        last = check_source_intact(admin, job)
        assert last is not None and admin.gets["lastMessageId"] == 1
        assert lag_after(admin, job, last) == 3
        assert admin.gets["lastMessageId"] == 1  # the lag came from the same answer
        assert lag_after(admin, job) == 3 and admin.gets["lastMessageId"] == 2  # asked again when not handed one

        # Under the cutover's fence neither asks: the quiet check proves the source did not move.
        fenced = PartitionJob(topic, "ns/t", -1, bound, fenced=True)
        assert check_source_intact(admin, fenced) is None and lag_after(admin, fenced) == 0
        assert admin.gets["lastMessageId"] == 2

        admin_a.delete(f"{admin_a.topic_path(topic)}", params={"force": "true"})
        with pytest.raises(ReadError, match=r"deleted on the source during the run|ends before this run's bound"):
            check_source_intact(admin, job)
    finally:
        admin.close()
        cleanup(tenant, admin_a)
