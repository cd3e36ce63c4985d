"""The live cutover (copy and geo mode): producers and consumers of every subscription type, and a producer of the
distribution's Java client, run through the lookup service while the tenant is migrated and switched. Judged on the
target's storage (each sent message exactly once, per
producer order kept), on what the clients saw (no failed send, every message received by every subscription)
and on redelivery, counted against Pulsar's own floor: the same clients while their namespace is merely
unloaded within one cluster, in the same run."""

from __future__ import annotations

import json
import logging
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulsar
import pytest
from localdev.pulsar_dist import pulsar_home
from localdev.pulsar_local import LocalCluster
from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.metadata.step import run as sync_metadata
from pulsar_migration.stepjob import run_step
from pulsar_migration.switch.step import STEP, run
from pyspark.sql import SparkSession

from tests.conftest import unique
from tests.integration.lookup_helpers import TOKEN, LookupProcess, start_service
from tests.integration.replication_helpers import replicate
from tests.integration.tenant_builders import write_spec
from tests.integration.test_replicate_geo import teardown
from tests.integration.test_sync_progress import sync

log = logging.getLogger(__name__)

RATE_PER_S = 100
KEYS = 16


@dataclass
class ProducerRun:
    name: str
    topic: str
    batched: bool
    sent: list[int] = field(default_factory=list)  # sequence numbers the broker acknowledged
    failed: list[str] = field(default_factory=list)
    stalls: list[float] = field(default_factory=list)  # seconds from send to receipt
    next: int = 0


@dataclass
class ConsumerRun:
    topic: str
    subscription: str
    kind: pulsar.ConsumerType
    received: list[tuple[str, float]] = field(default_factory=list)  # (payload, time)


class Clients:
    """Producers and consumers on one client whose service URL is the lookup service."""

    def __init__(self, url: str, tenant: str) -> None:
        self.client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn),
                                    operation_timeout_seconds=30)
        self.stop = threading.Event()
        self.stop_producing = threading.Event()
        orders, events = f"persistent://{tenant}/ns/orders", f"persistent://{tenant}/ns/events"
        self.producers = [ProducerRun("orders-producer", orders, True), ProducerRun("events-producer", events, False)]
        self.consumers = [ConsumerRun(orders, "shared", pulsar.ConsumerType.Shared),
                          ConsumerRun(orders, "key-shared", pulsar.ConsumerType.KeyShared),
                          ConsumerRun(orders, "failover", pulsar.ConsumerType.Failover),
                          ConsumerRun(events, "exclusive", pulsar.ConsumerType.Exclusive)]
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        for c in self.consumers:
            consumer = self.client.subscribe(c.topic, c.subscription, consumer_type=c.kind,
                                             initial_position=pulsar.InitialPosition.Earliest)
            self.threads.append(threading.Thread(target=self._consume, args=(c, consumer), daemon=True))
        for p in self.producers:
            # The client's default 30 s send timeout: a hold that outlasted it would fail sends.
            producer = self.client.create_producer(p.topic, producer_name=p.name, batching_enabled=p.batched,
                                                   batching_max_publish_delay_ms=10, block_if_queue_full=True)
            self.threads.append(threading.Thread(target=self._produce, args=(p, producer), daemon=True))
        for t in self.threads:
            t.start()

    def _produce(self, p: ProducerRun, producer: Any) -> None:
        lock = threading.Lock()
        while not self.stop_producing.is_set():
            n = p.next
            p.next += 1
            sent_at = time.monotonic()

            def done(res: Any, mid: Any, n: int = n, sent_at: float = sent_at) -> None:
                with lock:
                    if res == pulsar.Result.Ok:
                        p.sent.append(n)
                        p.stalls.append(time.monotonic() - sent_at)
                    else:
                        p.failed.append(f"{n}: {res}")

            producer.send_async(f"{p.name}:{n}".encode(), done, partition_key=f"k{n % KEYS}")
            time.sleep(1 / RATE_PER_S)
        producer.flush()
        producer.close()

    def _consume(self, c: ConsumerRun, consumer: Any) -> None:
        while not self.stop.is_set():
            try:
                m = consumer.receive(200)
            except pulsar.Timeout:
                continue
            c.received.append((m.data().decode(), time.monotonic()))
            consumer.acknowledge(m)
        consumer.close()

    def finish(self, idle_s: float = 4.0) -> None:
        self.stop_producing.set()
        time.sleep(idle_s)  # consumers take what is left
        self.stop.set()
        for t in self.threads:
            t.join(60)
        self.client.close()

    def duplicates(self, since: float, until: float) -> dict[str, int]:
        """Per subscription: messages received again (already received before) within [since, until)."""
        out = {}
        for c in self.consumers:
            seen: set[str] = set()
            dups = 0
            for payload, at in c.received:
                if payload in seen and since <= at < until:
                    dups += 1
                seen.add(payload)
            out[c.subscription] = dups
        return out


JAVA_CYCLE = [f"java-{i}" for i in range(10)]
JAVA_REPEAT = 90  # bin/pulsar-client produce sends at most 1,000 messages
JAVA_TOTAL = len(JAVA_CYCLE) * JAVA_REPEAT


def java_producer(url: str, topic: str) -> subprocess.Popen[str]:
    """The distribution's Java client producing JAVA_CYCLE JAVA_REPEAT times at 20 msg/s (about 45 s)."""
    command = [str(pulsar_home() / "bin" / "pulsar-client"), "--url", url, "produce", topic, "-n", str(JAVA_REPEAT),
               "-r", "20", *(arg for m in JAVA_CYCLE for arg in ("-m", m))]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def publishing_at_the_source(admin: PulsarAdmin, topic: str, process: subprocess.Popen[str],
                             timeout_s: float = 90.0) -> None:
    """Waits until the Java producer has stored messages at the source, then 2 s more. A fixed wait is not enough
    on a loaded machine: a JVM that starts late looks the topic up just before the switch's hold and connects after
    its fence, and the switch then rightly gives up (the quiet check sees the source move)."""
    deadline = time.monotonic() + timeout_s
    while admin.last_entry(topic) is None:
        assert process.poll() is None, f"the Java producer exited early: {process.communicate()[0][-2000:]}"
        assert time.monotonic() < deadline, f"the Java producer stored nothing on {topic} in {timeout_s:.0f}s"
        time.sleep(0.2)
    time.sleep(2)


def stored(cluster: LocalCluster, topic: str, partitions: int) -> list[list[str]]:
    """Every stored payload per partition, in storage order."""
    c = pulsar.Client(cluster.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        out = []
        for name in ([f"{topic}-partition-{i}" for i in range(partitions)] if partitions else [topic]):
            reader = c.create_reader(name, pulsar.MessageId.earliest)
            payloads = []
            while reader.has_message_available():
                payloads.append(reader.read_next(10_000).data().decode())
            reader.close()
            out.append(payloads)
        return out
    finally:
        c.close()


def stored_twice_evidence(cluster_a: LocalCluster, cluster_b: LocalCluster, topic: str, partitions: int,
                          payloads: list[str]) -> str:
    """For a failure message: where each payload sits on both clusters, with the target entries' metadata
    (producer name, sequence id, replicated-from, the source position a replicator stamps)."""
    admin_b = PulsarAdmin(cluster_b.admin_url, name=cluster_b.name)
    lines = []
    for side, cluster in (("source", cluster_a), ("target", cluster_b)):
        c = pulsar.Client(cluster.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
        try:
            for name in ([f"{topic}-partition-{i}" for i in range(partitions)] if partitions else [topic]):
                reader = c.create_reader(name, pulsar.MessageId.earliest)
                while reader.has_message_available():
                    m = reader.read_next(10_000)
                    if m.data().decode() in payloads:
                        mid = m.message_id()
                        where = f"{side} {name} {mid.ledger_id()}:{mid.entry_id()}:{mid.batch_index()}"
                        if side == "target":
                            headers = admin_b.entry_headers(name, mid.ledger_id(), mid.entry_id())
                            where += " " + json.dumps({k: v for k, v in headers.items() if k.lower() in (
                                "x-pulsar-producer-name", "x-pulsar-sequence-id", "x-pulsar-replicated-from",
                                "x-pulsar-property", "x-pulsar-num-batch-message")})
                        lines.append(f"{m.data().decode()} at {where}")
                reader.close()
        finally:
            c.close()
    return "; ".join(lines)


@pytest.fixture
def live(cluster_a: LocalCluster, cluster_b: LocalCluster, tmp_path: Path) -> Iterator[dict[str, Any]]:
    service = start_service(tmp_path, [cluster_a, cluster_b], cluster_a)
    tenant = unique("it-switch")
    admin_a = PulsarAdmin(cluster_a.admin_url, name=cluster_a.name)
    admin_b = PulsarAdmin(cluster_b.admin_url, name=cluster_b.name)
    admin_a.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": [cluster_a.name]})
    admin_a.put(f"/namespaces/{tenant}/ns")
    # Without retention the source trims what every subscription acked (at the first ledger roll, e.g. the
    # floor's unload): those messages were consumed and never reach the target, which is right but would
    # make "every acknowledged send is stored on the target" untestable.
    admin_a.post(f"/namespaces/{tenant}/ns/retention", {"retentionTimeInMinutes": 60, "retentionSizeInMB": 64})
    # Without deduplication the floor's unload itself may store a re-sent message twice on the source (Pulsar's
    # own at-least-once publish); the copy would then faithfully carry both. The switch turns it on anyway.
    admin_a.post(f"/namespaces/{tenant}/ns/deduplication", True)
    admin_a.put(f"/persistent/{tenant}/ns/orders/partitions", 2)
    admin_a.put(f"/persistent/{tenant}/ns/events")
    admin_a.put(f"/persistent/{tenant}/ns/java")  # the Java client's producer (JAVA_CYCLE)
    try:
        yield {"service": service, "tenant": tenant, "admin_a": admin_a, "admin_b": admin_b, "tmp": tmp_path}
    finally:
        service.stop()
        teardown(tenant, admin_a, admin_b, cluster_a.name)  # geo mode: replication off first, then delete
        for admin in (admin_a, admin_b):
            admin.close()


@pytest.mark.parametrize("mode", ["copy", "geo"])
def test_live_cutover(live: dict[str, Any], cluster_a: LocalCluster, cluster_b: LocalCluster,
                      spark: SparkSession, mode: str) -> None:
    service: LookupProcess = live["service"]
    tenant, admin_a = live["tenant"], live["admin_a"]
    clients = Clients(service.url, tenant)
    clients.start()
    time.sleep(3)
    # Pulsar's own floor: the namespace unloaded within one cluster, the same clients.
    floor_from = time.monotonic()
    admin_a.put(f"/namespaces/{tenant}/ns/unload", expect_json=False)
    time.sleep(6)
    floor = clients.duplicates(floor_from, time.monotonic())

    spec = write_spec(live["tmp"] / "spec.json", tenant, cluster_a, cluster_b, replication={"mode": mode},
                      options={"geo_timeout_s": 120}, lookup={"url": service.url, "token_env": "PM_TEST_LOOKUP_TOKEN"})
    run_dir = live["tmp"] / "run"
    import os

    os.environ["PM_TEST_LOOKUP_TOKEN"] = TOKEN
    try:
        assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(run_dir)]) == 0
        assert replicate(spec, run_dir) == 0
        assert sync(spec, run_dir) == 0
        java = java_producer(service.url, f"persistent://{tenant}/ns/java")
        publishing_at_the_source(admin_a, f"persistent://{tenant}/ns/java", java)
        switch_from = time.monotonic()
        code = run_step(STEP, run, ["--spec", str(spec), "--run-dir", str(run_dir)])
        time.sleep(6)
        cutover = clients.duplicates(switch_from, time.monotonic())
        java_out, _ = java.communicate(timeout=180)
    finally:
        os.environ.pop("PM_TEST_LOOKUP_TOKEN", None)
        clients.finish()
    report = json.loads((run_dir / f"{STEP}.json").read_text())
    stalls = sorted(s for p in clients.producers for s in p.stalls)
    log.info("switch (%s mode): %s; hold %ss; phases %s; duplicates received: unload floor %s, cutover %s; "
             "publish stall p50 %.3fs p99 %.3fs max %.3fs", mode, report["verdict"], report["details"].get("hold_s"),
             report["details"].get("phases_s"), floor, cutover, stalls[len(stalls) // 2],
             stalls[int(len(stalls) * 0.99)], stalls[-1])
    assert code == 0, report.get("error")
    assert service.api("GET", f"/routes/{tenant}").json()["cluster"] == cluster_b.name

    for p in clients.producers:
        assert p.failed == [], p.failed[:5]
        partitions = 2 if p.topic.endswith("orders") else 0
        target = stored(cluster_b, p.topic, partitions)
        mine = [[int(x.split(":")[1]) for x in part if x.startswith(p.name + ":")] for part in target]
        counts = Counter(n for part in mine for n in part)
        source = [[int(x.split(":")[1]) for x in part if x.startswith(p.name + ":")]
                  for part in stored(cluster_a, p.topic, partitions)]
        summary = {"source": [(len(x), x[:3], x[-3:]) for x in source],
                   "target": [(len(x), x[:3], x[-3:]) for x in mine],
                   "sent": (len(p.sent), sorted(p.sent)[:3], sorted(p.sent)[-3:])}
        assert sorted(counts) == sorted(p.sent), f"{p.name}: stored set differs from the acknowledged sends {summary}"
        twice = [n for n, k in counts.items() if k > 1]
        assert not twice, f"{p.name}: stored twice: {twice[:5]}; " + stored_twice_evidence(
            cluster_a, cluster_b, p.topic, partitions, [f"{p.name}:{n}" for n in twice[:3]])
        for part in mine:  # one producer, one partition: storage order is send order
            assert part == sorted(part), f"{p.name}: order broken in storage"
    sent = {p.topic: {f"{p.name}:{n}" for n in p.sent} for p in clients.producers}
    for c in clients.consumers:
        missing = sent[c.topic] - {payload for payload, _ in c.received}
        assert not missing, f"{c.subscription} never received {sorted(missing)[:5]}"
    # The Java client (the distribution's bin/pulsar-client, synchronous sends, default 30 s timeout) published
    # across the switch: every send succeeded and the target holds the cycle exactly, in order.
    assert java.returncode == 0 and f"{JAVA_TOTAL} messages successfully produced" in java_out, java_out[-3000:]
    assert stored(cluster_b, f"persistent://{tenant}/ns/java", 0) == [JAVA_CYCLE * JAVA_REPEAT]
    if mode == "copy":  # the final delta went through the engine started before the hold (Java binary keys)
        assert report["details"]["final_replicate"]["copy_engine"] == "java", report["details"]["final_replicate"]
    if mode == "geo":
        # The target's dedup was taught the fenced producers' sequence ids (switch.geo_dedup): without it a
        # re-send of a message the replicator had carried was stored twice (3 of about 7 runs before).
        taught = report["details"]["target_dedup"]
        assert taught["producers"] >= len(clients.producers) and taught["sequence_ids_known"] > 0, taught


def test_a_failure_before_the_flip_rolls_back_and_clients_carry_on_at_the_source(
        live: dict[str, Any], cluster_a: LocalCluster, cluster_b: LocalCluster, spark: SparkSession) -> None:
    """The injected fault: one consumer talks to the source broker directly, not through the lookup service, so
    the fence never sees the source quiet. The switch must give up, release the hold with the route unchanged,
    and the clients must go on at the source with nothing lost."""
    service: LookupProcess = live["service"]
    tenant = live["tenant"]
    clients = Clients(service.url, tenant)
    clients.start()
    bypass = pulsar.Client(cluster_a.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    rogue = bypass.subscribe(f"persistent://{tenant}/ns/events", "rogue", consumer_type=pulsar.ConsumerType.Shared)
    spec = write_spec(live["tmp"] / "spec.json", tenant, cluster_a, cluster_b,
                      lookup={"url": service.url, "token_env": "PM_TEST_LOOKUP_TOKEN"})
    run_dir = live["tmp"] / "run"
    import os

    os.environ["PM_TEST_LOOKUP_TOKEN"] = TOKEN
    try:
        time.sleep(2)
        assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(run_dir)]) == 0
        assert replicate(spec, run_dir) == 0
        assert sync(spec, run_dir) == 0
        code = run_step(STEP, run, ["--spec", str(spec), "--run-dir", str(run_dir)])
        time.sleep(8)  # the clients find the source again
    finally:
        os.environ.pop("PM_TEST_LOOKUP_TOKEN", None)
        rogue.close()
        bypass.close()
        clients.finish()
    report = json.loads((run_dir / f"{STEP}.json").read_text())
    assert code == 1 and report["details"]["rolled_back"] is True
    assert "rogue" in report["error"]  # found by the fence's wait or by the quiet check after the final delta
    route = service.api("GET", f"/routes/{tenant}").json()
    assert route["cluster"] == cluster_a.name and route["held"] is False
    for p in clients.producers:
        assert p.failed == [], p.failed[:5]
        partitions = 2 if p.topic.endswith("orders") else 0
        mine = [[int(x.split(":")[1]) for x in part if x.startswith(p.name + ":")]
                for part in stored(cluster_a, p.topic, partitions)]
        counts = Counter(n for part in mine for n in part)
        assert sorted(counts) == sorted(p.sent) and max(counts.values()) == 1, p.name
        # the clients carried on at the source after the rollback: the last sends are stored there too
        assert max(p.sent) > len(p.sent) // 2
    sent = {p.topic: {f"{p.name}:{n}" for n in p.sent} for p in clients.producers}
    for c in clients.consumers:
        assert not sent[c.topic] - {payload for payload, _ in c.received}, c.subscription
