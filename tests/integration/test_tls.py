"""Migrations to and from a cluster reached over TLS only, with a private certificate authority and client
certificates required (mutual TLS): cluster-f, a throwaway third broker (localdev.pulsar_tls), whose TLS ports
refuse a client that does not trust the authority or shows no certificate. The spec names only its TLS URLs, so
every admin call, lookup and message of the steps (the copy engine's Java client and its schema reads, the Python
path, sync_progress's consumers) goes through TLS; the judges read both sides with plain clients."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pulsar
import pytest
from localdev import pulsar_local
from localdev.pulsar_dist import pulsar_home
from localdev.pulsar_local import LocalCluster
from localdev.pulsar_tls import LocalTls
from pulsar.schema import AvroSchema
from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.metadata.step import run as sync_metadata
from pulsar_migration.stepjob import run_step
from pyspark.sql import SparkSession

from tests.conftest import unique
from tests.integration.replication_helpers import client, drain, replicate, replicate_report
from tests.integration.tenant_builders import drop_tenant, write_spec
from tests.integration.test_replicate_topics import OrderV1, OrderV2, content, partitions, shape
from tests.integration.test_sync_progress import ack_pattern, drains_differ, progress_report, subscribe, sync

TLS_INDEX = 5  # cluster-f: no other module uses it


def topics_in(namespace: str) -> dict[str, int]:
    """The topics build_tenant makes in `namespace`: name -> partitions (0: non-partitioned)."""
    return {f"{namespace}/orders": 2, f"{namespace}/single": 0, f"{namespace}/avro": 0}


def acked_in(namespace: str) -> list[str]:
    """The topics of `namespace` whose SUBSCRIPTIONS build_tenant acked."""
    return [f"{namespace}/orders", f"{namespace}/single"]


TOPICS = topics_in("ns")
SUBSCRIPTIONS = {"half": (pulsar.ConsumerType.Shared, "random"), "cut": (pulsar.ConsumerType.Exclusive, "cumulative"),
                 "none": (pulsar.ConsumerType.Failover, "none")}
# At least 30 batched entries (up to 20 messages each) over the two partitions, so every ack pattern (whole
# entries, batch indexes, none) meets many: these modules judge the transport, not volume (3,000 made every build,
# copy, ack and drain five times the work and proved nothing more).
MESSAGES = 600
ENGINES = ("java", "python")  # the copy paths: the copy engine, the Python path
# Throwaway brokers and one-shot Java tools (bin/pulsar-client, bin/pulsar-admin) with the C1 JIT and the serial
# collector, as the project's Spark drivers and Java judges run: nothing under test depends on the JIT or the
# collector; measured here, a standalone got healthy on 12 CPU s instead of 24 (ZGC, C2), a pulsar-admin call took
# 6 CPU s instead of 13.
LEAN_JVM = {"PULSAR_GC": "-XX:+UseSerialGC", "PULSAR_EXTRA_OPTS": "-XX:TieredStopAtLevel=1"}


@contextlib.contextmanager
def lean_jvm() -> Iterator[None]:
    """LEAN_JVM in this process's environment (the broker start scripts read it) until the block ends."""
    with pytest.MonkeyPatch.context() as env:
        for name, value in LEAN_JVM.items():
            env.setenv(name, value)
        yield


@pytest.fixture(scope="module")
def tls() -> LocalTls:
    return LocalTls.default().ensure()


@pytest.fixture(scope="module")
def tls_cluster(pulsar_clusters: list[LocalCluster], tls: LocalTls) -> Iterator[LocalCluster]:
    cluster = pulsar_local.LocalCluster(TLS_INDEX)
    pulsar_local.stop_clusters([cluster])
    shutil.rmtree(cluster.root, ignore_errors=True)
    with lean_jvm():
        pulsar_local.start_with_overrides(cluster, tls.broker_overrides(TLS_INDEX))
    yield cluster
    pulsar_local.stop_clusters([cluster])
    shutil.rmtree(cluster.root, ignore_errors=True)


def tls_spec(path: Path, tenant: str, source: LocalCluster, target: LocalCluster, tls: LocalTls,
             **overrides: Any) -> Path:
    """A spec that reaches cluster-f (source or target) only at its TLS URLs, with the client certificate."""
    doc = json.loads(write_spec(path, tenant, source, target, **overrides).read_text())
    doc["clusters"][pulsar_local.LocalCluster(TLS_INDEX).name] = tls.spec_entry(TLS_INDEX)
    path.write_text(json.dumps(doc))
    return path


def build_tenant(cluster: LocalCluster, tenant: str, bundles: int | None = None,
                 namespaces: tuple[str, ...] = ("ns",)) -> None:
    """topics_in each of `namespaces` on `cluster` (plain URLs: set-up, not the tools): batched keyed messages,
    unbatched ones, an Avro topic under two schema versions; SUBSCRIPTIONS acked in their patterns. `bundles`: each
    namespace's bundle count."""
    admin = cluster.admin(timeout_s=30)
    admin.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": [cluster.name]})
    for ns in namespaces:
        admin.put(f"/namespaces/{tenant}/{ns}", {"bundles": {"numBundles": bundles}} if bundles else None)
        admin.put(f"/namespaces/{tenant}/{ns}/schemaCompatibilityStrategy", "ALWAYS_COMPATIBLE")
        for name, count in topics_in(ns).items():
            admin.put(f"/persistent/{tenant}/{name}" + ("/partitions" if count else ""), count or None)
    admin.close()
    c = client(cluster)
    rng = random.Random(5)
    for ns in namespaces:
        consumers = {(t, s): subscribe(c, f"persistent://{tenant}/{t}", s, kind)
                     for t in acked_in(ns) for s, (kind, _) in SUBSCRIPTIONS.items()}
        batched = c.create_producer(f"persistent://{tenant}/{ns}/orders", batching_enabled=True,
                                    batching_max_messages=20, batching_max_publish_delay_ms=10,
                                    block_if_queue_full=True)
        for i in range(MESSAGES):
            batched.send_async(f"o-{i}".encode(), None, partition_key=f"k{i % 17}", properties={"i": str(i)})
        batched.flush()
        single = c.create_producer(f"persistent://{tenant}/{ns}/single", batching_enabled=False,
                                   block_if_queue_full=True)
        for i in range(MESSAGES // 3):
            single.send_async(f"s-{i}".encode(), None)
        single.flush()
        v1 = c.create_producer(f"persistent://{tenant}/{ns}/avro", schema=AvroSchema(OrderV1))
        for i in range(10):
            v1.send(OrderV1(id=i))
        v2 = c.create_producer(f"persistent://{tenant}/{ns}/avro", schema=AvroSchema(OrderV2))
        for i in range(10):
            v2.send(OrderV2(id=100 + i, note=f"n{i}"))
        for (_, name), consumer in consumers.items():
            ack_pattern(consumer, SUBSCRIPTIONS[name][1], rng)
            consumer.close()
    c.close()


def assert_same_data(source: LocalCluster, target: LocalCluster, tenant: str, namespace: str = "ns") -> int:
    """Every partition of `namespace` holds the same messages in the same entry shapes on both sides; how many
    messages."""
    total = 0
    for topic in partitions(tenant, topics_in(namespace)):
        copied, original = drain(target, topic), drain(source, topic)
        assert content(copied) == content(original), topic
        assert shape(copied) == shape(original), topic
        total += len(original)
    return total


def cleanup(tenant: str, *clusters: LocalCluster) -> None:
    for cluster in clusters:
        admin = cluster.admin(timeout_s=30)
        with contextlib.suppress(Exception):
            drop_tenant(tenant, admin)
        admin.close()


def java_reads_over_tls(tls: LocalTls, topic: str, count: int) -> str:
    """The distribution's `bin/pulsar-client` (the Java client) reading `count` messages of `topic` from cluster-f
    over TLS with the client certificate: its output."""
    done = subprocess.run([str(pulsar_home() / "bin" / "pulsar-client"), "consume", topic, "-s", unique("judge"),
                           "-p", "Earliest", "-n", str(count)],
                          env={**os.environ, "PULSAR_MEM": "-Xms64m -Xmx256m", **LEAN_JVM,
                               "PULSAR_CLIENT_CONF": str(tls.client_conf(TLS_INDEX))},
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_a_tenant_moves_to_a_cluster_reached_only_over_mutual_tls(
        tls_cluster: LocalCluster, cluster_a: LocalCluster, tls: LocalTls, spark: SparkSession,
        tmp_path: Path) -> None:
    """cluster-a (plain) to cluster-f over TLS: sync_metadata, replicate_topics through the copy engine and
    sync_progress all exit 0; every partition is the same in content and entry shape, every subscription drains
    the same. A spec without the client certificate, or without the authority, fails the first step with one
    line naming cluster-f, and nothing reaches it."""
    tenant = unique("it-tls-to")
    try:
        build_tenant(cluster_a, tenant)
        spec = tls_spec(tmp_path / "spec.json", tenant, cluster_a, tls_cluster, tls)
        for broken, change, named in (("no-cert", {"cert_file": None, "key_file": None}, "tls.cert_file"),
                                      ("no-ca", {"trust_certs_file": None}, "tls.trust_certs_file")):
            doc = json.loads(spec.read_text())
            doc["clusters"][tls_cluster.name]["tls"].update(change)
            bad = tmp_path / f"{broken}.json"
            bad.write_text(json.dumps(doc))
            code = run_step("sync_metadata", sync_metadata, ["--spec", str(bad), "--run-dir",
                                                            str(tmp_path / f"run-{broken}")])
            error = json.loads((tmp_path / f"run-{broken}" / "sync_metadata.json").read_text())["error"] \
                if (tmp_path / f"run-{broken}" / "sync_metadata.json").exists() else ""
            print(f"{broken}: exit {code}: {error}")
            assert code != 0 and "\n" not in error and f"clusters.{tls_cluster.name}.{named}" in error, (code, error)
            assert tenant not in PulsarAdmin(tls_cluster.admin_url, name=tls_cluster.name).get("/tenants")

        run_dir = tmp_path / "run"
        assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(run_dir)]) == 0
        assert replicate(spec, run_dir) == 0
        report = replicate_report(run_dir)
        assert report["verdict"] == "ok", report.get("error")
        assert sync(spec, run_dir) == 0
        counts = progress_report(run_dir)["counts"]
        assert counts["lost"] == 0 == counts["duplicated"], counts

        assert assert_same_data(cluster_a, tls_cluster, tenant) == MESSAGES + MESSAGES // 3 + 20
        differences, drained = drains_differ(cluster_a, tls_cluster, tenant, SUBSCRIPTIONS, acked_in("ns"))
        assert differences == {} and drained > 0
        out = java_reads_over_tls(tls, f"persistent://{tenant}/ns/single", 5)
        assert "s-0" in out and "s-4" in out, out[-2000:]
    finally:
        cleanup(tenant, cluster_a, tls_cluster)


@dataclass
class CopiedTenant:
    """A tenant with one namespace per engine, migrated into one run dir: each namespace copied by its engine."""

    tenant: str
    run_dir: Path
    specs: dict[str, Path]  # engine -> its spec: the namespace narrowed to that engine's, the engine chosen
    copies: dict[str, dict[str, Any]]  # engine -> its replicate_topics report


def copy_per_engine(tenant: str, spec: Path, run_dir: Path) -> CopiedTenant:
    """replicate_topics once per engine on its own namespace, into `run_dir` (the position map takes both), each
    exiting 0; `spec`: the tenant's whole spec, its clusters as the copies need them."""
    copied = CopiedTenant(tenant, run_dir, {}, {})
    for engine in ENGINES:
        doc = json.loads(spec.read_text())
        doc.update(namespaces=[engine], options={**doc.get("options", {}), "copy_engine": engine})
        copied.specs[engine] = spec.with_name(f"spec-{engine}.json")
        copied.specs[engine].write_text(json.dumps(doc))
        assert replicate(copied.specs[engine], run_dir) == 0, replicate_report(run_dir).get("error")
        copied.copies[engine] = replicate_report(run_dir)
    return copied


@pytest.fixture(scope="module")
def copied_from_tls(tls_cluster: LocalCluster, cluster_b: LocalCluster, tls: LocalTls, spark: SparkSession,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[CopiedTenant]:
    """A tenant on cluster-f migrated over TLS to cluster-b: sync_metadata once, each engine's namespace copied
    by that engine, one sync_progress over both (neither sync_metadata nor sync_progress depends on the engine;
    sync_progress translates through either engine's rows of the position map). Each step exits 0."""
    tenant = unique("it-tls-from")
    try:
        build_tenant(tls_cluster, tenant, namespaces=ENGINES)
        spec = tls_spec(tmp_path_factory.mktemp("tls-from") / "spec.json", tenant, tls_cluster, cluster_b, tls)
        run_dir = spec.with_name("run")
        assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(run_dir)]) == 0
        copied = copy_per_engine(tenant, spec, run_dir)
        assert sync(spec, run_dir) == 0, progress_report(run_dir).get("error")
        yield copied
    finally:
        cleanup(tenant, tls_cluster, cluster_b)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_tenant_moves_from_a_cluster_reached_only_over_mutual_tls(
        copied_from_tls: CopiedTenant, tls_cluster: LocalCluster, cluster_b: LocalCluster, engine: str) -> None:
    """cluster-f over TLS to cluster-b (plain), through the copy engine (its Java client and the HTTPS schema
    reads of the Avro topic's two versions) or the Python path, each on its own namespace of the tenant: the steps
    exit 0, the data and every subscription's drain are the same; messages produced afterwards are copied by the
    next run."""
    tenant, run_dir, spec = copied_from_tls.tenant, copied_from_tls.run_dir, copied_from_tls.specs[engine]
    copy = copied_from_tls.copies[engine]
    assert copy["verdict"] == "ok" and copy["details"]["copy_engine"] == engine, copy.get("error")
    assert assert_same_data(tls_cluster, cluster_b, tenant, engine) == MESSAGES + MESSAGES // 3 + 20
    differences, drained = drains_differ(tls_cluster, cluster_b, tenant, SUBSCRIPTIONS, acked_in(engine))
    assert differences == {} and drained > 0

    c = client(tls_cluster)
    v2 = c.create_producer(f"persistent://{tenant}/{engine}/avro", schema=AvroSchema(OrderV2))
    for i in range(5):
        v2.send(OrderV2(id=200 + i, note="later"))
    c.close()
    assert replicate(spec, run_dir) == 0
    report = replicate_report(run_dir)
    assert report["verdict"] == "ok" and report["counts"]["copied_messages"] == 5, report["counts"]
    assert assert_same_data(tls_cluster, cluster_b, tenant, engine) == MESSAGES + MESSAGES // 3 + 25


def test_geo_replication_reaches_a_cluster_that_requires_client_certificates(
        tls_cluster: LocalCluster, cluster_a: LocalCluster, tls: LocalTls, spark: SparkSession,
        tmp_path: Path) -> None:
    """Geo mode from cluster-a to cluster-f: sync_metadata registers cluster-f in cluster-a at its TLS URLs with the
    authority and the client certificate, so cluster-a's replicators get through the mutual TLS; the backlog
    arrives whole and verified."""
    from tests.integration.test_replicate_geo import teardown

    admin_a = PulsarAdmin(cluster_a.admin_url, name=cluster_a.name)
    admin_f = PulsarAdmin(tls_cluster.admin_url, name=tls_cluster.name)
    tenant = unique("it-tls-geo")
    try:
        build_tenant(cluster_a, tenant)
        admin_a.post(f"/namespaces/{tenant}/ns/retention", {"retentionTimeInMinutes": 60, "retentionSizeInMB": 64})
        spec = tls_spec(tmp_path / "spec.json", tenant, cluster_a, tls_cluster, tls, replication={"mode": "geo"},
                        options={"geo_timeout_s": 120})
        # The fixture registered cluster-f in cluster-a at its plain URLs, and sync_metadata never overwrites a
        # registration (other tenants may replicate through it): this test's own cluster-f goes first.
        admin_a.delete(f"/clusters/{tls_cluster.name}")
        run_dir = tmp_path / "run"
        assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(run_dir)]) == 0
        registered = admin_a.get(f"/clusters/{tls_cluster.name}")
        assert registered["brokerServiceUrlTls"].startswith("pulsar+ssl://") and registered["brokerClientTlsEnabled"]
        assert registered["brokerClientCertificateFilePath"] == str(tls.client_cert)
        assert replicate(spec, run_dir) == 0
        report = replicate_report(run_dir)
        assert report["verdict"] == "ok" and report["details"]["mode"] == "geo"
        assert report["hashes"]["source"] == report["hashes"]["target"]
        for topic in partitions(tenant, TOPICS):
            assert [m["data"] for m in drain(tls_cluster, topic)] == [m["data"] for m in drain(cluster_a, topic)]
    finally:
        teardown(tenant, admin_a, admin_f, cluster_a.name)
        admin_a.close()
        admin_f.close()


def test_the_lookup_service_routes_tls_clients_to_a_mutual_tls_cluster(
        tls_cluster: LocalCluster, cluster_a: LocalCluster, tls: LocalTls, tmp_path: Path) -> None:
    """The lookup service answering over HTTPS and forwarding to cluster-f's HTTPS port with the authority and
    the client certificate: the Python client and the Java client (`bin/pulsar-client`), their service URL the
    service's https:// one, reach cluster-f's TLS broker port through it; the spec's lookup client (the switch's)
    trusts the service by `lookup.trust_certs_file`, and without it fails in one line naming that field."""
    from pulsar_migration.lookup.client import LookupServiceError
    from pulsar_migration.spec import MigrationSpec

    from tests.integration.lookup_helpers import TOKEN, LookupProcess, free_port

    config, port = tmp_path / "lookup.json", free_port()
    f_entry = tls.spec_entry(TLS_INDEX)
    config.write_text(json.dumps({
        "clusters": {cluster_a.name: {"http_url": cluster_a.admin_url},
                     tls_cluster.name: {"http_url": f_entry["admin_url"], "tls": f_entry["tls"]}},
        "default_cluster": cluster_a.name, "database_url": f"sqlite:///{tmp_path / 'routes.db'}", "port": port,
        "tls": {"cert_file": str(tls.broker_cert), "key_file": str(tls.broker_key)}}))
    service = LookupProcess(config, port, ca_cert=tls.ca_cert)
    service.start()
    tenant = unique("it-tls-lookup")
    admin_f = PulsarAdmin(tls_cluster.admin_url, name=tls_cluster.name)
    try:
        admin_f.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": [tls_cluster.name]})
        admin_f.put(f"/namespaces/{tenant}/ns")
        topic = f"persistent://{tenant}/ns/through-lookup"
        spec_doc = json.loads(tls_spec(tmp_path / "spec.json", tenant, cluster_a, tls_cluster, tls).read_text())
        spec_doc["lookup"] = {"url": service.url, "token_env": "PM_TEST_LOOKUP_TOKEN"}
        os.environ["PM_TEST_LOOKUP_TOKEN"] = TOKEN
        untrusting = MigrationSpec.from_dict(spec_doc).lookup_admin()
        with pytest.raises(LookupServiceError) as refused:
            untrusting.route(tenant)
        assert "lookup.trust_certs_file" in str(refused.value) and "\n" not in str(refused.value)
        spec_doc["lookup"]["trust_certs_file"] = str(tls.ca_cert)
        lookup = MigrationSpec.from_dict(spec_doc).lookup_admin()
        lookup.set_route(tenant, tls_cluster.name, reason="tls test")
        assert lookup.route(tenant)["cluster"] == tls_cluster.name

        python_client = MigrationSpec.from_dict(spec_doc).clusters[tls_cluster.name].pulsar_client(service.url)
        producer = python_client.create_producer(topic, batching_enabled=False)
        for i in range(5):
            producer.send(f"tls-{i}".encode())
        python_client.close()
        java = subprocess.run([str(pulsar_home() / "bin" / "pulsar-client"), "--url", service.url, "consume", topic,
                               "-s", "judge", "-p", "Earliest", "-n", "5"],
                              env={**os.environ, "PULSAR_MEM": "-Xms64m -Xmx256m", **LEAN_JVM,
                                   "PULSAR_CLIENT_CONF": str(tls.client_conf(TLS_INDEX))},
                              capture_output=True, text=True, timeout=120, check=False)
        assert java.returncode == 0 and "tls-4" in java.stdout, (java.stdout + java.stderr)[-2000:]
        assert [m["data"] for m in drain(tls_cluster, topic)] == [f"tls-{i}".encode() for i in range(5)]
        metrics = httpx.get(f"{service.url}/metrics", verify=service.verify, timeout=10).text
        assert f'cluster="{tls_cluster.name}"' in metrics
    finally:
        os.environ.pop("PM_TEST_LOOKUP_TOKEN", None)
        print(service.stop()[-2000:])
        cleanup(tenant, tls_cluster)
        admin_f.close()
