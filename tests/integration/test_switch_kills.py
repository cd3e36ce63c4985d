"""switch_lookup SIGKILLed at each phase boundary (after the hold, after the unload, after the final copy, after the
flip), one boundary per run, each run picking up what the killed one left; then a run that ends it. The fault
points (`switch.after_<phase>`, PM_FAULT) park the step so each kill lands exactly there. The run killed after the
flip also meets a client that arrives after the fence's unload (one migrated tenant serves both: setting one up
costs more than all the runs).

After every kill the tenant is served by exactly one cluster or parked: the route names the source and is held
(lookups wait, nothing reaches either cluster) until the flip, then names the target with no hold. At the end
the target holds every source message once, in order per partition, each subscription delivers there exactly
what it delivers on the source, and a client through the lookup service lands on the target.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest
from localdev.pulsar_local import LocalCluster
from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.metadata.step import run as sync_metadata
from pulsar_migration.stepjob import run_step
from pulsar_migration.switch.step import STEP, run
from pyspark.sql import SparkSession

from tests.conftest import kill_at_fault_point, spark_submit, unique
from tests.integration.lookup_helpers import TOKEN, LookupProcess, start_service
from tests.integration.replication_helpers import client, drain, replicate
from tests.integration.stale_client import StaleProducer
from tests.integration.tenant_builders import drop_tenant, write_spec
from tests.integration.test_sync_progress import receive_expecting, sync

BOUNDARIES = ("hold", "fence", "final_replicate", "flip")
SUBSCRIPTIONS = {"ns/orders": "ord", "ns/events": "svc"}
PARTITIONS = {"ns/orders": 2, "ns/events": 0}


def partitions(tenant: str) -> list[str]:
    return [f"persistent://{tenant}/{t}-partition-{i}" if n else f"persistent://{tenant}/{t}"
            for t, n in PARTITIONS.items() for i in range(max(n, 1))]


def read_all(cluster: LocalCluster, topic: str) -> list[bytes]:
    return [m["data"] for m in drain(cluster, topic)]


def delivers(cluster: LocalCluster, topic: str, subscription: str, expect: int) -> Counter[bytes]:
    """What a fresh consumer of the subscription receives now (nothing acked), waiting patiently for the
    `expect` messages the test knows are there."""
    c = client(cluster)
    try:
        consumer = c.subscribe(topic, subscription, consumer_type=pulsar.ConsumerType.Shared)
        got = Counter(m.data() for m in receive_expecting(consumer, expect))
        consumer.close()
        return got
    finally:
        c.close()


@pytest.fixture
def prepared(cluster_a: LocalCluster, cluster_b: LocalCluster, spark: SparkSession, tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """A tenant with messages and part-acked subscriptions, copied and synced; its lookup service."""
    monkeypatch.setenv("PM_TEST_LOOKUP_TOKEN", TOKEN)  # the spec names the variable (steps here and spark-submit)
    service = start_service(tmp_path, [cluster_a, cluster_b], cluster_a)
    tenant = unique("it-switch-kill")
    admin_a = PulsarAdmin(cluster_a.admin_url, name=cluster_a.name)
    admin_b = PulsarAdmin(cluster_b.admin_url, name=cluster_b.name)
    admin_a.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": [cluster_a.name]})
    admin_a.put(f"/namespaces/{tenant}/ns")
    admin_a.post(f"/namespaces/{tenant}/ns/retention", {"retentionTimeInMinutes": 60, "retentionSizeInMB": 64})
    admin_a.put(f"/persistent/{tenant}/ns/orders/partitions", 2)
    admin_a.put(f"/persistent/{tenant}/ns/events")
    c = client(cluster_a)
    try:
        for topic, sub in SUBSCRIPTIONS.items():
            consumer = c.subscribe(f"persistent://{tenant}/{topic}", sub, consumer_type=pulsar.ConsumerType.Shared)
            producer = c.create_producer(f"persistent://{tenant}/{topic}", batching_enabled=False)
            for i in range(300):
                producer.send_async(f"{topic}-{i}".encode(), None, partition_key=f"k{i % 7}")
            producer.flush()
            for i, m in enumerate(receive_expecting(consumer, 300)):
                if i % 3 == 0:
                    consumer.acknowledge(m)
            consumer.close()
    finally:
        c.close()
    spec = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b,
                      lookup={"url": service.url, "token_env": "PM_TEST_LOOKUP_TOKEN"})
    run_dir = tmp_path / "run"
    assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(run_dir)]) == 0
    assert replicate(spec, run_dir) == 0
    assert sync(spec, run_dir) == 0
    try:
        yield {"service": service, "tenant": tenant, "spec": spec, "run": run_dir, "tmp": tmp_path}
    finally:
        service.stop()
        for admin in (admin_a, admin_b):
            drop_tenant(tenant, admin)
            admin.close()


def let_a_late_producer_in_then_kill_after_the_flip(spec: Path, run_dir: Path, marks: Path, topic: str,
                                                    cluster: LocalCluster) -> tuple[str, bool]:
    """A producer whose lookup was answered before the hold can reach the source after the fence. The run is parked
    right after the fence's unload (`switch.fence_unloaded`) while a producer standing in for that client connects
    (StaleProducer: it never reconnects on its own), then goes on and is SIGKILLed once it flipped the route
    (`switch.after_flip`). Returns the run's output and whether the broker closed the late producer."""
    admin = PulsarAdmin(cluster.admin_url, name=cluster.name)
    unloaded, flipped = "switch.fence_unloaded", "switch.after_flip"
    output = marks / f"{flipped}.log"
    marks.mkdir(parents=True, exist_ok=True)
    late: StaleProducer | None = None
    with output.open("w") as out:
        proc = spark_submit(STEP, spec, run_dir, env={"PM_FAULT": f"{unloaded}@1=300,{flipped}@1=600",
                                                      "PM_FAULT_MARK_DIR": str(marks)},
                            stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        for point in (unloaded, flipped):
            while not (marks / point).exists():
                assert proc.poll() is None and time.monotonic() < deadline, output.read_text()[-3000:]
                time.sleep(0.1)
            if point == unloaded:
                admin.get(f"{admin.topic_path(topic)}/stats")  # the bundle owned again, as the client's lookup had done
                late = StaleProducer("127.0.0.1", cluster.broker_port, topic, "late-after-fence")
                assert [p["producerName"] for p in admin.get(f"{admin.topic_path(topic)}/stats")["publishers"]] == [
                    "late-after-fence"]
                (marks / f"{unloaded}.go").touch()  # the late producer is in: the run goes on
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        assert late is not None
        return output.read_text(), late.closed_by_broker(timeout_s=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
        if late is not None:
            late.close()
        admin.close()


def test_killed_at_each_phase_boundary_then_rerun_ends_exact_and_a_client_after_the_fence_is_fenced_again(
        prepared: dict[str, Any], cluster_a: LocalCluster, cluster_b: LocalCluster) -> None:
    """The kills as the module says. The run killed after the flip also lets a late producer in right after its
    fence's unload: that run unloads the partition again (the client's next lookup is parked) instead of waiting
    out its timeout and rolling back, and goes on to the flip."""
    service: LookupProcess = prepared["service"]
    tenant, spec, run_dir = prepared["tenant"], prepared["spec"], prepared["run"]
    marks = prepared["tmp"] / "marks"
    events = f"persistent://{tenant}/ns/events"
    states = []
    for boundary in BOUNDARIES:
        if boundary == "flip":
            output, late_closed = let_a_late_producer_in_then_kill_after_the_flip(spec, run_dir, marks, events,
                                                                                 cluster_a)
            assert late_closed, output[-3000:]  # the step's second unload took it away
            # ... once, and only that partition (the run's fence found nobody else after its unload); the route
            # then names the target, released (states below): the run went on to the flip, no rollback.
            again = [line for line in output.splitlines() if "connected after the unload: unloading" in line]
            assert len(again) == 1 and "late-after-fence" in again[0], again
            assert again[0].endswith(f"unloading {events} again"), again
        else:
            kill_at_fault_point(STEP, spec, run_dir, f"switch.after_{boundary}", 1, marks)
        route = service.api("GET", f"/routes/{tenant}").json()
        states.append((boundary, route["cluster"], route["held"]))
    # Parked (source, held) until the flip; after it the target, released: never both, never neither unheld.
    assert states == [("hold", cluster_a.name, True), ("fence", cluster_a.name, True),
                      ("final_replicate", cluster_a.name, True), ("flip", cluster_b.name, False)], states
    # Each run after a kill while held first released the hold it found (its clients back to the source until its
    # own hold), rather than copying and syncing while they waited.
    history = service.api("GET", f"/routes/{tenant}/history").json()["events"]
    left = [e for e in history if e["reason"].startswith("a hold an earlier attempt left")]
    assert len(left) == 3 and {e["reason"] for e in left} == {
        f"a hold an earlier attempt left: released to {cluster_a.name}"}, history

    assert run_step(STEP, run, ["--spec", str(spec), "--run-dir", str(run_dir)]) == 0
    report = json.loads((run_dir / f"{STEP}.json").read_text())
    assert report["details"]["already_switched"] is True and report["details"]["probe"]["producer_on_target"]

    for topic in partitions(tenant):
        source = read_all(cluster_a, topic)
        assert source and read_all(cluster_b, topic) == source, topic  # every message once, in order
    for topic, sub in SUBSCRIPTIONS.items():
        full = f"persistent://{tenant}/{topic}"
        expected = delivers(cluster_a, full, sub, 200)
        assert sum(expected.values()) == 200 and delivers(cluster_b, full, sub, 200) == expected, topic
    # A client of the tenant, through the lookup service, now publishes to the target.
    c = pulsar.Client(service.url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        c.create_producer(events).send(b"after the kills")
    finally:
        c.close()
    assert read_all(cluster_b, events)[-1] == b"after the kills"
    assert b"after the kills" not in read_all(cluster_a, events)
