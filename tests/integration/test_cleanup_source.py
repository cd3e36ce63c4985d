"""cleanup_source with geo-replication configured (the case where a wrong order deletes the target's topics):
a tenant migrated in geo mode and switched through the lookup service; the dry run changes nothing, the real
cleanup removes the tenant from the source only, and the target keeps every topic and message. The real
cleanup first fails after deleting the topics (the broker refusing the namespace's delete, as a loaded broker
once did with HTTP 422 for longer than the step waits): the re-run finishes the namespace and the tenant."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from localdev.pulsar_local import LocalCluster
from pulsar_migration.admin import AdminError, PulsarAdmin
from pulsar_migration.cleanup import step as cleanup_step
from pulsar_migration.cleanup.step import STEP, add_args, run
from pulsar_migration.metadata.step import run as sync_metadata
from pulsar_migration.replication.partition import COPY_SOURCE_PROPERTY, COPY_TARGET_PROPERTY
from pulsar_migration.stepjob import run_step
from pulsar_migration.switch.step import run as switch
from pyspark.sql import SparkSession

from tests.conftest import unique
from tests.integration.lookup_helpers import TOKEN, start_service
from tests.integration.replication_helpers import client, drain, replicate
from tests.integration.tenant_builders import write_spec
from tests.integration.test_replicate_geo import teardown
from tests.integration.test_sync_progress import sync


def cleanup(spec: Path, run_dir: Path, *extra: str) -> int:
    return run_step(STEP, run, ["--spec", str(spec), "--run-dir", str(run_dir), *extra], add_args=add_args)


def test_cleanup_after_a_geo_switch_touches_only_the_source(
        cluster_a: LocalCluster, cluster_b: LocalCluster, spark: SparkSession, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    admin_a = PulsarAdmin(cluster_a.admin_url, name=cluster_a.name)
    admin_b = PulsarAdmin(cluster_b.admin_url, name=cluster_b.name)
    tenant = unique("it-cleanup")
    service = start_service(tmp_path, [cluster_a, cluster_b], cluster_a)
    monkeypatch.setenv("PM_TEST_LOOKUP_TOKEN", TOKEN)
    topics = [f"persistent://{tenant}/ns/orders-partition-0", f"persistent://{tenant}/ns/orders-partition-1",
              f"persistent://{tenant}/ns/audit"]
    try:
        admin_a.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": [cluster_a.name]})
        admin_a.put(f"/namespaces/{tenant}/ns")
        admin_a.post(f"/namespaces/{tenant}/ns/retention", {"retentionTimeInMinutes": 60, "retentionSizeInMB": 64})
        admin_a.put(f"/persistent/{tenant}/ns/orders/partitions", 2)
        admin_a.put(f"/persistent/{tenant}/ns/audit")
        c = client(cluster_a)
        consumer = c.subscribe(f"persistent://{tenant}/ns/orders", "billing")
        for name in ("orders", "audit"):
            producer = c.create_producer(f"persistent://{tenant}/ns/{name}", batching_enabled=False)
            for i in range(300):
                producer.send_async(f"{name}-{i}".encode(), None, partition_key=f"k{i % 7}")
            producer.flush()
        consumer.close()
        c.close()
        spec = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b, replication={"mode": "geo"},
                          options={"geo_timeout_s": 120},
                          lookup={"url": service.url, "token_env": "PM_TEST_LOOKUP_TOKEN"})
        run_dir = tmp_path / "run"
        args = ["--spec", str(spec), "--run-dir", str(run_dir)]
        # Before any switch: refused, nothing deleted.
        assert cleanup(spec, run_dir) == 1
        assert "switch" in json.loads((run_dir / f"{STEP}.json").read_text())["error"]
        assert run_step("sync_metadata", sync_metadata, args) == 0
        assert replicate(spec, run_dir) == 0
        for topic in topics:  # geo mode marks both sides too: a later cleanup may meet the target's trimming
            assert admin_b.get(f"{admin_b.topic_path(topic)}/properties") == {COPY_TARGET_PROPERTY: cluster_a.name}
            assert admin_a.get(f"{admin_a.topic_path(topic)}/properties") == {COPY_SOURCE_PROPERTY: cluster_b.name}
        assert sync(spec, run_dir) == 0
        assert run_step("switch_lookup", switch, args) == 0
        assert sorted(admin_a.get(f"/namespaces/{tenant}/ns/replication")) == [cluster_a.name, cluster_b.name]
        target_before = {t: drain(cluster_b, t) for t in topics}
        assert all(len(v) > 0 for v in target_before.values())
        target_policies = admin_b.get(f"/namespaces/{tenant}/ns")

        assert cleanup(spec, run_dir, "--dry-run") == 0
        dry = json.loads((run_dir / f"{STEP}.json").read_text())
        assert dry["verdict"] == "planned" and dry["details"]["plan"]["replication_to_source_only"] == ["ns"]
        assert sorted(admin_a.get(f"/persistent/{tenant}/ns/partitioned")) == [f"persistent://{tenant}/ns/orders"]

        # A topic created on the source while the verification ran is not deleted unverified: refused, nothing
        # deleted (before, the delete list was read again after the verification and took it along).
        verified = cleanup_step.verify

        def verify_then_a_topic_arrives(*args: object) -> None:
            verified(*args)  # type: ignore[arg-type]
            admin_a.put(f"/persistent/{tenant}/ns/late")

        with monkeypatch.context() as patched:
            patched.setattr(cleanup_step, "verify", verify_then_a_topic_arrives)
            assert cleanup(spec, run_dir) == 1
        assert "changed since they were verified" in json.loads((run_dir / f"{STEP}.json").read_text())["error"]
        assert f"persistent://{tenant}/ns/late" in admin_a.get(f"/persistent/{tenant}/ns")  # (empty: verified next)
        # The route check right before the deletes failing (the lookup service briefly away): nothing deleted, and
        # the marker that refuses a rollback is gone again (the way back is intact).
        asked: list[str] = []

        def away_the_second_time(spec: object) -> None:
            asked.append("route")
            if len(asked) > 1:
                raise cleanup_step.CleanupError("lookup service at ... is unreachable: ConnectionError")

        with monkeypatch.context() as patched:
            patched.setattr(cleanup_step, "check_route", away_the_second_time)
            assert cleanup(spec, run_dir) == 1
        assert len(asked) == 2 and not (run_dir / cleanup_step.CLEANUP_STARTED).exists()
        assert sorted(admin_a.get(f"/persistent/{tenant}/ns/partitioned")) == [f"persistent://{tenant}/ns/orders"]

        def refused(admin: PulsarAdmin, tenant: str, ns: str) -> None:
            raise AdminError(f"DELETE /namespaces/{tenant}/{ns} on {admin.name} failed with HTTP 422: HTTP 422 {{}}",
                             422)

        with monkeypatch.context() as patched:
            patched.setattr(cleanup_step, "delete_namespace", refused)
            assert cleanup(spec, run_dir, "--delete-tenant") == 1
        failed = json.loads((run_dir / f"{STEP}.json").read_text())
        assert "HTTP 422" in failed["error"] and "\n" not in failed["error"]
        assert failed["counts"]["topics_deleted"] == 3 and failed["counts"]["messages_verified"] == 600
        assert admin_a.get(f"/namespaces/{tenant}") == [f"{tenant}/ns"]  # topics gone, namespace and tenant left

        assert cleanup(spec, run_dir, "--delete-tenant") == 0
        report = json.loads((run_dir / f"{STEP}.json").read_text())
        assert report["verdict"] == "ok" and report["details"]["namespaces_deleted"] == ["ns"]
        assert report["details"]["tenant_deleted"] is True
        assert tenant not in admin_a.get("/tenants")  # gone from the source
        assert cleanup(spec, run_dir, "--delete-tenant") == 0  # killed before its report: the re-run finds it done
        assert json.loads((run_dir / f"{STEP}.json").read_text())["details"]["already_clean"] is True
        for topic in topics:  # the target keeps every message, the subscription and its policies
            assert drain(cluster_b, topic) == target_before[topic], topic
        assert "billing" in admin_b.get(f"/persistent/{tenant}/ns/orders-partition-0/subscriptions")
        assert admin_b.get(f"/namespaces/{tenant}/ns") == target_policies
        assert admin_b.get(f"/namespaces/{tenant}/ns/replication") == [cluster_b.name]
    finally:
        service.stop()
        teardown(tenant, admin_a, admin_b, cluster_a.name)
        admin_a.close()
        admin_b.close()
        os.environ.pop("PM_TEST_LOOKUP_TOKEN", None)


def test_cleanup_verifies_a_source_whose_consumed_ledgers_were_trimmed(
        cluster_a: LocalCluster, cluster_b: LocalCluster, spark: SparkSession, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Copy mode, no retention, unbatched messages. The subscription acknowledged the source's first ledger before
    the switch and the broker trimmed it: the source then starts at its second ledger while the target holds both,
    and cleanup compares the source with the target's copies of the same entries (the position map), not with the
    target's first messages. Then the target's clients consume its first ledger and the broker trims that: the
    copies gone there are counted, the rest compared. A stray source message and a target topic created again are
    refused."""
    admin_a = PulsarAdmin(cluster_a.admin_url, name=cluster_a.name)
    admin_b = PulsarAdmin(cluster_b.admin_url, name=cluster_b.name)
    tenant = unique("it-cleanup-trim")
    topic = f"persistent://{tenant}/ns/t"
    service = start_service(tmp_path, [cluster_a, cluster_b], cluster_a)
    monkeypatch.setenv("PM_TEST_LOOKUP_TOKEN", TOKEN)

    def send(cluster: LocalCluster, payloads: list[bytes]) -> None:
        c = client(cluster)
        producer = c.create_producer(topic, batching_enabled=False)
        for payload in payloads:
            producer.send(payload)
        c.close()

    def consume(cluster: LocalCluster, count: int) -> list[bytes]:
        c = client(cluster)
        consumer = c.subscribe(topic, "s")
        got = [consumer.receive(10_000) for _ in range(count)]
        for m in got:
            consumer.acknowledge(m)
        c.close()
        return [m.data() for m in got]

    def cleanup_report() -> dict:
        return json.loads((run_dir / f"{STEP}.json").read_text())

    first = [f"first-{i}".encode() for i in range(20)]
    second = [f"second-{i}".encode() for i in range(20)]
    try:
        admin_a.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": [cluster_a.name]})
        admin_a.put(f"/namespaces/{tenant}/ns")
        admin_a.put(f"/persistent/{tenant}/ns/t")
        admin_a.put(f"/persistent/{tenant}/ns/t/subscription/s", {"ledgerId": -1, "entryId": -1})
        send(cluster_a, first)
        admin_a.put(f"{admin_a.topic_path(topic)}/unload")  # the next message starts the source's second ledger
        send(cluster_a, second[:10])
        spec = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b,
                          lookup={"url": service.url, "token_env": "PM_TEST_LOOKUP_TOKEN"})
        run_dir = tmp_path / "run"
        args = ["--spec", str(spec), "--run-dir", str(run_dir)]
        assert run_step("sync_metadata", sync_metadata, args) == 0
        assert replicate(spec, run_dir) == 0
        admin_b.put(f"{admin_b.topic_path(topic)}/unload")  # the next copies start the target's second ledger
        send(cluster_a, second[10:])
        assert replicate(spec, run_dir) == 0
        assert sync(spec, run_dir) == 0
        assert consume(cluster_a, 20) == first  # the source's first ledger, acknowledged before the switch
        assert run_step("switch_lookup", switch, args) == 0
        admin_a.put(f"{admin_a.topic_path(topic)}/unload")
        admin_a.post(f"{admin_a.topic_path(topic)}/trim")
        assert [m["data"] for m in drain(cluster_a, topic)] == second
        assert [m["data"] for m in drain(cluster_b, topic)] == first + second

        assert cleanup(spec, run_dir, "--dry-run") == 0, cleanup_report()["error"]
        assert cleanup_report()["counts"]["messages_verified"] == 20

        # After the switch the target's clients consume its first ledger (the copies of first-* and second-0..9);
        # with deduplication off for a moment (its cursor holds the ledger until its next snapshot) it is trimmed.
        assert consume(cluster_b, 10) == second[:10]
        admin_b.post(f"/namespaces/{tenant}/ns/deduplication", False)
        admin_b.put(f"{admin_b.topic_path(topic)}/unload")
        admin_b.post(f"{admin_b.topic_path(topic)}/trim")
        assert [m["data"] for m in drain(cluster_b, topic)] == second[10:]
        assert cleanup(spec, run_dir, "--dry-run") == 0, cleanup_report()["error"]
        counts = cleanup_report()["counts"]
        assert (counts["messages_verified"], counts["messages_trimmed_on_target"]) == (10, 10)

        # A message the target never got (published at the source behind the lookup service's back): refused.
        send(cluster_a, [b"stray"])
        assert cleanup(spec, run_dir, "--dry-run") == 1
        assert "does not hold the source's 11 message(s) (read from its copy of the source's entry at" in (
            cleanup_report()["error"])
        # The target topic deleted and created again: it lacks the copy mark, so its emptiness proves nothing.
        admin_b.delete(f"{admin_b.topic_path(topic)}", params={"force": "true"})
        admin_b.put(f"/persistent/{tenant}/ns/t")
        assert cleanup(spec, run_dir, "--dry-run") == 1
        assert "lacks the pulsar-migration.copy-target mark" in cleanup_report()["error"]
        assert [m["data"] for m in drain(cluster_a, topic)] == [*second, b"stray"]  # nothing deleted
    finally:
        service.stop()
        teardown(tenant, admin_a, admin_b, cluster_a.name)
        admin_a.close()
        admin_b.close()
