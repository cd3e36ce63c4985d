"""The live cutover: producers and consumers of every subscription type, and a producer of the distribution's Java
client, run through the lookup service while the tenant is migrated and switched. Judged on the target's storage
(each sent message exactly once, per producer order kept), on what the clients saw (no failed send, every message
received by every subscription) and on redelivery, counted against Pulsar's own floor: the same clients while
their namespace is merely unloaded within one cluster, in the same run.

Here geo mode, with every live client on TLS (client certificates, the lookup service on HTTPS, the brokers' TLS
ports, checked connection by connection); copy mode's cutover is judged the same way in test_rollback_live, with
plain clients, on one migration that also serves a switch failing before the flip and the rollback after it (each
migration of a live tenant costs a minute). Both use the clients and checks defined here."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pulsar
import pytest
from localdev.pulsar_dist import pulsar_home
from localdev.pulsar_local import LocalCluster
from localdev.pulsar_tls import LocalTls, broker_tls_port
from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.metadata.step import run as sync_metadata
from pulsar_migration.stepjob import run_step
from pulsar_migration.switch import probe as probe_module
from pulsar_migration.switch import rollback
from pulsar_migration.switch.step import STEP, run
from pyspark.sql import SparkSession

from tests.conftest import kill_at_fault_point, unique
from tests.integration.lookup_helpers import TOKEN, LookupProcess, start_service
from tests.integration.replication_helpers import (
    client,
    create_layout,
    partition_names,
    replicate,
    replicate_report,
)
from tests.integration.tenant_builders import write_spec
from tests.integration.test_replicate_geo import teardown
from tests.integration.test_sync_progress import SUBSCRIPTIONS as ACK_PATTERNS
from tests.integration.test_sync_progress import (
    ack_pattern,
    ack_patterns,
    backlog,
    drains_differ,
    progress_report,
    subscribe,
    sync,
)

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
    """Producers and consumers on one client whose service URL is the lookup service; with `tls`, the client trusts
    the local authority and shows the client certificate."""

    def __init__(self, url: str, tenant: str, tls: LocalTls | None = None) -> None:
        secure: dict[str, Any] = {}
        if tls:
            secure = {"authentication": pulsar.AuthenticationTLS(str(tls.client_cert), str(tls.client_key)),
                      "tls_trust_certs_file_path": str(tls.ca_cert), "tls_allow_insecure_connection": False}
        self.client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn),
                                    operation_timeout_seconds=30, **secure)
        self.stop = threading.Event()
        self.stop_producing = threading.Event()
        self.paused = threading.Event()
        orders, events = f"persistent://{tenant}/ns/orders", f"persistent://{tenant}/ns/events"
        self.producers = [ProducerRun("orders-producer", orders, True), ProducerRun("events-producer", events, False)]
        self.consumers = [ConsumerRun(orders, "shared", pulsar.ConsumerType.Shared),
                          ConsumerRun(orders, "key-shared", pulsar.ConsumerType.KeyShared),
                          ConsumerRun(orders, "failover", pulsar.ConsumerType.Failover),
                          ConsumerRun(events, "exclusive", pulsar.ConsumerType.Exclusive)]
        self.sending = {p.name: threading.Lock() for p in self.producers}  # held while a send is handed over
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
            with self.sending[p.name]:
                if not self.paused.is_set():
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

    def settle(self, timeout_s: float = 60.0) -> None:
        """Pauses the producers (connected, sending nothing) until `resume`, and waits until every send was
        answered and every consumer received every acknowledged send of its topic, at most `timeout_s`: checks
        made then judge the clusters as after `finish`, and say what is missing."""
        self.paused.set()
        for sending in self.sending.values():
            with sending:  # a send handed over just before the pause is counted in `next` now
                pass
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self._settled():
            time.sleep(0.2)

    def _settled(self) -> bool:
        if any(len(p.sent) + len(p.failed) < p.next for p in self.producers):
            return False
        sent = self.acknowledged()
        return all(not sent[c.topic] - {payload for payload, _ in list(c.received)} for c in self.consumers)

    def resume(self) -> None:
        self.paused.clear()

    def acknowledged(self) -> dict[str, set[str]]:
        """Per topic: the payloads of the sends the broker acknowledged."""
        return {p.topic: {f"{p.name}:{n}" for n in list(p.sent)} for p in self.producers}

    def finish(self, idle_s: float = 4.0, patience_s: float = 120.0) -> None:
        """Stops the producers and lets the consumers take what is left: `idle_s`, and on up to `patience_s`
        while an acknowledged send is still unreceived (a loaded host delivers late; a lost message still fails
        the caller's check, later)."""
        self.stop_producing.set()
        time.sleep(idle_s)
        deadline = time.monotonic() + patience_s
        while not self._settled() and time.monotonic() < deadline:
            time.sleep(1.0)
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


def java_producer(url: str, topic: str, tls: LocalTls | None = None) -> subprocess.Popen[str]:
    """The distribution's Java client producing JAVA_CYCLE JAVA_REPEAT times at 20 msg/s (about 45 s); with `tls`,
    its client.conf trusts the local authority and shows the client certificate (`--url` is still `url`)."""
    command = [str(pulsar_home() / "bin" / "pulsar-client"), "--url", url, "produce", topic, "-n", str(JAVA_REPEAT),
               "-r", "20", *(arg for m in JAVA_CYCLE for arg in ("-m", m))]
    env = {**os.environ, **({"PULSAR_CLIENT_CONF": str(tls.client_conf(0))} if tls else {})}
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


class PortsSeen:
    """The remote ports a process's TCP connections reach, sampled every 0.2 s on a thread until `stop`."""

    def __init__(self, pid: int) -> None:
        self.pid, self.ports, self.halt = pid, set[int](), threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        with contextlib.suppress(psutil.NoSuchProcess):
            process = psutil.Process(self.pid)
            while not self.halt.wait(0.2):
                self.ports |= {c.raddr.port for c in process.net_connections(kind="tcp") if c.raddr}

    def stop(self) -> set[int]:
        self.halt.set()
        self.thread.join(10)
        return self.ports


def broker_ports_of(clients: Clients, admin: PulsarAdmin) -> dict[str, int | None]:
    """Per live producer and consumer the cluster behind `admin` serves: the broker port its connection reaches
    (the broker's topic stats give the client's address, this process's sockets the port that address talks to)."""
    remote = {c.laddr.port: c.raddr.port for c in psutil.Process().net_connections(kind="tcp") if c.raddr}
    seen: dict[str, int | None] = {}
    for topic, partitions in ((p.topic, 2 if p.topic.endswith("orders") else 0) for p in clients.producers):
        for name in partition_names(topic, partitions):
            stats = admin.get(f"/persistent/{name.removeprefix('persistent://')}/stats")
            for producer in stats["publishers"]:
                seen[f"{producer['producerName']}@{name}"] = remote.get(int(producer["address"].rsplit(":", 1)[1]))
            for subscription, sub_stats in stats["subscriptions"].items():
                for consumer in sub_stats["consumers"]:
                    seen[f"{subscription}@{name}"] = remote.get(int(consumer["address"].rsplit(":", 1)[1]))
    return seen


def assert_on_tls_port(clients: Clients, admin: PulsarAdmin, port: int) -> None:
    """Every live producer and consumer (3 producers and 7 consumers over the partitions) is connected to `port`."""
    seen = broker_ports_of(clients, admin)
    assert len(seen) == 10 and set(seen.values()) == {port}, seen


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
        for name in partition_names(topic, partitions):
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
            for name in partition_names(topic, partitions):
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


@contextlib.contextmanager
def live_tenant(cluster_a: LocalCluster, cluster_b: LocalCluster, tmp_path: Path,
                tls: LocalTls | None) -> Iterator[dict[str, Any]]:
    """A tenant on cluster-a for live clients, and the lookup service routing to both clusters (over TLS: `tls`)."""
    service = start_service(tmp_path, [cluster_a, cluster_b], cluster_a, tls=tls)
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
        yield {"service": service, "tenant": tenant, "admin_a": admin_a, "admin_b": admin_b, "tmp": tmp_path,
               "tls": tls}
    finally:
        service.stop()
        teardown(tenant, admin_a, admin_b, cluster_a.name)  # geo mode: replication off first, then delete
        for admin in (admin_a, admin_b):
            admin.close()


@pytest.fixture
def live(cluster_a: LocalCluster, cluster_b: LocalCluster, tmp_path: Path) -> Iterator[dict[str, Any]]:
    with live_tenant(cluster_a, cluster_b, tmp_path, None) as tenant:
        yield tenant


@pytest.fixture
def live_over_tls(cluster_a: LocalCluster, cluster_b: LocalCluster, tmp_path: Path) -> Iterator[dict[str, Any]]:
    with live_tenant(cluster_a, cluster_b, tmp_path, LocalTls.default().ensure()) as tenant:
        yield tenant


def unload_floor(clients: Clients, admin: PulsarAdmin, tenant: str) -> dict[str, int]:
    """Pulsar's own floor: what the same clients receive twice while their namespace is merely unloaded within
    one cluster (logged next to the cutover's figure, not asserted: see the README)."""
    time.sleep(3)
    floor_from = time.monotonic()
    admin.put(f"/namespaces/{tenant}/ns/unload", expect_json=False)
    time.sleep(6)
    return clients.duplicates(floor_from, time.monotonic())


def live_spec(live: dict[str, Any], cluster_a: LocalCluster, cluster_b: LocalCluster, mode: str,
              monkeypatch: pytest.MonkeyPatch) -> Path:
    """The spec of a live test: `mode`, the lookup service (its token in the environment the spec names); for a
    live tenant over TLS, the clusters' and the service's TLS URLs with the authority and the client certificate."""
    monkeypatch.setenv("PM_TEST_LOOKUP_TOKEN", TOKEN)
    lookup = {"url": live["service"].url, "token_env": "PM_TEST_LOOKUP_TOKEN"}
    path = write_spec(live["tmp"] / "spec.json", live["tenant"], cluster_a, cluster_b, replication={"mode": mode},
                      options={"geo_timeout_s": 120}, lookup=lookup)
    tls: LocalTls | None = live["tls"]
    if tls:  # every step, and the switch's probe, reaches both clusters and the service over TLS only
        doc = json.loads(path.read_text())
        doc["lookup"]["trust_certs_file"] = str(tls.ca_cert)
        doc["clusters"] = {c.name: tls.spec_entry(c.index) for c in (cluster_a, cluster_b)}
        path.write_text(json.dumps(doc))
    return path


def migrate(spec: Path, run_dir: Path) -> None:
    """The steps before the switch, in this process."""
    assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(run_dir)]) == 0
    assert replicate(spec, run_dir) == 0
    assert sync(spec, run_dir) == 0


@dataclass
class Cutover:
    code: int
    report: dict[str, Any]
    redelivered: dict[str, int]  # per subscription, within 6 s of the switch's start
    java: subprocess.Popen[str]
    java_out: str
    java_ports: set[int]  # the remote ports the Java client's connections reached


def switch_with_java_publishing(live: dict[str, Any], spec: Path, run_dir: Path, clients: Clients) -> Cutover:
    """The switch while the Java producer publishes across it (started first, seen storing at the source)."""
    service: LookupProcess = live["service"]
    java_topic = f"persistent://{live['tenant']}/ns/java"
    java = java_producer(service.url, java_topic, live["tls"])
    ports = PortsSeen(java.pid)
    try:
        publishing_at_the_source(live["admin_a"], java_topic, java)
        switch_from = time.monotonic()
        code = run_step(STEP, run, ["--spec", str(spec), "--run-dir", str(run_dir)])
        time.sleep(6)
        redelivered = clients.duplicates(switch_from, time.monotonic())
        java_out, _ = java.communicate(timeout=180)
    finally:
        if java.poll() is None:  # the test failed before it ended: not left publishing into the next one
            java.kill()
            java.wait(timeout=60)
        ports.stop()
    return Cutover(code, json.loads((run_dir / f"{STEP}.json").read_text()), redelivered, java, java_out, ports.ports)


def judge_the_cutover(live: dict[str, Any], cluster_a: LocalCluster, cluster_b: LocalCluster, mode: str,
                      clients: Clients, floor: dict[str, int], cutover: Cutover) -> None:
    """After the switch, with the clients finished or settled: the route names the target; every acknowledged
    send is stored there exactly once, in send order per producer and partition; no send failed; every
    subscription received every message; the Java producer's sends all succeeded and are on the target once,
    in order."""
    service: LookupProcess = live["service"]
    tenant, report = live["tenant"], cutover.report
    stalls = sorted(s for p in clients.producers for s in p.stalls)
    log.info("switch (%s mode): %s; hold %ss; phases %s; duplicates received: unload floor %s, cutover %s; "
             "publish stall p50 %.3fs p99 %.3fs max %.3fs", mode, report["verdict"], report["details"].get("hold_s"),
             report["details"].get("phases_s"), floor, cutover.redelivered, stalls[len(stalls) // 2],
             stalls[int(len(stalls) * 0.99)], stalls[-1])
    assert cutover.code == 0, report.get("error")
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
    sent = clients.acknowledged()
    for c in clients.consumers:
        missing = sent[c.topic] - {payload for payload, _ in c.received}
        assert not missing, f"{c.subscription} never received {sorted(missing)[:5]}"
    # The Java client (the distribution's bin/pulsar-client, synchronous sends, default 30 s timeout) published
    # across the switch: every send succeeded and the target holds the cycle exactly, in order.
    java_out = cutover.java_out
    assert cutover.java.returncode == 0 and f"{JAVA_TOTAL} messages successfully produced" in java_out, java_out[-3000:]
    assert stored(cluster_b, f"persistent://{tenant}/ns/java", 0) == [JAVA_CYCLE * JAVA_REPEAT]
    if mode == "copy":  # the final delta went through the engine started before the hold (Java binary keys)
        assert report["details"]["final_replicate"]["copy_engine"] == "java", report["details"]["final_replicate"]
    if mode == "geo":
        # The target's dedup was taught the fenced producers' sequence ids (switch.geo_dedup): without it a
        # re-send of a message the replicator had carried was stored twice (3 of about 7 runs before).
        taught = report["details"]["target_dedup"]
        assert taught["producers"] >= len(clients.producers) and taught["sequence_ids_known"] > 0, taught


def carried_on(clients: Clients, where: str, timeout_s: float = 60.0) -> dict[str, int]:
    """Waits until every producer has a send made from now on acknowledged and every subscription received one
    (where the route names now, the caller knows which cluster that is); returns the producers' marks."""
    marks = {p.name: p.next for p in clients.producers}
    producer_of = {p.topic: p.name for p in clients.producers}
    deadline = time.monotonic() + timeout_s
    while True:
        done = {p.name: any(n >= marks[p.name] for n in list(p.sent)) for p in clients.producers}
        for c in clients.consumers:
            mark = marks[producer_of[c.topic]]
            done[c.subscription] = any(int(payload.split(":")[1]) >= mark for payload, _ in list(c.received))
        if all(done.values()):
            return marks
        assert time.monotonic() < deadline, f"clients stalled {where}: {done}"
        time.sleep(0.5)


DEDUP_BEHIND = "the target's deduplication knows producer"  # switch.geo_dedup.TargetDedupBehind's line


@dataclass
class RollbackRun:
    code: int
    report: dict[str, Any]
    on_target_from: dict[str, int]  # the producers' marks when every client was seen carrying on at the target
    redelivered: dict[str, int]  # per subscription, from the rollback's start until the clients carry on again


def roll_back_live(clients: Clients, args: list[str], run_dir: Path) -> RollbackRun:
    """With the clients on the target: waits until they carry on there, runs rollback_lookup, waits until they
    carry on again (at the source, if it worked)."""
    on_target_from = carried_on(clients, "on the target")
    back_from = time.monotonic()
    code = run_step(rollback.STEP, rollback.run, args)
    report = json.loads((run_dir / f"{rollback.STEP}.json").read_text())
    if code != 0 and DEDUP_BEHIND in (report.get("error") or ""):
        # Geo mode's known limit (README, "Geo mode and the target's dedup"): a dedup snapshot the target took after
        # a producer's last replicated entry hides it from the reload's replay, and the step rolls back naming the
        # producer. What an operator (or Airflow's retry) does: run it again once the clients sent more.
        log.warning("rollback refused by the dedup check (%s): running it again after more traffic", report["error"])
        carried_on(clients, "after the refused rollback")
        code = run_step(rollback.STEP, rollback.run, args)
        report = json.loads((run_dir / f"{rollback.STEP}.json").read_text())
    carried_on(clients, "after the rollback")
    return RollbackRun(code, report, on_target_from, clients.duplicates(back_from, time.monotonic()))


def judge_back_on_source(clients: Clients, cluster_a: LocalCluster, on_target_from: dict[str, int]) -> None:
    """After a rollback, with the clients finished or settled: the source holds every acknowledged send exactly
    once, in send order per producer and partition (sends made on the target between the switch and the rollback
    included); no send failed; every subscription received every message."""
    for p in clients.producers:
        # messages were published on the target between the switch and the rollback, and after it on the source
        assert on_target_from[p.name] < max(p.sent)
    judge_all_stored_on(clients, cluster_a)


def judge_all_stored_on(clients: Clients, cluster: LocalCluster) -> None:
    """With the clients finished or settled: `cluster` holds every acknowledged send exactly once, in send order
    per producer and partition; no send failed; every subscription received every message."""
    for p in clients.producers:
        assert p.failed == [], p.failed[:5]
        partitions = 2 if p.topic.endswith("orders") else 0
        mine = [[int(x.split(":")[1]) for x in part if x.startswith(p.name + ":")]
                for part in stored(cluster, p.topic, partitions)]
        counts = Counter(n for part in mine for n in part)
        assert sorted(counts) == sorted(p.sent), f"{p.name}: {cluster.name}'s set differs from the acknowledged sends"
        assert max(counts.values()) == 1, f"{p.name}: stored twice: {[n for n, k in counts.items() if k > 1][:5]}"
        for part in mine:
            assert part == sorted(part), f"{p.name}: order broken in storage"
    sent = clients.acknowledged()
    for c in clients.consumers:
        assert not sent[c.topic] - {payload for payload, _ in c.received}, c.subscription


AGAIN_RUN_DIR = "run-again"  # the run dir of migrate_again's run, in the live tenant's tmp dir


def migrate_again(live: dict[str, Any], spec: Path, run_dir: Path, clients: Clients, *,
                  fresh_fails: bool) -> tuple[dict[str, int], list[str]]:
    """After the rollback, the clients on the source: a new run that continues the rolled-back one migrates what
    the source got since, and switches the clients. Returns the producers' marks from before that migration and
    the new run's step arguments. `fresh_fails`: first, a new run that does not continue it fails in one line
    naming the way out."""
    cluster_b = live["admin_b"].name
    if fresh_fails:
        fresh = live["tmp"] / "run-fresh"
        assert replicate(spec, fresh) == 1
        refused = replicate_report(fresh)
        way_out = "continue from the rolled-back run (options.follows_run_dir"
        errors = [refused["error"], *(row.get("error") or "" for row in refused["details"].get("partitions", []))]
        assert any(way_out in error for error in errors), errors

    doc = json.loads(spec.read_text())
    doc["options"]["follows_run_dir"] = str(run_dir)
    second_spec, second = live["tmp"] / "spec-again.json", live["tmp"] / AGAIN_RUN_DIR
    second_spec.write_text(json.dumps(doc))
    marks = carried_on(clients, "at the source before the second migration")
    migrate(second_spec, second)
    copied = replicate_report(second)
    log.info("second migration: seeded %s map rows, %s messages replicated", copied["details"]["map_rows_seeded"],
             copied["counts"].get("copied_messages"))
    assert copied["details"]["follows_run_dir"] == str(run_dir) and copied["details"]["map_rows_seeded"] > 0
    switched = run_step(STEP, run, ["--spec", str(second_spec), "--run-dir", str(second)])
    report = json.loads((second / f"{STEP}.json").read_text())
    assert switched == 0, report.get("error")
    assert report["details"]["route_after"] == cluster_b
    log.info("second switch: hold %ss, phases %s", report["details"]["hold_s"], report["details"]["phases_s"])
    return marks, ["--spec", str(second_spec), "--run-dir", str(second)]


def judge_migrated_again(live: dict[str, Any], cluster_b: LocalCluster, clients: Clients, back: RollbackRun,
                         again_from: dict[str, int]) -> None:
    """With the clients on the target after migrate_again's switch: settled, they must have published on the
    source after the rollback and on the target again, and the target must hold every acknowledged send of the
    whole test once, in order, and the Java producer's cycle once (its copies on the source not copied back);
    then they go on."""
    clients.settle()
    for p in clients.producers:
        assert back.on_target_from[p.name] < again_from[p.name] < max(p.sent)
    judge_all_stored_on(clients, cluster_b)
    assert stored(cluster_b, f"persistent://{live['tenant']}/ns/java", 0) == [JAVA_CYCLE * JAVA_REPEAT]
    clients.resume()


def roll_back_again(live: dict[str, Any], cluster_a: LocalCluster, clients: Clients,
                    again_args: list[str]) -> RollbackRun:
    """The rollback of migrate_again's run, the clients on the target: it must switch them back to the source."""
    back_again = roll_back_live(clients, again_args, live["tmp"] / AGAIN_RUN_DIR)
    assert back_again.code == 0, back_again.report.get("error")
    assert back_again.report["details"]["route_after"] == cluster_a.name
    log.info("second rollback: hold %ss", back_again.report["details"]["hold_s"])
    return back_again


def judge_back_again(live: dict[str, Any], cluster_a: LocalCluster, clients: Clients,
                     back_again: RollbackRun) -> None:
    """After roll_back_again, with the clients finished: the source holds every acknowledged send of the whole test
    once, in order, and the Java producer's cycle once."""
    judge_back_on_source(clients, cluster_a, back_again.on_target_from)
    assert stored(cluster_a, f"persistent://{live['tenant']}/ns/java", 0) == [JAVA_CYCLE * JAVA_REPEAT]


# Topics no live client touches, acked in test_sync_progress's patterns before the geo-mode migration, which
# thereby also judges sync_progress over the map native geo-replication's `__MSG_PROP_REPL_SOURCE_POSITION` gives.
QUIET_TOPICS = {"ns/batched2": 2, "ns/audit": 0}
QUIET_MESSAGES = 800  # per topic


def quiet(topic: str) -> str | None:
    """The quiet topic a partition's full name belongs to, if any."""
    name = topic.split("/", 3)[-1].split("-partition-")[0]
    return name if name in QUIET_TOPICS else None


def ack_patterned_topics(admin: PulsarAdmin, cluster: LocalCluster, tenant: str) -> None:
    """QUIET_TOPICS created, filled (batched on the partitioned one) and acked in every pattern."""
    create_layout(admin, tenant, QUIET_TOPICS)
    c = client(cluster)
    try:
        consumers = {(topic, name): subscribe(c, f"persistent://{tenant}/{topic}", name, kind)
                     for topic in QUIET_TOPICS for name, (kind, _) in ACK_PATTERNS.items()}
        batched = c.create_producer(f"persistent://{tenant}/ns/batched2", batching_enabled=True,
                                    batching_max_messages=8, batching_max_publish_delay_ms=20)
        plain = c.create_producer(f"persistent://{tenant}/ns/audit", batching_enabled=False)
        for i in range(QUIET_MESSAGES):
            batched.send_async(f"batched2-{i}".encode(), None, partition_key=f"k{i % 13}")
            plain.send_async(f"audit-{i}".encode(), None, partition_key=f"k{i % 3}")
        batched.flush()
        plain.flush()
        ack_patterns(consumers, seed=3)
    finally:
        c.close()


def judge_geo_progress(live: dict[str, Any], cluster_a: LocalCluster, cluster_b: LocalCluster, spec: Path,
                       run_dir: Path) -> None:
    """sync_progress in geo mode on the quiet topics: every subscription drains the same on both clusters after the
    migration's sync; after more acks on one subscription and a rewind of another, a re-sync sets exactly those
    two and they drain the same again."""
    tenant, admin_a = live["tenant"], live["admin_a"]
    rep = progress_report(run_dir)
    assert rep["counts"]["lost"] == 0 == rep["counts"]["duplicated"]
    assert sum(1 for d in rep["details"]["subscriptions"] if quiet(d["topic"])) == 15
    differences, drained = drains_differ(cluster_a, cluster_b, tenant, ACK_PATTERNS, list(QUIET_TOPICS))
    assert differences == {} and drained == backlog(rep, list(QUIET_TOPICS), list(ACK_PATTERNS)) > 0

    c = client(cluster_a)
    try:
        consumer = subscribe(c, f"persistent://{tenant}/ns/audit", "keyshared-30", pulsar.ConsumerType.KeyShared)
        ack_pattern(consumer, "random", random.Random(5), share=0.5)
        consumer.close()
    finally:
        c.close()
    first = admin_a.get(f"/persistent/{tenant}/ns/audit/internalStats")["ledgers"][0]["ledgerId"]
    admin_a.post(f"/persistent/{tenant}/ns/audit/subscription/exclusive-all/resetcursor",
                 {"ledgerId": first, "entryId": QUIET_MESSAGES // 4})
    assert sync(spec, run_dir) == 0
    rep = progress_report(run_dir)
    assert rep["counts"]["lost"] == 0 == rep["counts"]["duplicated"]
    set_here = sorted((quiet(d["topic"]), d["subscription"]) for d in rep["details"]["subscriptions"]
                      if quiet(d["topic"]) and "apply_s" in d)  # applied by this run (live ones move too)
    assert set_here == [("ns/audit", "exclusive-all"), ("ns/audit", "keyshared-30")], set_here
    subs = {k: ACK_PATTERNS[k] for k in ("keyshared-30", "exclusive-all")}
    differences, drained = drains_differ(cluster_a, cluster_b, tenant, subs, ["ns/audit"])
    assert differences == {} and drained == backlog(rep, ["ns/audit"], list(subs))


def test_live_cutover_in_geo_mode_and_back_with_clients_on_tls(
        live_over_tls: dict[str, Any], cluster_a: LocalCluster, cluster_b: LocalCluster, spark: SparkSession,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The cutover with native geo-replication carrying the data, then the rollback (geo mode: the target's
    replication carries back what clients published there), every live client on TLS with a client certificate:
    the lookup service answers over HTTPS and forwards to the brokers' TLS ports, and the clients' connections are
    checked against the brokers' own view (each producer and consumer on cluster-a's TLS port before, on
    cluster-b's after the switch, on cluster-a's again after the rollback; the Java client never on a plain broker
    port). The first rollback run is SIGKILLed after its catch-up; the next one finishes it. Then the tenant is
    migrated again by a run continuing the rolled-back one and the clients switched to the target once more (the
    target then holds every acknowledged send once, in order), and back by that run's rollback (the source then
    does). Copy mode's cutover and rollback are in
    test_rollback_live. Before the switch, the same migration judges sync_progress in geo mode
    on quiet topics (judge_geo_progress)."""
    live = live_over_tls
    ack_patterned_topics(live["admin_a"], cluster_a, live["tenant"])
    clients = Clients(live["service"].url, live["tenant"], live["tls"])
    clients.start()
    spec, run_dir = live_spec(live, cluster_a, cluster_b, "geo", monkeypatch), live["tmp"] / "run"
    args = ["--spec", str(spec), "--run-dir", str(run_dir)]
    try:
        assert_on_tls_port(clients, live["admin_a"], broker_tls_port(cluster_a.index))
        floor = unload_floor(clients, live["admin_a"], live["tenant"])
        migrate(spec, run_dir)
        judge_geo_progress(live, cluster_a, cluster_b, spec, run_dir)
        cutover = switch_with_java_publishing(live, spec, run_dir, clients)
        assert_on_tls_port(clients, live["admin_b"], broker_tls_port(cluster_b.index))
        clients.settle()
        judge_the_cutover(live, cluster_a, cluster_b, "geo", clients, floor, cutover)
        clients.resume()

        # A rollback SIGKILLed after its catch-up (the target now replicating back, the reverse map begun; no hold
        # yet): the clients go on at the target, and the next run finishes the job.
        kill_at_fault_point(rollback.STEP, spec, run_dir, "switch.after_catch_up", 1, live["tmp"] / "marks")
        route = live["service"].api("GET", f"/routes/{live['tenant']}").json()
        assert (route["cluster"], route["held"]) == (cluster_b.name, False), route
        back = roll_back_live(clients, args, run_dir)
        assert back.code == 0, back.report.get("error")
        assert_on_tls_port(clients, live["admin_a"], broker_tls_port(cluster_a.index))
        log.info("rollback (geo mode): hold %ss, phases %s, redelivered after it %s",
                 back.report["details"]["hold_s"], back.report["details"]["phases_s"], back.redelivered)
        assert back.report["details"]["route_after"] == cluster_a.name
        clients.settle()
        judge_back_on_source(clients, cluster_a, back.on_target_from)
        probe_again_over_tls(spec, run_dir, cluster_a, live["service"], monkeypatch)
        clients.resume()

        # Migrating again (both sides replicate to each other since the rollback): a run that does not continue
        # the rolled-back one fails naming the way out; one that does pairs only what the source got since, and
        # the clients move to the target again.
        again_from, again_args = migrate_again(live, spec, run_dir, clients, fresh_fails=True)
        carried_on(clients, "on the target after the second switch")
        assert_on_tls_port(clients, live["admin_b"], broker_tls_port(cluster_b.index))
        judge_migrated_again(live, cluster_b, clients, back, again_from)

        # ... and back once more by the continuing run's rollback (both sides replicate to each other already).
        back_again = roll_back_again(live, cluster_a, clients, again_args)
        assert_on_tls_port(clients, live["admin_a"], broker_tls_port(cluster_a.index))
    finally:
        clients.finish()
    judge_back_again(live, cluster_a, clients, back_again)
    tls_ports = {broker_tls_port(c.index) for c in (cluster_a, cluster_b)}
    plain_ports = {c.broker_port for c in (cluster_a, cluster_b)}
    assert tls_ports <= cutover.java_ports and not plain_ports & cutover.java_ports, cutover.java_ports


def probe_again_over_tls(spec: Path, run_dir: Path, cluster_a: LocalCluster, service: LookupProcess,
                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A re-run of the rollback finds the route back on the source and probes again through the HTTPS service:
    passes with the spec's TLS entry for the source; with a plain entry (no client certificate for the brokers'
    TLS ports) it fails in one line naming what to check, exit 1, and the route stays (its client retries the
    refused handshake until its timeout: 5 s here instead of 30); with the spec put right it passes again."""
    args = ["--spec", str(spec), "--run-dir", str(run_dir)]
    usual_timeout_s = probe_module.PROBE_TIMEOUT_S
    monkeypatch.setattr(probe_module, "PROBE_TIMEOUT_S", 5)
    assert run_step(rollback.STEP, rollback.run, args) == 0
    report = json.loads((run_dir / f"{rollback.STEP}.json").read_text())
    assert report["details"]["already_rolled_back"] and report["details"]["probe"]["producer_on_target"], report
    doc = json.loads(spec.read_text())
    doc["clusters"][cluster_a.name] = {"admin_url": cluster_a.admin_url, "service_url": cluster_a.service_url}
    plain_source = spec.with_name("plain-source.json")
    plain_source.write_text(json.dumps(doc))
    assert run_step(rollback.STEP, rollback.run, ["--spec", str(plain_source), "--run-dir", str(run_dir)]) == 1
    error = json.loads((run_dir / f"{rollback.STEP}.json").read_text())["error"]
    assert error.startswith("probe: a client through the lookup service") and "trust_certs_file" in error, error
    assert service.api("GET", f"/routes/{json.loads(spec.read_text())['tenant']}").json()["cluster"] == cluster_a.name
    monkeypatch.setattr(probe_module, "PROBE_TIMEOUT_S", usual_timeout_s)  # later probes: the usual patience
    assert run_step(rollback.STEP, rollback.run, args) == 0  # the spec put right: the rollback reports ok again
