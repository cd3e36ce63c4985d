"""A copied topic with no retention and no subscription on the target (real brokers): the step names it in one
warning (log and report, dry run included), what it warns of happens, and the next run says that it did.
Pulsar keeps nothing for sure for such a topic; on the target, deduplication's cursor (the copy brings it) lets the
broker delete copied messages at the next ledger roll. A topic with a subscription (sync_metadata creates it at the
earliest entry) or in a namespace with retention keeps them all."""

from __future__ import annotations

import time
from pathlib import Path

from localdev.pulsar_local import LocalCluster
from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.metadata.step import run as sync_metadata
from pulsar_migration.stepjob import run_step

from tests.conftest import unique
from tests.integration.replication_helpers import client, create_topics, drain
from tests.integration.replication_helpers import replicate as step
from tests.integration.replication_helpers import replicate_report as report
from tests.integration.tenant_builders import write_spec
from tests.integration.test_replicate_topics import cleanup

ROUND = 1_500  # unbatched entries a round: past deduplication's snapshot interval (1,000 entries)


def produce(cluster: LocalCluster, topics: list[str], tag: str) -> None:
    c = client(cluster)
    try:
        for topic in topics:
            producer = c.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
            for i in range(ROUND):
                producer.send_async(f"{tag}-{i}".encode(), None)
            producer.flush()
            producer.close()
    finally:
        c.close()


def test_topics_the_target_may_trim_are_named_and_the_trim_is_real(
    cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin, admin_b: PulsarAdmin, tmp_path: Path,
) -> None:
    tenant = unique("it-trim-risk")
    admin_a.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": [cluster_a.name]})
    admin_a.put(f"/namespaces/{tenant}/bare")
    admin_a.put(f"/namespaces/{tenant}/kept")
    admin_a.post(f"/namespaces/{tenant}/kept/retention", {"retentionTimeInMinutes": 60, "retentionSizeInMB": -1})
    alone, held, kept = (f"persistent://{tenant}/{name}" for name in ("bare/alone", "bare/held", "kept/k"))
    create_topics(admin_a, alone, held, kept)
    admin_a.put(f"/persistent/{tenant}/bare/held/subscription/s1", {"ledgerId": -1, "entryId": -1})
    produce(cluster_a, [alone, held, kept], "first")
    spec = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b)
    try:
        assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(tmp_path)]) == 0
        assert step(spec, tmp_path / "dry", "--dry-run") == 0
        assert report(tmp_path / "dry")["details"]["trim_risk"]["topics"] == [alone]
        assert step(spec, tmp_path / "run") == 0
        risk = report(tmp_path / "run")["details"]["trim_risk"]
        assert risk["count"] == 1 and risk["topics"] == [alone]
        assert f"({tenant}/bare/alone)" in risk["warning"] and "set a retention policy" in risk["warning"]

        for topic in (alone, held, kept):  # a ledger roll on both sides (an unload; a restart does the same)
            for admin in (admin_a, admin_b):
                admin.put(f"{admin.topic_path(topic)}/unload")
        produce(cluster_a, [alone, held, kept], "second")
        assert step(spec, tmp_path / "run") == 0
        deadline = time.monotonic() + 150  # past the source's 2-minute retention check, should it come first
        while len(drain(cluster_b, alone)) == 2 * ROUND and time.monotonic() < deadline:
            time.sleep(1)
        # The target deleted copied messages behind the cursor (the source deletes its own at its retention
        # check, every 2 minutes: with it or before it, whichever comes first).
        assert len(drain(cluster_b, alone)) < 2 * ROUND
        for topic in (held, kept):
            assert len(drain(cluster_b, topic)) == 2 * ROUND

        # The next run sees it: the target no longer has the lowest ledger the map holds for that partition.
        assert step(spec, tmp_path / "run") == 0  # not a failure: the copy goes on from the map's end
        risk = report(tmp_path / "run")["details"]["trim_risk"]
        assert risk["trimmed_count"] == 1 and [t["topic"] for t in risk["trimmed"]] == [alone]
        assert risk["trimmed"][0]["first_ledger"] > risk["trimmed"][0]["map_first_ledger"]
        assert risk["trimmed_warning"].startswith(
            f"1 target partition(s) no longer hold messages this tool copied there (first: {alone}")
    finally:
        cleanup(tenant, admin_a, admin_b)

