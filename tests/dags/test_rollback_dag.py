"""`dag.test()` of pulsar_tenant_rollback: on bad input, and in the round trip an operator makes through the UI:
pulsar_tenant_migration switches a tenant's clients to cluster-b, pulsar_tenant_rollback switches them back,
pulsar_tenant_migration with *Continue from run* moves them to cluster-b again, and pulsar_source_cleanup then
removes the source's copy. Clients publish and acknowledge through the lookup service between the runs. The
rollback engine itself, with clients running through each flip, is in tests/integration/test_rollback_live.py."""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from pathlib import Path

import pulsar
import pytest
from localdev.pulsar_local import LocalCluster
from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.replication.partition import COPY_SOURCE_PROPERTY

from tests.conftest import unique
from tests.dags.conftest import AirflowTestDb
from tests.dags.dag_runs import failures, run_dag, xcom
from tests.integration.lookup_helpers import LookupProcess
from tests.integration.replication_helpers import drain, partition_names
from tests.integration.tenant_builders import drop_tenant
from tests.integration.test_sync_progress import receive_expecting

log = logging.getLogger(__name__)

MIGRATION, ROLLBACK, CLEANUP = "pulsar_tenant_migration", "pulsar_tenant_rollback", "pulsar_source_cleanup"
ORDERS, AUDIT = "ns/orders", "ns/audit"  # 2 partitions; not partitioned
PARTITIONS = {ORDERS: 2, AUDIT: 0}
SUBSCRIPTION = "auditor"  # on AUDIT: exclusive, so it receives in storage order
KEYS = 10


def test_an_unknown_migration_run_fails_in_render_spec_with_one_line(
    airflow_db: AirflowTestDb, capfd: pytest.CaptureFixture[str],
) -> None:
    dag_run, states = run_dag(ROLLBACK, run_conf={"migration_run_id": "manual__never"})
    assert dag_run.state == "failed"
    assert states == {"render_spec": "failed", "rollback_lookup": "upstream_failed",
                      "publish_rollback_lookup_report": "failed", "write_migration_report": "failed"}
    out, err = capfd.readouterr()
    assert "no run 'manual__never' of pulsar_tenant_migration with a spec at" in out + err


def publish(where: str, tenant: str, tag: str, count: int) -> list[bytes]:
    """`count` messages on each topic through `where` (KEYS keys, so the partitioned topic gets both partitions);
    returns their payloads."""
    c = pulsar.Client(where, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        for topic in (ORDERS, AUDIT):
            producer = c.create_producer(f"persistent://{tenant}/{topic}")
            for i in range(count):
                producer.send(f"{topic}-{tag}-{i}".encode(), partition_key=f"k{i % KEYS}")
            producer.close()
    finally:
        c.close()
    return [f"{topic}-{tag}-{i}".encode() for topic in (ORDERS, AUDIT) for i in range(count)]


def auditor(where: str, tenant: str) -> tuple[pulsar.Client, pulsar.Consumer]:
    c = pulsar.Client(where, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    return c, c.subscribe(f"persistent://{tenant}/{AUDIT}", SUBSCRIPTION)


def acknowledge(where: str, tenant: str, count: int, expect: list[bytes]) -> None:
    """The auditor receives what it has not acknowledged (exactly `expect`, in order) and acknowledges the first
    `count`."""
    c, consumer = auditor(where, tenant)
    try:
        received = list(receive_expecting(consumer, len(expect)))
        assert [m.data() for m in received] == expect
        for m in received[:count]:
            consumer.acknowledge(m)
    finally:
        c.close()


def stored(cluster: LocalCluster, tenant: str) -> dict[str, list[bytes]]:
    """Every partition's payloads in storage order."""
    return {name: [m["data"] for m in drain(cluster, name)]
            for topic, partitions in PARTITIONS.items()
            for name in partition_names(f"persistent://{tenant}/{topic}", partitions)}


def held_once_in_order(holdings: dict[str, list[bytes]], published: list[bytes], complete: list[bytes]) -> None:
    """The partitions hold published payloads only, each once and each key's of one round in publishing order, and
    every payload of `complete`. Others may be gone: a topic no subscription holds and no retention keeps loses
    its ledgers to the broker's trimming once an unload rolls them over."""
    held = [p for payloads in holdings.values() for p in payloads]
    assert len(held) == len(set(held)), "a message held twice"
    assert set(held) <= set(published) and set(complete) <= set(held), (
        f"unexpected {sorted(set(held) - set(published))[:5]}, missing {sorted(set(complete) - set(held))[:5]}")
    for name, payloads in holdings.items():
        by_key: dict[tuple[bytes, int], list[int]] = defaultdict(list)
        for payload in payloads:
            stem, i = payload.rsplit(b"-", 1)
            by_key[(stem, int(i) % KEYS)].append(int(i))
        for (stem, key), numbers in by_key.items():
            assert numbers == sorted(numbers), f"{name}: key k{key} of {stem!r} out of order: {numbers}"


def route(lookup: LookupProcess, tenant: str) -> str:
    return lookup.api("GET", f"/routes/{tenant}").json()["cluster"]


def test_migrated_rolled_back_and_migrated_again_through_the_dags(
    airflow_db: AirflowTestDb, cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin,
    admin_b: PulsarAdmin, lookup_service: LookupProcess,
) -> None:
    tenant = unique("dag-again")
    via_lookup = f"http://127.0.0.1:{lookup_service.port}"
    admin_a.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": [cluster_a.name]})
    admin_a.put(f"/namespaces/{tenant}/ns")
    admin_a.put(f"/persistent/{tenant}/{ORDERS}/partitions", 2)
    try:
        c, _ = auditor(cluster_a.service_url, tenant)  # the subscription, before any message
        c.close()
        # Before the migration, at the source: 40 messages a topic; the auditor acknowledges 10.
        published = publish(cluster_a.service_url, tenant, "a", 40)
        audit = [p for p in published if p.startswith(AUDIT.encode())]
        acknowledge(cluster_a.service_url, tenant, 10, audit)

        orders = partition_names(f"persistent://{tenant}/{ORDERS}", PARTITIONS[ORDERS])
        assert all(admin_a.last_entry(part) for part in orders)  # both partitions hold messages

        first, states = run_dag(MIGRATION, run_conf={"tenant": tenant})
        assert first.state == "success", failures(first, states)
        assert route(lookup_service, tenant) == cluster_b.name
        # No subscription holds the source's orders and its namespace keeps no retention: once the switch's unload
        # rolled its ledger over, the broker trims it (done here at once). The partitions are empty and yet the
        # ones the position map describes: the rollback copies into them.
        for part in orders:
            # Marked as copied from, which the trimming keeps.
            assert admin_a.get(f"{admin_a.topic_path(part)}/properties") == {COPY_SOURCE_PROPERTY: cluster_b.name}
            admin_a.put(f"{admin_a.topic_path(part)}/unload")
            admin_a.post(f"{admin_a.topic_path(part)}/trim")
            assert admin_a.last_entry(part) is None
        trimmed = [p for p in published if p.startswith(ORDERS.encode())]

        # On the target (the lookup service sends the clients there): 10 more a topic; the auditor acknowledges
        # 10 more.
        round_b = publish(via_lookup, tenant, "b", 10)
        published += round_b
        audit += [p for p in round_b if p.startswith(AUDIT.encode())]
        acknowledge(via_lookup, tenant, 10, audit[10:])

        back, states = run_dag(ROLLBACK, run_conf={"migration_run_id": first.run_id})
        assert back.state == "success", failures(back, states)
        assert route(lookup_service, tenant) == cluster_a.name
        assert xcom(back, "publish_rollback_lookup_report")["verdict"] == "ok"
        # The migration run's report says so (it said "moved and verified" before 2026-11-29).
        assert xcom(back, "write_migration_report")["verdict"] == "rolled_back"
        # The source holds what was published on the target once, in order, after what it kept (its orders
        # trimmed above).
        kept = [p for p in published if p not in trimmed]
        held_once_in_order(source := stored(cluster_a, tenant), published, kept)
        assert sorted(p for payloads in source.values() for p in payloads) == sorted(kept)

        # At the source again: 10 more a topic; the auditor acknowledges 5 more (what it acknowledged on the
        # target came back with the rollback: it starts at the 21st).
        round_c = publish(via_lookup, tenant, "c", 10)
        published += round_c
        audit += [p for p in round_c if p.startswith(AUDIT.encode())]
        acknowledge(via_lookup, tenant, 5, audit[20:])

        again, states = run_dag(MIGRATION, run_conf={"tenant": tenant, "follows_run_id": first.run_id})
        assert again.state == "success", failures(again, states)
        assert route(lookup_service, tenant) == cluster_b.name
        rdir = Path(xcom(again, "render_spec")["run_dir"])
        details = json.loads((rdir / "replicate_topics.json").read_text())["details"]
        assert details["map_rows_seeded"] > 0
        # Only what the source got since the rollback is copied.
        assert xcom(again, "publish_replicate_topics_report")["counts"]["copied_messages"] == len(round_c)
        progressed = xcom(again, "publish_sync_progress_report")["counts"]
        assert (progressed["lost"], progressed["duplicated"]) == (0, 0)
        assert "continues the run in" in (rdir / "report.md").read_text()

        # Both sides hold every message once, in order; the auditor gets exactly what it did not acknowledge in the
        # three rounds, in order, and nothing more.
        # (Each fence since rolled the orders over on its side: the broker may have trimmed them again.)
        held_once_in_order(stored(cluster_b, tenant), published, audit + round_c)
        held_once_in_order(stored(cluster_a, tenant), published, audit)
        c, consumer = auditor(via_lookup, tenant)
        try:
            assert [m.data() for m in receive_expecting(consumer, len(audit) - 25)] == audit[25:]
        finally:
            c.close()
        # Later, pulsar_source_cleanup: given the rolled-back run, it refuses at once (no retry) and names the run
        # that migrated again; given that one, it deletes the tenant's topics and namespace on the source only.
        refused, states = run_dag(CLEANUP, run_conf={"migration_run_id": first.run_id, "confirm_cleanup": True})
        assert refused.state == "failed" and states["cleanup_source"] == "failed", states
        error = json.loads((Path(xcom(refused, "render_spec")["run_dir"]) / "cleanup_source.json").read_text())["error"]
        assert "was rolled back" in error and f"clean up after the run that migrated again, {rdir}" in error, error
        assert sorted(admin_a.get(f"/namespaces/{tenant}/ns/topics")) != []
        target_before = stored(cluster_b, tenant)
        cleaned, states = run_dag(CLEANUP, run_conf={"migration_run_id": again.run_id, "confirm_cleanup": True})
        assert cleaned.state == "success", failures(cleaned, states)
        assert xcom(cleaned, "publish_cleanup_source_report")["counts"]["topics_deleted"] == 2
        assert admin_a.get(f"/namespaces/{tenant}") == []  # topics and namespace gone (the tenant was not asked)
        assert stored(cluster_b, tenant) == target_before
        assert route(lookup_service, tenant) == cluster_b.name
        # The cleaned-up run cannot be rolled back any more: refused at once, naming the cleanup.
        late, states = run_dag(ROLLBACK, run_conf={"migration_run_id": again.run_id})
        assert late.state == "failed" and states["rollback_lookup"] == "failed", states
        assert "cleanup_source started deleting" in json.loads((rdir / "rollback_lookup.json").read_text())["error"]
        assert route(lookup_service, tenant) == cluster_b.name
        # The migration run's report (its report tab) is written again with the cleanup.
        summary = json.loads((rdir / "report.json").read_text())
        assert (summary["run_id"], summary["verdict"]) == (again.run_id, "ok"), summary["meaning"]
        assert xcom(cleaned, "write_migration_report")["verdict"] == "ok"
        hold = json.loads((Path(xcom(back, "render_spec")["run_dir"]) / "rollback_lookup.json").read_text())
        log.info("round trip: %d map rows seeded; rollback hold %ss", details["map_rows_seeded"],
                 hold["details"].get("hold_s"))
    finally:
        drop_tenant(tenant, admin_a, admin_b)
