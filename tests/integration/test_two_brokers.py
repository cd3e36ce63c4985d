"""Migrations from and to a cluster of two brokers with token authentication (cluster-g, localdev.pulsar_two_brokers),
as production clusters are: the broker at the spec's admin URL owns some of the tenant's topics and answers every
admin call and HTTP lookup about the others with a redirect (307) to their owner, which wants the token too.
The tools must follow such redirects with the token: the admin client's two paths, the copy engine's schema
reads, the lookup service's forwarding."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pulsar
import pytest
from localdev import pulsar_two_brokers
from localdev.pulsar_local import LocalCluster
from pulsar_migration.admin import AdminError
from pulsar_migration.metadata.step import run as sync_metadata
from pulsar_migration.stepjob import run_step
from pyspark.sql import SparkSession

from tests.conftest import unique
from tests.integration.replication_helpers import replicate, replicate_report
from tests.integration.tenant_builders import write_spec
from tests.integration.test_replicate_topics import partitions
from tests.integration.test_sync_progress import drains_differ, progress_report, sync
from tests.integration.test_tls import (
    ENGINES,
    MESSAGES,
    SUBSCRIPTIONS,
    TOPICS,
    CopiedTenant,
    acked_in,
    assert_same_data,
    build_tenant,
    cleanup,
    copy_per_engine,
    lean_jvm,
    topics_in,
)

TWO_BROKERS_INDEX = 6  # cluster-g: no other module uses it
TOKEN_ENV = "PM_TEST_CLUSTER_G_TOKEN"
BUNDLES = 8


@pytest.fixture(scope="module")
def two_brokers(pulsar_clusters: list[LocalCluster], spark: SparkSession) -> Iterator[LocalCluster]:
    cluster = LocalCluster(TWO_BROKERS_INDEX)
    with lean_jvm():  # both brokers
        pulsar_two_brokers.start(cluster, auth=True)
    # The token for the driver, and for the Python workers of the session already running (spark-submit under
    # the DAG gives both its environment).
    os.environ[TOKEN_ENV] = spark.sparkContext.environment[TOKEN_ENV] = cluster.superuser_token() or ""
    yield cluster
    os.environ.pop(TOKEN_ENV, None)
    spark.sparkContext.environment.pop(TOKEN_ENV, None)
    pulsar_two_brokers.stop(cluster)
    shutil.rmtree(cluster.root, ignore_errors=True)


def spec_with(path: Path, tenant: str, source: LocalCluster, target: LocalCluster, **overrides: object) -> Path:
    """write_spec, with cluster-g's token taken from TOKEN_ENV."""
    doc = json.loads(write_spec(path, tenant, source, target, **overrides).read_text())
    doc["clusters"][LocalCluster(TWO_BROKERS_INDEX).name]["token_env"] = TOKEN_ENV
    path.write_text(json.dumps(doc))
    return path


def redirected(cluster: LocalCluster, topics: list[str]) -> None:
    """The second broker owns some of `topics`, so the first (the spec's admin URL) redirects calls about them."""
    owners = pulsar_two_brokers.owners(cluster, topics)
    assert pulsar_two_brokers.second_admin_url(cluster) in owners, owners


def synced(run_dir: Path) -> None:
    """sync_progress (after the copy) lost and duplicated nothing."""
    counts = progress_report(run_dir)["counts"]
    assert counts["lost"] == 0 == counts["duplicated"], counts


def judge(source: LocalCluster, target: LocalCluster, tenant: str, namespace: str = "ns") -> None:
    """`namespace` is exact on the target: data, entry shapes, every subscription's drain."""
    assert assert_same_data(source, target, tenant, namespace) == MESSAGES + MESSAGES // 3 + 20
    differences, drained = drains_differ(source, target, tenant, SUBSCRIPTIONS, acked_in(namespace))
    assert differences == {} and drained > 0


@pytest.fixture(scope="module")
def copied_from_two_brokers(two_brokers: LocalCluster, cluster_b: LocalCluster, spark: SparkSession,
                            tmp_path_factory: pytest.TempPathFactory) -> Iterator[CopiedTenant]:
    """A tenant on cluster-g (the second broker owning topics of both namespaces before any step reads them)
    migrated to cluster-b: sync_metadata once, each engine's namespace copied by that engine, one sync_progress
    over both (neither sync_metadata nor sync_progress depends on the engine). Each step exits 0."""
    tenant = unique("it-2b-out")
    try:
        build_tenant(two_brokers, tenant, bundles=BUNDLES, namespaces=ENGINES)
        for engine in ENGINES:
            redirected(two_brokers, list(partitions(tenant, topics_in(engine))))
        spec = spec_with(tmp_path_factory.mktemp("2b-out") / "spec.json", tenant, two_brokers, cluster_b)
        run_dir = spec.with_name("run")
        assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(run_dir)]) == 0
        copied = copy_per_engine(tenant, spec, run_dir)
        assert sync(spec, run_dir) == 0, progress_report(run_dir).get("error")
        synced(run_dir)
        yield copied
    finally:
        cleanup(tenant, two_brokers, cluster_b)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_tenant_on_the_second_of_two_brokers_moves_out(copied_from_two_brokers: CopiedTenant,
                                                         two_brokers: LocalCluster, cluster_b: LocalCluster,
                                                         engine: str) -> None:
    """From cluster-g (its second broker owns the tenant's topics: every call about them at the first is redirected,
    the Avro topic's schema reads included) to cluster-b through the copy engine or the Python path, each on its own
    namespace of the tenant: every step exits 0 and the target is exact."""
    copy = copied_from_two_brokers.copies[engine]
    assert copy["verdict"] == "ok" and copy["details"]["copy_engine"] == engine, copy.get("error")
    judge(two_brokers, cluster_b, copied_from_two_brokers.tenant, engine)


def test_a_tenant_moves_onto_two_brokers(two_brokers: LocalCluster, cluster_b: LocalCluster, spark: SparkSession,
                                         tmp_path: Path) -> None:
    """From cluster-b to cluster-g, whose second broker owns the topics sync_metadata created: the target's reads and
    writes (deduplication status, resume point, read-back, cursors) follow the redirects."""
    tenant = unique("it-2b-in")
    try:
        build_tenant(cluster_b, tenant, bundles=BUNDLES)
        spec = spec_with(tmp_path / "spec.json", tenant, cluster_b, two_brokers)
        run_dir = tmp_path / "run"
        assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(run_dir)]) == 0
        redirected(two_brokers, list(partitions(tenant, TOPICS)))
        assert replicate(spec, run_dir) == 0, replicate_report(run_dir).get("error")
        assert sync(spec, run_dir) == 0, progress_report(run_dir).get("error")
        synced(run_dir)
        judge(cluster_b, two_brokers, tenant)
    finally:
        cleanup(tenant, cluster_b, two_brokers)


def test_the_lookup_service_forwards_with_the_token_through_the_brokers_redirects(
        two_brokers: LocalCluster, tmp_path: Path) -> None:
    """The lookup service in front of cluster-g's first broker forwards a client's own token: every partition, owned
    by the second broker, is looked up through the first's redirect (the second wants the token again) and gets its
    messages."""
    from tests.integration.lookup_helpers import LookupProcess, free_port

    tenant = unique("it-2b-lookup")
    config, port = tmp_path / "lookup.json", free_port()
    config.write_text(json.dumps({
        "clusters": {two_brokers.name: {"http_url": two_brokers.admin_url, "token_env": TOKEN_ENV}},
        "default_cluster": two_brokers.name, "database_url": f"sqlite:///{tmp_path / 'routes.db'}", "port": port}))
    service = LookupProcess(config, port)
    service.start()
    try:
        admin = two_brokers.admin(timeout_s=30)
        admin.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": [two_brokers.name]})
        admin.put(f"/namespaces/{tenant}/ns", {"bundles": {"numBundles": BUNDLES}})
        admin.put(f"/persistent/{tenant}/ns/spread/partitions", 8)
        redirected(two_brokers, [f"persistent://{tenant}/ns/spread-partition-{i}" for i in range(8)])
        by_lookup = pulsar.Client(service.url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn),
                                  authentication=pulsar.AuthenticationToken(two_brokers.superuser_token()))
        producer = by_lookup.create_producer(f"persistent://{tenant}/ns/spread", batching_enabled=False)
        for i in range(16):
            producer.send(f"m-{i}".encode(), partition_key=str(i))
        by_lookup.close()
        stats = admin.get(f"/persistent/{tenant}/ns/spread/partitioned-stats")
        assert stats["msgInCounter"] == 16
        admin.close()
    finally:
        print(service.stop()[-2000:])
        cleanup(tenant, two_brokers)


def test_geo_mode_drives_replicators_on_the_second_broker(two_brokers: LocalCluster, cluster_b: LocalCluster,
                                                          spark: SparkSession, tmp_path: Path) -> None:
    """Geo mode from cluster-g: the replicator cursors created at the earliest entry, the unloads and the backlog
    watch all go through the first broker's redirects to the owner; the backlog arrives whole and verified."""
    from tests.integration.replication_helpers import drain
    from tests.integration.test_replicate_geo import teardown

    tenant = unique("it-2b-geo")
    admin_g, admin_b = two_brokers.admin(timeout_s=30), cluster_b.admin(timeout_s=30)
    try:
        build_tenant(two_brokers, tenant, bundles=BUNDLES)
        redirected(two_brokers, list(partitions(tenant, TOPICS)))
        admin_g.post(f"/namespaces/{tenant}/ns/retention", {"retentionTimeInMinutes": 60, "retentionSizeInMB": 64})
        spec = spec_with(tmp_path / "spec.json", tenant, two_brokers, cluster_b, replication={"mode": "geo"},
                         options={"geo_timeout_s": 120})
        run_dir = tmp_path / "run"
        assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(run_dir)]) == 0
        assert replicate(spec, run_dir) == 0, replicate_report(run_dir).get("error")
        report = replicate_report(run_dir)
        assert report["details"]["mode"] == "geo" and report["hashes"]["source"] == report["hashes"]["target"]
        for topic in partitions(tenant, TOPICS):
            assert [m["data"] for m in drain(cluster_b, topic)] == [m["data"] for m in drain(two_brokers, topic)]
    finally:
        # A force delete on ZooKeeper can race its own namespace deletion (HTTP 500 "NotEmpty"): cluster-g is wiped
        # at the module's end anyway, cluster-b's copy goes here.
        with contextlib.suppress(AdminError):
            teardown(tenant, admin_g, admin_b, two_brokers.name)
        cleanup(tenant, cluster_b)
        admin_g.close()
        admin_b.close()
