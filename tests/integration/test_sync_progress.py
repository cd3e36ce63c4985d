"""sync_progress against the real cluster pair after a real copy, judged by draining every subscription on both
clusters with fresh consumers of the plain Python client: the two multisets of messages must be identical.

Ack patterns: a random 30% of entries acked (whole entries; another 20% of batches acked only partly, which
the broker does not record), a cumulative ack then holes, everything, nothing, a delayed message not yet due,
and one subscription with more holes than the broker persists (10,000).

The same exactness and convergence over the map native geo-replication gives are judged in test_switch_live's
geo-mode cutover, on topics acked in these patterns that no live client touches (one geo migration serves both).
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pulsar
import pytest
from localdev.pulsar_local import LocalCluster
from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.metadata.step import run as sync_metadata
from pulsar_migration.progress.step import STEP, add_args, run
from pulsar_migration.stepjob import run_step
from pyspark.sql import SparkSession

from tests.conftest import kill_at_fault_point, unique
from tests.integration.replication_helpers import client, create_layout, replicate
from tests.integration.tenant_builders import drop_tenant, write_spec

log = logging.getLogger(__name__)

TOPICS = {"ns/batched3": 3, "ns/plain1": 1, "ns/mixed": 0}
# Enough for every pattern to meet whole batches, part-acked batches and holes on every partition; the counts
# themselves are not what is judged (the holes topic's is).
BATCHED_MESSAGES = 3_000  # batches of at most 10 on 3 partitions
PLAIN_MESSAGES = 999  # unbatched, plus the delayed one: 1,000 entries
MIXED_MESSAGES = 1_000  # batched and unbatched runs of 100
PLAIN_REWIND_TO = 500  # the rewound subscription's backlog: PLAIN_MESSAGES + 1 - PLAIN_REWIND_TO
HOLES_TOPIC = "ns/holes"
HOLES_MESSAGES = 21_000  # every other one acked: 10,500 holes, above managedLedgerMaxUnackedRangesToPersist
SUBSCRIPTIONS = {  # name -> (type, ack pattern)
    "shared-30": (pulsar.ConsumerType.Shared, "random"),
    "keyshared-30": (pulsar.ConsumerType.KeyShared, "random"),
    "failover-cumulative": (pulsar.ConsumerType.Failover, "cumulative"),
    "exclusive-all": (pulsar.ConsumerType.Exclusive, "all"),
    "exclusive-none": (pulsar.ConsumerType.Exclusive, "none"),
}
IDLE_MS = 1_000
# A fresh Failover consumer of a partitioned topic gets nothing for about a second (the broker's
# activeConsumerFailoverDelayTimeMillis): the first message gets longer.
FIRST_MS = 4_000
DRAIN_THREADS = 8
# A drain that differs is drained again with these: a loaded host can keep a fresh consumer waiting seconds.
PATIENT_FIRST_MS = 20_000
PATIENT_IDLE_MS = 5_000


def sync(spec: Path, run_dir: Path, *extra: str) -> int:
    return run_step(STEP, run, ["--spec", str(spec), "--run-dir", str(run_dir), *extra], add_args=add_args)


def progress_report(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / f"{STEP}.json").read_text())


def produce(c: pulsar.Client, tenant: str) -> int:
    """5,000 messages: batched on 3 partitions, unbatched on 1 partition (plus a delayed one), both on a
    non-partitioned topic; then the holes topic's. Payloads are unique, so a drain's multiset shows any loss or
    duplicate."""
    sent = 0
    batched = c.create_producer(f"persistent://{tenant}/ns/batched3", batching_enabled=True,
                                batching_max_messages=10, batching_max_publish_delay_ms=20, block_if_queue_full=True)
    for i in range(BATCHED_MESSAGES):
        batched.send_async(f"batched3-{i}".encode(), None, partition_key=f"k{i % 31}")
    batched.flush()
    plain = c.create_producer(f"persistent://{tenant}/ns/plain1", batching_enabled=False, block_if_queue_full=True)
    for i in range(PLAIN_MESSAGES):
        plain.send_async(f"plain1-{i}".encode(), None, partition_key=f"k{i % 7}")
    plain.flush()
    plain.send(b"plain1-delayed", deliver_at=int(time.time() * 1000) + 3_600_000)
    mixed_b = c.create_producer(f"persistent://{tenant}/ns/mixed", batching_enabled=True, batching_max_messages=5,
                                batching_max_publish_delay_ms=20, block_if_queue_full=True)
    mixed_u = c.create_producer(f"persistent://{tenant}/ns/mixed", batching_enabled=False, block_if_queue_full=True)
    for i in range(MIXED_MESSAGES):
        (mixed_b if (i // 100) % 2 else mixed_u).send_async(f"mixed-{i}".encode(), None, partition_key=f"k{i % 5}")
        if i % 100 == 99:
            mixed_b.flush()
            mixed_u.flush()
    sent += BATCHED_MESSAGES + PLAIN_MESSAGES + 1 + MIXED_MESSAGES
    holes = c.create_producer(f"persistent://{tenant}/{HOLES_TOPIC}", batching_enabled=False,
                              block_if_queue_full=True)
    for i in range(HOLES_MESSAGES):
        holes.send_async(f"holes-{i}".encode(), None)
    holes.flush()
    return sent


def subscribe(c: pulsar.Client, topic: str, name: str, kind: pulsar.ConsumerType) -> pulsar.Consumer:
    return c.subscribe(topic, name, consumer_type=kind, initial_position=pulsar.InitialPosition.Earliest,
                       receiver_queue_size=2_000)


def receive_all(consumer: pulsar.Consumer, first_ms: int = FIRST_MS, idle_ms: int = IDLE_MS, expect: int = 0
                ) -> Iterator[pulsar.Message]:
    """Messages until none came for `idle_ms` (`first_ms` for the first); while fewer than `expect` came, each
    next one is waited for PATIENT_IDLE_MS instead."""
    wait, got = first_ms, 0
    while True:
        try:
            yield consumer.receive(wait)
        except pulsar.Timeout:
            return
        got += 1
        wait = PATIENT_IDLE_MS if got < expect else idle_ms


def receive_expecting(consumer: pulsar.Consumer, expect: int) -> Iterator[pulsar.Message]:
    """The `expect` messages a test knows are there, each waited for patiently (a loaded host can keep a consumer
    waiting seconds), then whatever more comes within the usual idle time (so a duplicate still shows)."""
    return receive_all(consumer, PATIENT_FIRST_MS, IDLE_MS, expect)


def ack_pattern(consumer: pulsar.Consumer, pattern: str, rng: random.Random, share: float = 0.3) -> None:
    """Acks what `pattern` says on everything the subscription delivers now."""
    if pattern == "none":
        return
    decisions: dict[tuple[int, int, int], str] = {}
    messages = list(receive_all(consumer, PATIENT_FIRST_MS))  # every caller's subscription has messages
    if pattern == "all":
        for m in messages:
            consumer.acknowledge(m)
        return
    if pattern == "cumulative":
        cut = int(len(messages) * 0.4)
        if cut:
            consumer.acknowledge_cumulative(messages[cut - 1])
        messages = messages[cut:]
    for m in messages:
        mid = m.message_id()
        entry = (mid.partition(), mid.ledger_id(), mid.entry_id())
        if entry not in decisions:
            roll = rng.random()
            decisions[entry] = "full" if roll < share else "partial" if roll < share + 0.2 else "none"
        decision = decisions[entry]
        if decision == "full" or (decision == "partial" and mid.batch_index() % 2 == 0 and mid.batch_index() >= 0):
            consumer.acknowledge(m)


def ack_patterns(consumers: dict[tuple[str, str], pulsar.Consumer], seed: int) -> None:
    """Each subscription's pattern acked, side by side (each ends by waiting out its idle time), with a random
    generator of its own so the outcome does not depend on the order the threads run in; then closed."""
    def one(item: tuple[tuple[str, str], pulsar.Consumer]) -> None:
        (topic, name), consumer = item
        ack_pattern(consumer, SUBSCRIPTIONS[name][1], random.Random(f"{seed}/{topic}/{name}"))
        consumer.close()

    with ThreadPoolExecutor(DRAIN_THREADS) as pool:
        list(pool.map(one, consumers.items()))


def drain(cluster: LocalCluster, topic: str, subscription: str, kind: pulsar.ConsumerType,
          patient: bool = False) -> Counter[bytes]:
    """What a fresh consumer of the subscription receives now (nothing acked, so the cursor stays). `patient`
    waits as long as a loaded machine can keep a fresh consumer from its first message or its next."""
    c = client(cluster)
    try:
        consumer = c.subscribe(topic, subscription, consumer_type=kind, receiver_queue_size=2_000)
        if patient:
            first_ms, idle_ms = PATIENT_FIRST_MS, PATIENT_IDLE_MS
        else:
            first_ms, idle_ms = (FIRST_MS if kind == pulsar.ConsumerType.Failover else 2 * IDLE_MS), IDLE_MS
        got = Counter(m.data() for m in receive_all(consumer, first_ms, idle_ms))
        consumer.close()
        return got
    finally:
        c.close()


def subscription_backlog(cluster: LocalCluster, topic: str, subscription: str) -> int:
    """The subscription's backlog in entries as the broker counts it (over all partitions)."""
    admin = cluster.admin(timeout_s=30)
    try:
        path = admin.topic_path(topic)
        partitioned = admin.get(f"{path}/partitions")["partitions"] > 0
        stats = admin.get(f"{path}/partitioned-stats" if partitioned else f"{path}/stats")
        return int(stats["subscriptions"].get(subscription, {}).get("msgBacklog", 0))
    finally:
        admin.close()


def drains_differ(a: LocalCluster, b: LocalCluster, tenant: str,
                  subs: dict[str, tuple[pulsar.ConsumerType, str]], topics: list[str]
                  ) -> tuple[dict[str, tuple[int, int]], int]:
    """Per topic/subscription whose drains differ: (messages only the target delivers, only the source); and
    how many messages the source drains delivered in all. The drains run side by side (each ends by waiting
    out its idle time, and the client releases the GIL while it waits). A pair that differs, or got nothing where
    the source broker counts a backlog, is drained again with patient waits before it counts: drains acknowledge
    nothing, so a real difference stays, while a drain that a loaded machine kept waiting past its idle time does
    not."""
    pairs = [(topic, name, kind) for topic in topics for name, (kind, _) in subs.items()]

    def both(pair: tuple[str, str, pulsar.ConsumerType]) -> tuple[Counter[bytes], Counter[bytes]]:
        topic, name, kind = pair
        full = f"persistent://{tenant}/{topic}"
        source, target = drain(a, full, name, kind), drain(b, full, name, kind)
        if source != target or (not source and subscription_backlog(a, full, name) > 0):
            log.warning("drains of %s %s differ (%d, %d messages): drained again, patiently",
                        topic, name, sum(source.values()), sum(target.values()))
            source, target = drain(a, full, name, kind, patient=True), drain(b, full, name, kind, patient=True)
        return source, target

    with ThreadPoolExecutor(DRAIN_THREADS) as pool:
        drained_pairs = list(pool.map(both, pairs))
    differences = {}
    for (topic, name, _), (source, target) in zip(pairs, drained_pairs, strict=True):
        if source != target:
            differences[f"{topic} {name}"] = (sum((target - source).values()), sum((source - target).values()))
    return differences, sum(sum(source.values()) for source, _ in drained_pairs)


def backlog(rep: dict[str, Any], topics: list[str], subs: list[str]) -> int:
    """The source backlog the step counted over these topics' partitions and subscriptions."""
    return sum(d["source_backlog"] for d in rep["details"]["subscriptions"] if d["subscription"] in subs
               and any(d["topic"].split("/", 3)[-1].split("-partition-")[0] == t for t in topics))


@pytest.fixture(scope="module")
def migrated(cluster_a: LocalCluster, cluster_b: LocalCluster, spark: SparkSession,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A tenant whose subscriptions acked in every pattern, synced (metadata) and copied once."""
    admin_a = PulsarAdmin(cluster_a.admin_url, name=cluster_a.name)
    admin_b = PulsarAdmin(cluster_b.admin_url, name=cluster_b.name)
    tmp = tmp_path_factory.mktemp("progress")
    tenant = unique("it-progress")
    admin_a.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": [cluster_a.name]})
    admin_a.put(f"/namespaces/{tenant}/ns")
    create_layout(admin_a, tenant, TOPICS)
    admin_a.put(f"/persistent/{tenant}/{HOLES_TOPIC}")
    c = client(cluster_a)
    consumers = {(topic, name): subscribe(c, f"persistent://{tenant}/{topic}", name, kind)
                 for topic in TOPICS for name, (kind, _) in SUBSCRIPTIONS.items()}
    holes = subscribe(c, f"persistent://{tenant}/{HOLES_TOPIC}", "holes", pulsar.ConsumerType.Shared)
    produce(c, tenant)
    ack_patterns(consumers, seed=7)
    for i, m in enumerate(receive_expecting(holes, HOLES_MESSAGES)):
        if i % 2:
            holes.acknowledge(m)
    holes.close()
    c.close()
    spec = write_spec(tmp / "spec.json", tenant, cluster_a, cluster_b)
    run_dir = tmp / "run"
    assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(run_dir)]) == 0
    assert replicate(spec, run_dir) == 0
    yield {"tenant": tenant, "spec": spec, "run": run_dir, "admin_a": admin_a, "admin_b": admin_b}
    for admin in (admin_a, admin_b):
        drop_tenant(tenant, admin)
        admin.close()


def test_markdelete_only_translation_is_caught_and_loses_the_holes(migrated: dict[str, Any], cluster_a: LocalCluster,
                                                                   cluster_b: LocalCluster) -> None:
    """The baseline (what replicated subscriptions carry): the step's own verification and the drains both see
    every individually acked message delivered again on the target."""
    assert sync(migrated["spec"], migrated["run"], "--markdelete-only") == 1
    rep = progress_report(migrated["run"])
    assert rep["verdict"] == "failed" and rep["details"]["translation"] == "markdelete-only"
    assert rep["counts"]["apply_rounds"] == 1 and rep["details"]["verify_reads"] == 1  # it cannot converge
    assert rep["counts"]["duplicated"] > 1_000 and rep["counts"]["lost"] == 0
    assert "differ on the target" in rep["error"]
    differences, _ = drains_differ(cluster_a, cluster_b, migrated["tenant"],
                                   {k: SUBSCRIPTIONS[k] for k in ("shared-30", "failover-cumulative")}, ["ns/plain1"])
    assert set(differences) == {"ns/plain1 shared-30", "ns/plain1 failover-cumulative"}
    assert all(extra > 0 and missing == 0 for extra, missing in differences.values())


def test_exact_sync_every_subscription_drains_the_same(migrated: dict[str, Any], cluster_a: LocalCluster,
                                                       cluster_b: LocalCluster) -> None:
    assert sync(migrated["spec"], migrated["run"]) == 0
    rep = progress_report(migrated["run"])
    assert rep["verdict"] == "ok"
    counts = rep["counts"]
    assert counts["lost"] == 0 and counts["duplicated"] == 0
    assert counts["subscriptions"] == 5 * (3 + 1 + 1) + 1
    assert rep["hashes"]["source_acked"] == rep["hashes"]["target_acked"]
    subs = {(d["topic"].split("/", 3)[-1], d["subscription"]): d for d in rep["details"]["subscriptions"]}
    holes = subs[("ns/holes", "holes")]
    assert holes["ranges"] >= 10_000 and holes["target_backlog"] == holes["source_backlog"] == HOLES_MESSAGES // 2
    assert rep["details"]["source_state_read_at"]["first"] <= rep["details"]["source_state_read_at"]["last"]
    differences, drained = drains_differ(cluster_a, cluster_b, migrated["tenant"], SUBSCRIPTIONS, list(TOPICS))
    assert differences == {}
    # the drains saw the whole backlog but the delayed message on the two shared subscriptions (not due yet)
    assert drained == backlog(rep, list(TOPICS), list(SUBSCRIPTIONS)) - 2
    differences, drained = drains_differ(cluster_a, cluster_b, migrated["tenant"],
                                         {"holes": (pulsar.ConsumerType.Shared, "")}, [HOLES_TOPIC])
    assert differences == {} and drained == HOLES_MESSAGES // 2
    # the delayed message is held back on both shared subscriptions, delivered on the exclusive one
    shared = drain(cluster_b, f"persistent://{migrated['tenant']}/ns/plain1", "exclusive-none",
                   pulsar.ConsumerType.Exclusive, patient=True)
    assert shared[b"plain1-delayed"] == 1
    assert b"plain1-delayed" not in drain(cluster_b, f"persistent://{migrated['tenant']}/ns/plain1", "shared-30",
                                          pulsar.ConsumerType.Shared)


def test_resync_after_more_acks_and_a_rewind_converges(migrated: dict[str, Any], cluster_a: LocalCluster,
                                                       cluster_b: LocalCluster) -> None:
    tenant = migrated["tenant"]
    c = client(cluster_a)
    consumer = subscribe(c, f"persistent://{tenant}/ns/batched3", "shared-30", pulsar.ConsumerType.Shared)
    ack_pattern(consumer, "random", random.Random(11), share=0.5)
    consumer.close()
    c.close()
    # rewind: the subscription that acked everything goes back to the start of one partition
    admin_a: PulsarAdmin = migrated["admin_a"]
    first = admin_a.get(f"/persistent/{tenant}/ns/plain1-partition-0/internalStats")["ledgers"][0]["ledgerId"]
    admin_a.post(f"/persistent/{tenant}/ns/plain1-partition-0/subscription/exclusive-all/resetcursor",
                 {"ledgerId": first, "entryId": PLAIN_REWIND_TO})
    assert sync(migrated["spec"], migrated["run"]) == 0
    rep = progress_report(migrated["run"])
    assert rep["counts"]["lost"] == 0 and rep["counts"]["duplicated"] == 0
    assert 0 < rep["counts"]["subscriptions_set"] < rep["counts"]["subscriptions"]
    subs = {k: SUBSCRIPTIONS[k] for k in ("shared-30", "exclusive-all")}
    differences, drained = drains_differ(cluster_a, cluster_b, tenant, subs, ["ns/batched3", "ns/plain1"])
    assert differences == {}
    assert drained == backlog(rep, ["ns/batched3", "ns/plain1"], list(subs)) - 1  # shared-30's delayed message
    assert backlog(rep, ["ns/plain1"], ["exclusive-all"]) == PLAIN_MESSAGES + 1 - PLAIN_REWIND_TO  # the rewind
    # (that a further run finds nothing else to do: the next test's dry run plans one cursor, the one it breaks)


def test_dry_run_writes_nothing_and_a_target_with_consumers_is_refused(
        migrated: dict[str, Any], cluster_b: LocalCluster) -> None:
    """One target cursor set wrong: a dry run plans exactly that one and writes nothing; a sync while the target
    subscription has a consumer of its own refuses it and leaves it as it was. The next test's syncs set it (its
    last one ends with every subscription exact): a sync here only to see that would repeat theirs."""
    tenant, admin_b = migrated["tenant"], migrated["admin_b"]
    path = f"/persistent/{tenant}/ns/mixed"
    first = admin_b.get(f"{path}/internalStats")["ledgers"][0]["ledgerId"]
    admin_b.post(f"{path}/subscription/shared-30/resetcursor", {"ledgerId": first, "entryId": 0})  # to the start
    wrong = admin_b.get(f"{path}/internalStats")["cursors"]["shared-30"]
    dry = migrated["run"].parent / "dry"
    assert sync(migrated["spec"], dry, "--dry-run") == 0  # before replicate_topics: nothing to translate yet
    assert "no position map" in progress_report(dry)["details"]["note"]
    assert sync(migrated["spec"], migrated["run"], "--dry-run") == 0
    rep = progress_report(migrated["run"])
    assert rep["verdict"] == "planned" and rep["counts"]["subscriptions_to_set"] == 1
    planned = [d for d in rep["details"]["subscriptions"] if d.get("reset_to")]
    assert [(d["topic"].rsplit("/", 1)[-1], d["subscription"]) for d in planned] == [("mixed", "shared-30")]
    assert admin_b.get(f"{path}/internalStats")["cursors"]["shared-30"] == wrong  # nothing written

    c = client(cluster_b)
    try:
        c.subscribe(f"persistent://{tenant}/ns/mixed", "shared-30", consumer_type=pulsar.ConsumerType.Shared,
                    consumer_name="early-bird", receiver_queue_size=1)
        assert sync(migrated["spec"], migrated["run"]) == 1
        rep = progress_report(migrated["run"])
        assert "consumer(s) of its own" in rep["error"] and "early-bird" in rep["error"]
    finally:
        c.close()
    # It had that one cursor to set, every other one exact, and set nothing: the cursor's acked state is untouched.
    assert rep["counts"]["subscriptions_already_exact"] == rep["counts"]["subscriptions"] - 1
    assert rep["counts"]["subscriptions_set"] == 0
    assert acked_state(admin_b.get(f"{path}/internalStats")["cursors"]["shared-30"]) == acked_state(wrong)


def acked_state(cursor: dict[str, Any]) -> tuple[str, str]:
    """What a cursor of internalStats says is acknowledged (the rest are connection and read details)."""
    return cursor["markDeletePosition"], cursor["individuallyDeletedMessages"]


def test_a_sync_killed_while_applying_is_finished_by_the_next(migrated: dict[str, Any], cluster_a: LocalCluster,
                                                              cluster_b: LocalCluster) -> None:
    """The target's holes subscription is set wrong (everything acked); a sync resets that cursor and is SIGKILLed
    while it acknowledges the 10,500 entries: the fault point `progress.acks` (PM_FAULT) parks it after 5,000
    acks and says so with a marker file, so the kill lands there every time instead of racing acks that take
    well under a second. The next sync finishes the job, and the cursor the previous test left wrong (mixed's
    shared-30, under 5,000 acks: the kill never lands on it) with it: every subscription ends exact."""
    tenant, admin_b = migrated["tenant"], migrated["admin_b"]
    path = f"/persistent/{tenant}/{HOLES_TOPIC}"
    exact_backlog = HOLES_MESSAGES // 2
    last = admin_b.last_message_id(f"persistent://{tenant}/{HOLES_TOPIC}")
    admin_b.post(f"{path}/subscription/holes/resetcursor",
                 {"ledgerId": last["ledgerId"], "entryId": last["entryId"], "excluded": True})
    assert precise_backlog(admin_b, path) == 0
    # Parked after 5,000 acks; 3 s for the client's grouped acks (100 ms) to reach a loaded broker, then killed.
    kill_at_fault_point(STEP, migrated["spec"], migrated["run"], "progress.acks", 5_000,
                        migrated["run"].parent / "marks", settle_s=3, timeout_s=240)
    # Half-applied: the cursor was reset (nothing acked) and about 5,000 of the 10,500 acks landed.
    assert exact_backlog < precise_backlog(admin_b, path) < HOLES_MESSAGES
    # Meanwhile a subscription went on the source (deleted; expiry does the same): the target's is left, and named.
    admin_a: PulsarAdmin = migrated["admin_a"]
    admin_a.delete(f"/persistent/{tenant}/ns/mixed/subscription/exclusive-none", expect_json=False)

    assert sync(migrated["spec"], migrated["run"]) == 0
    rep = progress_report(migrated["run"])
    assert rep["counts"]["target_only_subscriptions"] == 1
    assert rep["details"]["target_only_subscriptions"] == [
        {"topic": f"persistent://{tenant}/ns/mixed", "subscription": "exclusive-none"}]
    assert rep["verdict"] == "ok" and rep["counts"]["lost"] == 0 == rep["counts"]["duplicated"]
    assert rep["counts"]["subscriptions_set"] >= 1
    assert rep["hashes"]["source_acked"] == rep["hashes"]["target_acked"]
    differences, drained = drains_differ(cluster_a, cluster_b, tenant, {"holes": (pulsar.ConsumerType.Shared, "")},
                                         [HOLES_TOPIC])
    assert differences == {} and drained == HOLES_MESSAGES // 2


def precise_backlog(admin: PulsarAdmin, path: str) -> int:
    """The holes subscription's backlog counted entry by entry (the plain figure is an estimate that a cursor
    reset can leave stale)."""
    stats = admin.get(f"{path}/stats", params={"getPreciseBacklog": "true"})
    return int(stats["subscriptions"]["holes"]["msgBacklog"])

