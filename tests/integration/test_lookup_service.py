"""The lookup service as clients meet it: the real service process (`python -m pulsar_migration.lookup`), the real
cluster pair, the Python client and the distribution's Java `bin/pulsar-client` using it as their service URL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pulsar
import pytest
from localdev.pulsar_dist import pulsar_home
from localdev.pulsar_local import LocalCluster
from pulsar_migration.admin import PulsarAdmin

from tests.conftest import unique
from tests.integration.lookup_helpers import HOLD_TIMEOUT_S, TOKEN, LookupProcess, start_service
from tests.integration.tenant_builders import drop_tenant


@pytest.fixture(scope="module")
def service(cluster_a: LocalCluster, cluster_b: LocalCluster, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[LookupProcess]:
    process = start_service(tmp_path_factory.mktemp("lookup"), [cluster_a, cluster_b], cluster_a, HOLD_TIMEOUT_S)
    yield process
    process.stop()


@pytest.fixture(scope="module")
def tenant(cluster_a: LocalCluster, cluster_b: LocalCluster) -> Iterator[str]:
    """A tenant on both clusters (namespace ns), each side with its own data."""
    name = unique("it-lookup")
    admins = [PulsarAdmin(c.admin_url, name=c.name) for c in (cluster_a, cluster_b)]
    for admin, cluster in zip(admins, (cluster_a, cluster_b), strict=True):
        admin.put(f"/tenants/{name}", {"adminRoles": [], "allowedClusters": [cluster.name]})
        admin.put(f"/namespaces/{name}/ns")
        admin.put(f"/persistent/{name}/ns/parts/partitions", 2)
    yield name
    for admin in admins:
        drop_tenant(name, admin)
        admin.close()


def landed_on(cluster: LocalCluster, topic: str) -> list[bytes]:
    c = pulsar.Client(cluster.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        reader = c.create_reader(topic, pulsar.MessageId.earliest)
        out = []
        while reader.has_message_available():
            out.append(reader.read_next(5_000).data())
        return out
    finally:
        c.close()


def send_through(service: LookupProcess, topic: str, payload: bytes) -> None:
    c = pulsar.Client(service.url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn), operation_timeout_seconds=30)
    try:
        c.create_producer(topic).send(payload)
    finally:
        c.close()


def test_admin_api_refuses_missing_or_wrong_tokens_and_changes_nothing(service: LookupProcess, tenant: str) -> None:
    for token in (None, "wrong", TOKEN + "x"):
        assert service.api("GET", "/routes", token=token).status_code == 401
        assert service.api("PUT", f"/routes/{tenant}", token=token, json={"cluster": "cluster-b"}).status_code == 401
        assert service.api("POST", f"/routes/{tenant}/hold", token=token, json={}).status_code == 401
    route = service.api("GET", f"/routes/{tenant}").json()
    assert route["default"] is True and route["held"] is False
    assert service.api("GET", f"/routes/{tenant}/history").json()["events"] == []
    assert service.api("PUT", f"/routes/{tenant}", json={"cluster": "cluster-z"}).status_code == 400
    metrics = httpx.get(f"{service.url}/metrics").text
    assert "pulsar_lookup_unauthorized_total 9" in metrics


def test_oversized_bodies_and_bad_tenant_names_are_refused_and_change_nothing(service: LookupProcess,
                                                                             tenant: str) -> None:
    huge = {"cluster": "cluster-b", "reason": "x" * (2 << 20)}  # 2 MiB
    declared = service.api("PUT", f"/routes/{tenant}", json=huge)
    assert declared.status_code == 413 and "larger than 65536 bytes" in declared.json()["reason"]

    def chunks() -> Iterator[bytes]:  # streamed without a Content-Length
        yield b'{"cluster": "cluster-b", "reason": "'
        for _ in range(64):
            yield b"y" * 4096
        yield b'"}'

    streamed = httpx.put(f"{service.url}/api/v1/routes/{tenant}", content=chunks(), timeout=30,
                         headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    assert streamed.status_code == 413
    assert service.api("PUT", f"/routes/{tenant}", json={"cluster": "cluster-b", "reason": "r" * 1001}
                       ).status_code == 422  # the reason's own bound
    for bad in ("a b", "x" * 256, "t%2Fns"):
        assert service.api("PUT", f"/routes/{bad}", json={"cluster": "cluster-b"}).status_code in (400, 404), bad
        assert service.api("POST", f"/routes/{bad}/hold", json={}).status_code in (400, 404), bad
    assert service.api("PUT", "/routes/a%20b", json={"cluster": "cluster-b"}).json()["detail"].startswith(
        "tenant must be a Pulsar tenant name")
    assert all(r["tenant"] != tenant for r in service.api("GET", "/routes").json()["routes"])
    route = service.api("GET", f"/routes/{tenant}").json()
    assert route["default"] is True and route["held"] is False
    assert service.api("GET", f"/routes/{tenant}/history").json()["events"] == []


def test_unknown_tenant_goes_to_the_default_and_a_route_moves_clients(
        service: LookupProcess, tenant: str, cluster_a: LocalCluster, cluster_b: LocalCluster) -> None:
    topic = f"persistent://{tenant}/ns/plain"
    send_through(service, topic, b"to-default")
    assert landed_on(cluster_a, topic) == [b"to-default"] and landed_on(cluster_b, topic) == []
    changed = service.api("PUT", f"/routes/{tenant}", json={"cluster": cluster_b.name, "reason": "test",
                                                             "actor": "pytest"}).json()
    assert changed["before"] is None and changed["route"]["cluster"] == cluster_b.name
    send_through(service, topic, b"to-b")
    send_through(service, f"persistent://{tenant}/ns/parts", b"partitioned-to-b")  # partition metadata too
    assert landed_on(cluster_b, topic) == [b"to-b"] and landed_on(cluster_a, topic) == [b"to-default"]
    history = service.api("GET", f"/routes/{tenant}/history").json()["events"]
    assert [(e["action"], e["from_cluster"], e["to_cluster"], e["actor"]) for e in history] == [
        ("set", None, cluster_b.name, "pytest")]
    # a tenant nobody routed, that exists nowhere: the default cluster's own answer (404) comes back
    r = httpx.get(f"{service.url}/admin/v2/persistent/{unique('nobody')}/ns/t/partitions")
    assert r.status_code == 404


def test_held_lookups_are_parked_then_answered_by_the_flip(
        service: LookupProcess, tenant: str, cluster_a: LocalCluster, cluster_b: LocalCluster) -> None:
    service.api("PUT", f"/routes/{tenant}", json={"cluster": cluster_a.name, "reason": "back"})
    topic = f"persistent://{tenant}/ns/held"
    assert service.api("POST", f"/routes/{tenant}/hold", json={"reason": "cutover", "actor": "pytest"}).json()[
        "changed"] is True
    done: dict[str, float] = {}

    def create() -> None:
        send_through(service, topic, b"after-the-flip")
        done["at"] = time.monotonic()

    thread = threading.Thread(target=create)
    thread.start()
    deadline = time.monotonic() + 60  # the client's lookup reaches the service (a loaded host takes its time)
    while "pulsar_lookup_parked_requests 1" not in httpx.get(f"{service.url}/metrics").text:
        assert time.monotonic() < deadline and "at" not in done, done
        time.sleep(0.2)
    time.sleep(1.0)
    assert "at" not in done  # parked, not refused
    flipped_at = time.monotonic()
    flip = service.api("PUT", f"/routes/{tenant}", json={"cluster": cluster_b.name, "reason": "flip"}).json()
    assert flip["released"] is True
    thread.join(30)
    assert flipped_at <= done["at"] < flipped_at + HOLD_TIMEOUT_S  # answered by the flip, not by the bound
    assert landed_on(cluster_b, topic) == [b"after-the-flip"] and landed_on(cluster_a, topic) == []
    # past the bound a parked request gets a clear 503 (clients would count it as a failed connect)
    service.api("POST", f"/routes/{tenant}/hold", json={"reason": "long"})
    started = time.monotonic()
    r = httpx.get(f"{service.url}/lookup/v2/topic/persistent/{tenant}/ns/held", timeout=30)
    assert r.status_code == 503 and "held" in r.json()["reason"]
    assert HOLD_TIMEOUT_S - 0.5 <= time.monotonic() - started < HOLD_TIMEOUT_S + 5
    service.api("POST", f"/routes/{tenant}/release", json={"reason": "done"})


def test_java_client_through_the_service(service: LookupProcess, tenant: str, cluster_b: LocalCluster) -> None:
    """The distribution's own CLI client (Java, from Maven Central) produces and consumes through it."""
    service.api("PUT", f"/routes/{tenant}", json={"cluster": cluster_b.name, "reason": "java"})
    client = pulsar_home() / "bin" / "pulsar-client"
    topic = f"persistent://{tenant}/ns/java"
    consume = subprocess.Popen([str(client), "--url", service.url, "consume", topic, "-s", "java-sub", "-n", "3",
                                "-p", "Earliest"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    produced = subprocess.run([str(client), "--url", service.url, "produce", topic, "-m", "j1,j2,j3"],
                              capture_output=True, text=True, timeout=120)
    assert produced.returncode == 0, produced.stdout[-2000:] + produced.stderr[-2000:]
    out, _ = consume.communicate(timeout=120)
    assert consume.returncode == 0, out[-2000:]
    assert all(f"content:j{i}" in out for i in (1, 2, 3)), out[-2000:]
    assert landed_on(cluster_b, topic) == [b"j1", b"j2", b"j3"]


def test_restart_keeps_routes_holds_and_history(service: LookupProcess, tenant: str, cluster_b: LocalCluster) -> None:
    service.api("POST", f"/routes/{tenant}/hold", json={"reason": "across a restart"})
    before = service.api("GET", f"/routes/{tenant}/history").json()["events"]
    out = service.stop()
    assert "error" not in out.lower()
    service.start()
    route = service.api("GET", f"/routes/{tenant}").json()
    assert route["cluster"] == cluster_b.name and route["held"] is True
    assert service.api("GET", f"/routes/{tenant}/history").json()["events"] == before
    service.api("POST", f"/routes/{tenant}/release", json={"reason": "done"})


def test_bad_config_is_one_error_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"clusters": {"a": {"http_url": "http://x"}}, "default_cluster": "b"}))
    for config, env, expected in ((bad, {"PM_LOOKUP_ADMIN_TOKEN": "t"}, "default_cluster 'b'"),
                                  (tmp_path / "missing.json", {"PM_LOOKUP_ADMIN_TOKEN": "t"}, "does not exist")):
        run = subprocess.run([sys.executable, "-m", "pulsar_migration.lookup", "--config", str(config)],
                             capture_output=True, text=True, env={**os.environ, **env}, timeout=60)
        assert run.returncode == 2 and run.stderr.strip().splitlines()[-1].startswith("error: ")
        assert expected in run.stderr
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"clusters": {"a": {"http_url": "http://x"}}, "default_cluster": "a"}))
    env = {k: v for k, v in os.environ.items() if k != "PM_LOOKUP_ADMIN_TOKEN"}
    run = subprocess.run([sys.executable, "-m", "pulsar_migration.lookup", "--config", str(good)],
                         capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 2 and "PM_LOOKUP_ADMIN_TOKEN" in run.stderr
