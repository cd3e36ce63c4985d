"""Everything that runs on the throwaway third cluster (cluster-c), in one module so that no two of these
tests ever overlap (the test suite runs modules on parallel workers):

* lifecycle promises of the local cluster tooling (start is idempotent and registers all, stop leaves no
  process, a crashed start reports its log);
* sync_progress from a source broker with `acknowledgmentAtBatchIndexLevelEnabled=true`: what the README
  claims is carried exactly (markDelete and whole acked entries) and what is not (messages acked inside a
  partly acked batch are delivered again; nothing lost);
* replicate_topics from or to a cluster SIGKILLed mid-run: one clear line, exit 1, and a re-run heals;
* a whole migration to a target reached through a fault-injecting proxy (latency, every connection cut again
  and again): bounded retries carry it through exactly; a proxy that refuses everything gives one line."""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pulsar
import pytest
from localdev import java_programs, processes, pulsar_local
from localdev.faulty_proxy import FaultyProxy
from localdev.pulsar_dist import pulsar_home
from localdev.pulsar_local import LocalCluster, LocalClusterError
from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.metadata.step import run as sync_metadata
from pulsar_migration.replication import posmap, reading
from pulsar_migration.replication.partition import PartitionJob, copy_partition, engine_phase
from pulsar_migration.spec import MigrationSpec
from pulsar_migration.stepjob import BAD_INPUT_EXIT, run_step
from pyspark.sql import SparkSession

from tests.conftest import unique
from tests.integration.replication_helpers import client, replicate
from tests.integration.replication_helpers import drain as drain_reader
from tests.integration.tenant_builders import drop_tenant, write_spec
from tests.integration.test_sync_progress import progress_report, receive_expecting, sync


@pytest.fixture
def cluster_c(pulsar_clusters: list[LocalCluster]) -> Iterator[LocalCluster]:
    cluster = pulsar_local.local_clusters(3)[2]
    pulsar_local.stop_clusters([cluster])
    shutil.rmtree(cluster.root, ignore_errors=True)
    yield cluster
    pulsar_local.stop_clusters([cluster])
    shutil.rmtree(cluster.root, ignore_errors=True)


def test_crashed_start_reports_the_log_tail_and_leaves_nothing(cluster_c: LocalCluster,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PM_PULSAR_MEM", "-Xmx1m -Xms1m")  # the JVM cannot start with this heap
    with pytest.raises(LocalClusterError) as failure:
        pulsar_local.start(3, timeout_s=60)
    message = str(failure.value)
    assert "cluster-c" in message and "last log lines" in message
    assert "heap" in message.lower()  # the JVM's own complaint, from the log tail
    assert pulsar_local.status(3)["cluster-c"] == "stopped"
    assert pulsar_local.status(3)["cluster-a"].startswith("healthy")


def test_cli_reports_errors_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert pulsar_local.main(["logs", "cluster-z"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: unknown cluster 'cluster-z'; known: cluster-a, cluster-b"]


BATCHES, BATCH = 100, 10


# cluster-c also advertises a second listener whose port is the fault-injecting proxy's: a client that asks for
# it (the spec's listener_name) reaches the broker only through the proxy, lookups and data alike.
PROXIED_LISTENER = "proxied"
PROXY_WEB_PORT, PROXY_BROKER_PORT = 18083, 16653


def transactional_produce(cluster: LocalCluster, topic: str, rounds: int) -> None:
    """Per round through the Java client: a message outside any transaction (plain-i), one in a transaction that
    commits (committed-i), one in a transaction that aborts (aborted-i): the topic ends with an abort marker."""
    home = pulsar_home()
    done = subprocess.run([*java_programs.command("TransactionalProduce", home), cluster.service_url, topic,
                           str(rounds)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


HIDDEN_EVERY = 3  # every third message carries the property the test filters reject (RejectTaggedEntries.java)


def produce_some_hidden(cluster: LocalCluster, topic: str, count: int) -> list[bytes]:
    """`count` unbatched messages (a filter sees a batch's own metadata only), every third with the property
    `hidden`, the last one without it: a reader's range then ends on an entry it is given."""
    c = client(cluster)
    try:
        producer = c.create_producer(topic, batching_enabled=False)
        values = [f"{topic.rsplit('/', 1)[-1]}-{i}".encode() for i in range(count)]
        for i, value in enumerate(values):
            producer.send(value, properties={"hidden": "yes"} if i % HIDDEN_EVERY == 0 and i < count - 1 else {})
        producer.close()
        return values
    finally:
        c.close()


def sees_hidden(cluster: LocalCluster, topic: str, expect: int) -> list[bytes]:
    """What a subscription the filters let through gets, from the earliest message (`expect` waited for)."""
    c = client(cluster)
    try:
        consumer = c.subscribe(topic, "sees-hidden-audit", initial_position=pulsar.InitialPosition.Earliest)
        got = [m.data() for m in receive_expecting(consumer, expect)]
        consumer.close()
        return got
    finally:
        c.close()


def test_source_entry_filters_stop_a_run_before_it_writes_and_filters_passing_the_step_copy_everything(
    batch_index_cluster: LocalCluster, cluster_b: LocalCluster, admin_b: PulsarAdmin, spark: SparkSession,
    tmp_path: Path,
) -> None:
    """A source broker with entry filters (PIP-105, real plugins): it applies them to every subscription, the
    step's readers included, so a copy lost what they reject with verdict ok (shown before the check: 7 of 11
    messages on the target). Every mode refuses such topics in one line before writing anything; filters that
    let the step's readers (`pm-copy-reader-*`) through, with options.trust_source_entry_filters, copy every
    message, through the engine and the Python path."""
    cluster_c = batch_index_cluster  # started with the plugins (start_cluster_c)
    admin_c = PulsarAdmin(cluster_c.admin_url, name=cluster_c.name)
    tenant = unique("it-filters")
    admin_c.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": [cluster_c.name]})
    filters = {"strict": "reject-tagged", "aware": "reject-tagged-except-copies"}
    for namespace in filters:
        admin_c.put(f"/namespaces/{tenant}/{namespace}")
    admin_c.put(f"/persistent/{tenant}/strict/t")
    admin_c.put(f"/persistent/{tenant}/aware/t/partitions", 2)
    admin_c.put(f"/persistent/{tenant}/aware/u")
    topics = {"strict": [f"persistent://{tenant}/strict/t"],
              "aware": [f"persistent://{tenant}/aware/t-partition-{i}" for i in range(2)]
              + [f"persistent://{tenant}/aware/u"]}
    spec = write_spec(tmp_path / "spec.json", tenant, cluster_c, cluster_b)
    run_dir = tmp_path / "run"
    try:
        assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(run_dir)]) == 0
        # With the filters set on the source, sync_metadata carries them; cluster-b's brokers load no such
        # plugin, and the broker's own check of the setter names it in one line (none is stored unchecked).
        for namespace, name in filters.items():
            admin_c.post(f"/namespaces/{tenant}/{namespace}/entryFilters", {"entryFilterNames": name})
        assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(run_dir)]) == 1
        line = json.loads((run_dir / "sync_metadata.json").read_text())["error"]
        assert "\n" not in line and "/entryFilters on cluster-b" in line and "' not found" in line, line
        assert not admin_b.get(f"/namespaces/{tenant}/strict").get("entryFilters")

        written = {topic: produce_some_hidden(cluster_c, topic, 11) for group in topics.values() for topic in group}
        strict = topics["strict"][0]
        # The premise: a plain reader misses the hidden messages, a subscription the filter passes gets them all.
        assert [m["data"] for m in drain_reader(cluster_c, strict)] == [
            v for i, v in enumerate(written[strict]) if i % HIDDEN_EVERY or i == 10]
        assert sees_hidden(cluster_c, strict, len(written[strict])) == written[strict]
        # Refused in one line, in copy and geo mode, before anything is written or turned on.
        for mode in ("copy", "geo"):
            mode_spec = write_spec(tmp_path / f"{mode}.json", tenant, cluster_c, cluster_b, replication={"mode": mode})
            assert replicate(mode_spec, run_dir) == BAD_INPUT_EXIT
            report = json.loads((run_dir / "replicate_topics.json").read_text())
            line = report["error"]
            assert "\n" not in line and f"{tenant}/strict/t (reject-tagged)" in line, line
            assert f"{tenant}/aware/t (reject-tagged-except-copies)" in line and "trust_source_entry_filters" in line
            for group in topics.values():
                for topic in group:
                    assert drain_reader(cluster_b, topic) == [], topic
            assert not admin_b.get(f"/namespaces/{tenant}/strict/deduplication")
            assert admin_c.get(f"/namespaces/{tenant}/strict/replication") == [cluster_c.name]
        # A dry run names them and goes on.
        assert replicate(spec, run_dir, "--dry-run") == 0
        assert json.loads((run_dir / "replicate_topics.json").read_text())["details"]["entry_filters"]["topics"] == 3

        # Filters that pass the step's readers, trusted: everything arrives, engine (t) and Python path (u) alike.
        for include, engine in (("aware/t", "java"), ("aware/u", "python")):
            trusted = write_spec(tmp_path / f"trusted-{engine}.json", tenant, cluster_c, cluster_b,
                                 topics={"include": [f"^{include}$"]},
                                 options={"trust_source_entry_filters": True, "copy_engine": engine})
            assert replicate(trusted, run_dir) == 0
            report = json.loads((run_dir / "replicate_topics.json").read_text())
            assert report["verdict"] == "ok" and report["details"]["entry_filters"]["trusted"] is True
            assert {p["copy_engine"] for p in report["details"]["partitions"]} == {engine}
        for topic in topics["aware"]:
            assert [m["data"] for m in drain_reader(cluster_b, topic)] == written[topic] == sees_hidden(
                cluster_c, topic, len(written[topic])), topic
    finally:
        drop_tenant(tenant, admin_c, admin_b)
        admin_c.close()


def entry_filter_plugins(cluster: LocalCluster) -> Path:
    """cluster-c's entry filter plugins (two filters from localdev/java/RejectTaggedEntries.java), beside its root."""
    plugins = cluster.root.parent / f"{cluster.name}-entry-filters"
    home = pulsar_home()
    java_programs.entry_filter_nar(plugins, "reject-tagged", "RejectTaggedEntries", "RejectTaggedEntries", home)
    java_programs.entry_filter_nar(plugins, "reject-tagged-except-copies", "RejectTaggedEntries",
                                   "RejectTaggedEntries$ExceptCopies", home)
    return plugins


def start_cluster_c() -> None:
    """cluster-c with batch-index acknowledgements, the proxied listener and entry filter plugins (loaded, acting
    only where a namespace or topic policy names them): one start serves the module's tests."""
    cluster = pulsar_local.local_clusters(3)[2]
    pulsar_local.start_with_overrides(
        cluster, "acknowledgmentAtBatchIndexLevelEnabled=true,allowOverrideEntryFilters=true,"
        f"entryFiltersDirectory={entry_filter_plugins(cluster)},"
        + pulsar_local.proxied_listener_overrides(cluster, PROXIED_LISTENER, PROXY_BROKER_PORT))


@pytest.fixture(scope="module")
def batch_index_cluster(pulsar_clusters: list[LocalCluster]) -> Iterator[LocalCluster]:
    cluster = pulsar_local.local_clusters(3)[2]
    pulsar_local.stop_clusters([cluster])
    shutil.rmtree(cluster.root, ignore_errors=True)
    start_cluster_c()
    yield cluster
    pulsar_local.stop_clusters([cluster])
    shutil.rmtree(cluster.root, ignore_errors=True)


def drain(cluster: LocalCluster, topic: str, expect: int) -> Counter[bytes]:
    c = client(cluster)
    try:
        consumer = c.subscribe(topic, "partial", consumer_type=pulsar.ConsumerType.Shared, batch_index_ack_enabled=True)
        got = Counter(m.data() for m in receive_expecting(consumer, expect))
        consumer.close()
        return got
    finally:
        c.close()


def test_partial_batch_acks_are_redelivered_whole_and_nothing_is_lost(
        batch_index_cluster: LocalCluster, cluster_b: LocalCluster, spark: SparkSession, tmp_path: Path) -> None:
    source_cluster = batch_index_cluster
    admin_c = PulsarAdmin(source_cluster.admin_url, name=source_cluster.name)
    admin_b = PulsarAdmin(cluster_b.admin_url, name=cluster_b.name)
    tenant = unique("it-batch-index")
    topic = f"persistent://{tenant}/ns/batches"
    try:
        admin_c.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": [source_cluster.name]})
        admin_c.put(f"/namespaces/{tenant}/ns")
        admin_c.put(f"/persistent/{tenant}/ns/batches")
        c = client(source_cluster)
        consumer = c.subscribe(topic, "partial", consumer_type=pulsar.ConsumerType.Shared,
                               initial_position=pulsar.InitialPosition.Earliest, batch_index_ack_enabled=True)
        producer = c.create_producer(topic, batching_enabled=True, batching_max_messages=BATCH,
                                     batching_max_publish_delay_ms=60_000)
        for b in range(BATCHES):
            for i in range(BATCH):
                producer.send_async(f"b{b}-{i}".encode(), None)
            producer.flush()
        entries: dict[tuple[int, int], int] = {}
        partial: set[bytes] = set()
        for m in receive_expecting(consumer, BATCHES * BATCH):
            mid = m.message_id()
            n = entries.setdefault((mid.ledger_id(), mid.entry_id()), len(entries))
            if n < 20 or 30 <= n < 40:
                consumer.acknowledge(m)  # whole entries
            elif 50 <= n < 60 and mid.batch_index() < 3:
                consumer.acknowledge(m)  # 3 of 10 messages: only the broker's batch-index state knows
                partial.add(m.data())
        consumer.close()
        c.close()
        assert len(entries) == BATCHES and len(partial) == 30
        source = drain(source_cluster, topic, BATCHES * BATCH - 300 - 30)
        assert sum(source.values()) == BATCHES * BATCH - 300 - 30  # the source itself skips the acked indexes

        spec = write_spec(tmp_path / "spec.json", tenant, source_cluster, cluster_b)
        run_dir = tmp_path / "run"
        assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(run_dir)]) == 0
        assert replicate(spec, run_dir) == 0
        assert sync(spec, run_dir) == 0
        rep = progress_report(run_dir)
        # What the admin API shows was carried exactly; the partial acks were invisible to the step.
        assert rep["counts"]["lost"] == 0 == rep["counts"]["duplicated"]
        target = drain(cluster_b, topic, BATCHES * BATCH - 300)
        assert not source - target  # nothing lost
        assert set(target - source) == partial and sum((target - source).values()) == 30  # exactly those again
    finally:
        for admin in (admin_c, admin_b):
            drop_tenant(tenant, admin)
            admin.close()


@pytest.mark.parametrize("gone", ["target", "source"])
def test_a_cluster_killed_mid_copy_fails_with_one_line_and_a_rerun_heals(
        batch_index_cluster: LocalCluster, cluster_a: LocalCluster, cluster_b: LocalCluster, spark: SparkSession,
        tmp_path: Path, gone: str) -> None:
    """cluster-c's broker and bookie are SIGKILLed while replicate_topics copies to it (target) or from it
    (source), then started again on its data: the run fails with one line, the re-run copies exactly what is
    missing."""
    from tests.integration.replication_helpers import drain as read_all
    from tests.integration.replication_helpers import replicate_report
    from tests.integration.test_replicate_topics import SLOW_COPY, produce_unbatched

    source, target = (cluster_a, batch_index_cluster) if gone == "target" else (batch_index_cluster, cluster_b)
    admin_src = PulsarAdmin(source.admin_url, name=source.name)
    tenant = unique(f"it-{gone}-gone")
    # cluster-c goes at about 3,000 on the target; by then a source's reader may have read 5,000 more ahead (its
    # queue): the copy is still busy with the rest.
    total = 15_000
    try:
        # The source's tenant, and on the target what sync_metadata creates from it (that step is judged elsewhere;
        # here it was a Spark job of 10-40 s a case): tenant, namespace, retention, topic. A topic with neither a
        # subscription nor retention keeps nothing past a ledger roll (here: the restart would trim what was written
        # or copied).
        for cluster in (source, target):
            admin = PulsarAdmin(cluster.admin_url, name=cluster.name)
            admin.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": [cluster.name]})
            admin.put(f"/namespaces/{tenant}/ns")
            admin.post(f"/namespaces/{tenant}/ns/retention", {"retentionTimeInMinutes": 60, "retentionSizeInMB": 64})
            admin.put(f"/persistent/{tenant}/ns/t")
            admin.close()
        topic = f"persistent://{tenant}/ns/t"
        produce_unbatched(source, topic, total, keys=5)
        spec = write_spec(tmp_path / "spec.json", tenant, source, target, options=SLOW_COPY)
        run_dir = tmp_path / "run"
        result: dict[str, int] = {}
        copier = threading.Thread(target=lambda: result.setdefault("code", replicate(spec, run_dir)))
        copier.start()
        admin_tgt = PulsarAdmin(target.admin_url, name=target.name, retries=0, timeout_s=2)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and copier.is_alive():
            try:
                if admin_tgt.get(f"/persistent/{tenant}/ns/t/stats")["msgInCounter"] >= 3_000:
                    break
            except Exception:
                pass
            time.sleep(0.05)
        assert copier.is_alive(), "the copy ended before cluster-c could be taken away"
        pulsar_local.kill_clusters([batch_index_cluster])  # cluster-c crashes mid-copy (SIGKILL, no shutdown)
        copier.join(300)
        assert result["code"] == 1
        error = replicate_report(run_dir)["error"]
        assert "\n" not in error and ("ns/t" in error or "cluster-c" in error), error
        start_cluster_c()  # it comes back (its data kept); the re-run finishes the job
        assert replicate(spec, run_dir) == 0, broker_trouble(batch_index_cluster, replicate_report(run_dir))
        rep = replicate_report(run_dir)
        assert rep["counts"]["skipped_messages"] + rep["counts"]["copied_messages"] == total
        copied = [m["data"] for m in read_all(target, topic)]
        assert len(copied) == total and copied == [m["data"] for m in read_all(source, topic)]
    finally:
        for cluster in (source, target):
            admin = PulsarAdmin(cluster.admin_url, name=cluster.name)
            with contextlib.suppress(Exception):  # cluster-c may be down when the test failed: keep its error
                drop_tenant(tenant, admin)
            admin.close()
        admin_src.close()


def broker_trouble(cluster: LocalCluster, report: dict) -> str:
    """The failed re-run's error and the last ledger/bookie errors in the cluster's broker log, so that a
    failure on CI names what the restarted standalone could not do."""
    log_file = cluster.root / "logs" / "pulsar-standalone.log"
    lines = log_file.read_text(errors="replace").splitlines() if log_file.exists() else []
    trouble = [line[:300] for line in lines if " ERROR " in line or "Exception" in line][-15:]
    return "\n".join([str(report.get("error")), *trouble])


PROXY_TOPICS = {"ns/parts": 2, "ns/single": 0}
PROXY_SUBSCRIPTIONS = {"shared": (pulsar.ConsumerType.Shared, "random"),
                       "failover": (pulsar.ConsumerType.Failover, "cumulative")}
PROXY_MESSAGES = 3_000  # per topic: each step still meets several cuts (CUT_EVERY_S)
PROXY_LATENCY_S = 0.005  # each chunk, each way
CUT_EVERY_S = 1.0


@pytest.fixture
def proxies(batch_index_cluster: LocalCluster) -> Iterator[tuple[FaultyProxy, FaultyProxy]]:
    with (FaultyProxy(PROXY_WEB_PORT, batch_index_cluster.web_port, latency_s=PROXY_LATENCY_S) as web,
          FaultyProxy(PROXY_BROKER_PORT, batch_index_cluster.broker_port, latency_s=PROXY_LATENCY_S) as broker):
        yield web, broker


def proxied_spec(path: Path, tenant: str, source: LocalCluster, target: LocalCluster) -> Path:
    """A spec that reaches `target` only through the proxies: admin calls, lookups and message traffic."""
    from tests.integration.test_replicate_topics import SLOW_COPY

    doc = json.loads(write_spec(path, tenant, source, target, options=SLOW_COPY).read_text())
    doc["clusters"][target.name].update(admin_url=f"http://127.0.0.1:{PROXY_WEB_PORT}",
                                        service_url=f"pulsar://127.0.0.1:{PROXY_BROKER_PORT}",
                                        listener_name=PROXIED_LISTENER)
    path.write_text(json.dumps(doc))
    return path


def test_a_migration_through_slow_and_cut_connections_is_exact_and_a_dead_link_gives_one_line(
        batch_index_cluster: LocalCluster, cluster_a: LocalCluster, spark: SparkSession, tmp_path: Path,
        proxies: tuple[FaultyProxy, FaultyProxy]) -> None:
    """sync_metadata, replicate_topics and sync_progress to cluster-c through a proxy that delays every chunk
    and resets every open connection each second: the admin client's bounded retries and the Pulsar client's
    reconnects carry each step through, and the target is exact (every partition in order, every subscription
    draining the same). Then the proxy refuses all connections (admin and broker port, then only the broker
    port): the step fails with one line naming the cluster, exit 1, and nothing more reaches the target."""
    from tests.integration.replication_helpers import drain as read_all
    from tests.integration.replication_helpers import replicate_report
    from tests.integration.test_sync_progress import ack_pattern, drains_differ, subscribe

    web, broker = proxies
    source, target = cluster_a, batch_index_cluster
    admin_a = PulsarAdmin(source.admin_url, name=source.name)
    admin_c = PulsarAdmin(target.admin_url, name=target.name)
    tenant = unique("it-proxied")
    try:
        admin_a.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": [source.name]})
        admin_a.put(f"/namespaces/{tenant}/ns")
        for name, count in PROXY_TOPICS.items():
            admin_a.put(f"/persistent/{tenant}/{name}" + ("/partitions" if count else ""), count or None)
        c = client(source)
        consumers = {(topic, sub): subscribe(c, f"persistent://{tenant}/{topic}", sub, kind)
                     for topic in PROXY_TOPICS for sub, (kind, _) in PROXY_SUBSCRIPTIONS.items()}
        for topic in PROXY_TOPICS:
            producer = c.create_producer(f"persistent://{tenant}/{topic}", batching_enabled=True,
                                         batching_max_messages=10, batching_max_publish_delay_ms=10,
                                         block_if_queue_full=True)
            for i in range(PROXY_MESSAGES):
                producer.send_async(f"{topic}-{i}".encode(), None, partition_key=f"k{i % 13}")
            producer.flush()
        rng = random.Random(11)
        for (_, sub), consumer in consumers.items():
            ack_pattern(consumer, PROXY_SUBSCRIPTIONS[sub][1], rng)
            consumer.close()
        c.close()

        spec = proxied_spec(tmp_path / "spec.json", tenant, source, target)
        run_dir = tmp_path / "run"
        args = ["--spec", str(spec), "--run-dir", str(run_dir)]
        with web.cutting(CUT_EVERY_S), broker.cutting(CUT_EVERY_S):
            assert run_step("sync_metadata", sync_metadata, args) == 0
            assert replicate(spec, run_dir) == 0
            assert sync(spec, run_dir) == 0
        faults = {"web": web.counters.snapshot(), "broker": broker.counters.snapshot()}
        assert faults["web"]["cut"] > 0 and faults["broker"]["cut"] > 0, faults  # the faults really happened
        assert progress_report(run_dir)["counts"]["lost"] == 0 == progress_report(run_dir)["counts"]["duplicated"]

        topics = [f"persistent://{tenant}/{t}" + (f"-partition-{p}" if n else "")
                  for t, n in PROXY_TOPICS.items() for p in range(max(n, 1))]
        for topic in topics:
            copied = [m["data"] for m in read_all(target, topic)]
            assert copied == [m["data"] for m in read_all(source, topic)], topic
        differences, drained = drains_differ(source, target, tenant, PROXY_SUBSCRIPTIONS, list(PROXY_TOPICS))
        assert differences == {} and drained > 0

        def stored() -> int:
            return sum(admin_c.get(f"/persistent/{t.split('://', 1)[1]}/stats")["msgInCounter"] for t in topics)

        produce_more = client(source)
        for topic in PROXY_TOPICS:
            producer = produce_more.create_producer(f"persistent://{tenant}/{topic}", batching_enabled=False)
            for i in range(50):
                producer.send(f"{topic}-after-{i}".encode())
        produce_more.close()
        before = stored()
        # Only the single topic where only the broker port is dead: each partition waits out the client's
        # operation timeout (30 s) before it gives up.
        single = json.loads(spec.read_text())
        single["topics"] = {"include": ["^ns/single$"], "exclude": []}
        (tmp_path / "single.json").write_text(json.dumps(single))
        for dead, dead_spec, dead_run in (((web, broker), spec, run_dir),
                                          ((broker,), tmp_path / "single.json", tmp_path / "single-run")):
            for proxy in dead:
                proxy.refusing = True
                proxy.cut_all()
            started = time.monotonic()
            assert replicate(dead_spec, dead_run) == 1
            error = replicate_report(dead_run)["error"]
            elapsed = time.monotonic() - started
            print(f"dead link {[p.listen_port for p in dead]}: failed after {elapsed:.1f}s: {error}")
            assert "\n" not in error and target.name in error, (error, elapsed)
            assert stored() == before
            for proxy in dead:
                proxy.refusing = False
        assert replicate(spec, run_dir) == 0  # the link is back: the copy finishes
        for topic in topics:
            assert [m["data"] for m in read_all(target, topic)] == [m["data"] for m in read_all(source, topic)]
    finally:
        for admin in (admin_a, admin_c):
            with contextlib.suppress(Exception):
                drop_tenant(tenant, admin)
            admin.close()


def test_start_is_idempotent_registers_all_and_stop_leaves_no_process(batch_index_cluster: LocalCluster,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Late in the module, on the cluster its fixture started fresh (one start of cluster-c saved); its reset starts
    cluster-c with transactions on, and the transaction test after it runs on that start (another one saved)."""
    cluster_c = batch_index_cluster
    pid = int(cluster_c.pid_file.read_text())
    assert cluster_c.admin().healthy()
    assert set(pulsar_local.local_clusters(1)[0].admin().clusters()) >= {"cluster-a", "cluster-b", "cluster-c"}
    assert set(cluster_c.admin().clusters()) >= {"cluster-a", "cluster-b", "cluster-c"}

    pulsar_local.start(3)  # already running: no second broker
    assert int(cluster_c.pid_file.read_text()) == pid
    assert pulsar_local.status(3)["cluster-c"].startswith("healthy")

    kept = unique("it-reset")
    cluster_c.admin().put(f"/tenants/{kept}", {"adminRoles": [], "allowedClusters": ["cluster-c"]})

    pulsar_local.stop_clusters([cluster_c])
    assert not processes.alive(pid)
    assert not processes.port_in_use(cluster_c.web_port)
    assert not processes.port_in_use(cluster_c.broker_port)
    assert pulsar_local.status(3)["cluster-c"] == "stopped"

    # What `make clusters-reset` does (stop, then start --fresh): the data is gone, the cluster is back healthy and
    # its ledger ids start in its own range again (seed_ledger_ids), so a switch's guard still tells the sides apart.
    monkeypatch.setenv(pulsar_local.overrides_variable(cluster_c), TRANSACTIONS)  # for transaction_cluster
    pulsar_local.start_clusters([cluster_c], fresh=True)
    admin = cluster_c.admin()
    assert admin.healthy() and kept not in admin.get("/tenants")
    tenant = unique("it-fresh")
    admin.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": ["cluster-c"]})
    admin.put(f"/namespaces/{tenant}/ns")
    c = client(cluster_c)
    try:
        producer = c.create_producer(f"persistent://{tenant}/ns/t")
        ledger = producer.send(b"after the reset").ledger_id()
        producer.close()
    finally:
        c.close()
    assert ledger >= cluster_c.index * pulsar_local.LEDGER_ID_SPACING
    assert drain_reader(cluster_c, f"persistent://{tenant}/ns/t")[0]["data"] == b"after the reset"


TRANSACTIONS = "transactionCoordinatorEnabled=true"


def transactions_on(cluster: LocalCluster) -> bool:
    """Whether `cluster` is up with its transaction coordinator on."""
    admin = cluster.admin()
    try:
        config = admin.get("/brokers/configuration/runtime") if admin.healthy() else {}
        return str(config.get("transactionCoordinatorEnabled")).lower() == "true"
    except Exception:
        return False
    finally:
        admin.close()


@pytest.fixture
def transaction_cluster(pulsar_clusters: list[LocalCluster]) -> Iterator[LocalCluster]:
    """cluster-c with transactions on: in module order the fresh start the reset test above left running (a start of
    its own before, a minute of CPU); run alone, started fresh here. Registered in cluster-a and cluster-b either
    way; stopped and its data deleted afterwards."""
    cluster = pulsar_local.local_clusters(3)[2]
    if not transactions_on(cluster):
        pulsar_local.stop_clusters([cluster])
        shutil.rmtree(cluster.root, ignore_errors=True)
    pulsar_local.start_with_overrides(cluster, TRANSACTIONS)  # starts only what is not running; registers all
    yield cluster
    pulsar_local.stop_clusters([cluster])
    shutil.rmtree(cluster.root, ignore_errors=True)


def test_transaction_markers_and_aborted_messages_are_left_out_and_runs_end(
    transaction_cluster: LocalCluster, cluster_b: LocalCluster, admin_b: PulsarAdmin, spark: SparkSession,
    tmp_path: Path,
) -> None:
    """A source broker with transactions: the copy takes what consumers get (plain and committed messages) and
    ends although the partition's last stored entry (the run's bound) is a marker no reader is given: the engine
    waited for it and failed every run."""
    cluster_c = transaction_cluster
    admin_c = PulsarAdmin(cluster_c.admin_url, name=cluster_c.name)
    tenant = unique("it-txn")
    # The source's tenant, and on the target what sync_metadata creates from it (that step is judged elsewhere).
    # A message TTL (far off): the copies watch for readers moved past stored entries (test_source_ttl.py), and
    # the markers and aborted messages every reader is moved past are passed after one reading again each.
    for admin, cluster in ((admin_c, cluster_c), (admin_b, cluster_b)):
        admin.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": [cluster.name]})
        admin.put(f"/namespaces/{tenant}/ns")
        admin.post(f"/namespaces/{tenant}/ns/messageTTL", 3600)
        admin.put(f"/persistent/{tenant}/ns/t/partitions", 2)
    topic = f"persistent://{tenant}/ns/t"
    parts = [f"{topic}-partition-{i}" for i in range(2)]
    try:
        transactional_produce(cluster_c, parts[0], 5)
        transactional_produce(cluster_c, parts[1], 3)
        last = admin_c.last_entry(parts[0])
        assert admin_c.entry_headers(parts[0], last.ledger, last.entry).get("X-Pulsar-marker-type"), "the premise"

        spec = write_spec(tmp_path / "spec.json", tenant, cluster_c, cluster_b)
        run_dir = tmp_path / "run"
        assert replicate(spec, run_dir) == 0
        for part, rounds in zip(parts, (5, 3), strict=True):
            expected = [f"{kind}-{i}".encode() for i in range(rounds) for kind in ("plain", "committed")]
            assert [m["data"] for m in drain_reader(cluster_c, part)] == expected  # what the source delivers
            assert [m["data"] for m in drain_reader(cluster_b, part)] == expected
        first = json.loads((run_dir / "replicate_topics.json").read_text())
        assert first["counts"]["mapped_entries"] == 16 and first["counts"]["reader_rereads"] > 0, first["counts"]
        # Nothing new: past the map's end the partitions hold only markers and aborted messages (looked up).
        assert replicate(spec, run_dir) == 0
        assert json.loads((run_dir / "replicate_topics.json").read_text())["counts"]["partitions_unchanged"] == 2

        # Again after more rounds, on the Python path this time (the cutover's final delta always takes it).
        transactional_produce(cluster_c, parts[0], 2)
        python_spec = write_spec(tmp_path / "python.json", tenant, cluster_c, cluster_b,
                                 options={"copy_engine": "python"})
        assert replicate(python_spec, run_dir) == 0
        # Its range ends in a marker the reader is never given: looked up, not waited out (END_CONFIRM_S, 10 s).
        copied = {p["topic"]: p for p in json.loads((run_dir / "replicate_topics.json").read_text())["details"][
            "partitions"]}[parts[0]]
        assert copied["copy_engine"] == "python" and copied["copy_s"] < reading.END_CONFIRM_S, copied
        expected = [f"{kind}-{i}".encode() for i in (*range(5), *range(2)) for kind in ("plain", "committed")]
        assert [m["data"] for m in drain_reader(cluster_b, parts[0])] == expected
        assert replicate(spec, run_dir) == 0  # and a run with nothing new finds both partitions unchanged
        assert json.loads((run_dir / "replicate_topics.json").read_text())["counts"]["partitions_unchanged"] == 2

        # A transaction left open holds back what follows it: a run copies up to it; the cutover's final delta (fenced)
        # must not end there, since clients move to the target after it.
        held = subprocess.Popen([*java_programs.command("TransactionalProduce", pulsar_home()),
                                 cluster_c.service_url, parts[1], "0", "open"], stdout=subprocess.PIPE, text=True)
        try:
            assert held.stdout is not None
            assert any(line.strip() == "READY" for line in held.stdout)  # the client logs to stdout too
            assert replicate(spec, run_dir) == 0
            assert [m["data"] for m in drain_reader(cluster_b, parts[1])][-1] == b"committed-2"  # nothing held back
            end = posmap.ends_local(str(run_dir))[parts[1]]
            job = PartitionJob(parts[1], "ns/t", 1, admin_c.last_entry(parts[1]), (end.target, end.source),
                               fenced=True)
            outcome, rows = copy_partition(MigrationSpec.load(str(spec)), job, dry_run=False, max_in_flight=100,
                                           delivery_horizon_s=0)
            assert outcome.status == "failed" and "before the source's end" in (outcome.error or ""), outcome.error
            assert rows == []
            # The same through the engine, which the final delta takes: it ended quietly before the open
            # transaction's first entry with verdict ok, leaving the messages behind it on the source (until
            # 2026-11-29: found by a review).
            loaded = MigrationSpec.load(str(spec))
            engined = engine_phase(loaded, [job], max_in_flight=100)
            outcome, rows = copy_partition(loaded, engined[0], dry_run=False, max_in_flight=100,
                                           delivery_horizon_s=0)
            assert outcome.copy_engine == "java", outcome
            assert outcome.status == "failed" and "before the source's end" in (outcome.error or ""), outcome.error
        finally:
            held.kill()
            held.wait(timeout=30)
    finally:
        drop_tenant(tenant, admin_c, admin_b)
        admin_c.close()
