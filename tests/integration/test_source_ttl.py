"""A source with a message TTL, or an operator's expiry of every subscription, on real clusters: the broker's expiry
check moves every cursor past messages older than the TTL, the copy's readers' included
(PersistentTopic.checkMessageExpiry expires each subscription, readers' non-durable ones too). A copy then had a
hole in the middle of its range with verdict ok: 30,000 of 40,000 messages on the target, a plain reader of the
source getting all 40,000. The test moves the reader the way the expiry check does (the admin API's expiry of a
subscription up to a position, the same PersistentMessageExpiryMonitor), in the middle of a capped copy, through
the engine and the Python path: the copy reads again from where it was and the target holds every message. Judged
by the step's verification and by plain readers of both sides."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pulsar
import pytest
from localdev.pulsar_local import LocalCluster
from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.backfill.step import BACKFILL_STEP, add_window_args, run_backfill
from pulsar_migration.metadata.step import run as sync_metadata
from pulsar_migration.stepjob import run_step
from pyarrow import dataset as pads
from pyspark.sql import SparkSession

from tests.conftest import unique
from tests.integration.replication_helpers import client, drain, source_tenant
from tests.integration.replication_helpers import replicate as step
from tests.integration.replication_helpers import replicate_report as report
from tests.integration.tenant_builders import write_spec
from tests.integration.test_backfill_window import iso
from tests.integration.test_replicate_topics import cleanup

READER_PREFIX = "pm-copy-reader-"


def expire_reader_up_to(admin: PulsarAdmin, topic: str, message_id: pulsar.MessageId, timeout_s: float = 60) -> str:
    """Waits for the copy's reader on `topic` and expires its cursor up to `message_id`; returns its name."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        subscriptions = admin.get(f"{admin.topic_path(topic)}/stats")["subscriptions"]
        readers = [name for name in subscriptions if name.startswith(READER_PREFIX)]
        if readers:
            admin.post(f"{admin.topic_path(topic)}/subscription/{readers[0]}/expireMessages",
                       {"ledgerId": message_id.ledger_id(), "entryId": message_id.entry_id(), "batchIndex": -1})
            return readers[0]
        time.sleep(0.05)
    raise AssertionError(f"no reader of {topic} appeared in {timeout_s}s")


def produce_and_mark(cluster: LocalCluster, topic: str, count: int) -> pulsar.MessageId:
    """`count` unbatched messages m0, m1, ...; returns the id of the one three quarters in: past what a copy's
    reader has read and queued a few seconds into a capped copy."""
    c = client(cluster)
    try:
        producer = c.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
        for i in range(count):
            producer.send_async(f"m{i}".encode(), None)
        producer.flush()
        producer.close()
        reader = c.create_reader(topic, pulsar.MessageId.earliest)
        for _ in range(count * 3 // 4):
            far = reader.read_next(10_000).message_id()
        reader.close()
        return far
    finally:
        c.close()


def watch(admin: PulsarAdmin, topic: str) -> None:
    """Creates `topic`, kept whole (retention without limits on its namespace) and with subscription `app` at its
    start (what shows an operator's expiry or clearing did happen)."""
    admin.put(admin.topic_path(topic))
    admin.put(f"{admin.topic_path(topic)}/subscription/app", {"entryId": 0, "ledgerId": 0})  # at the earliest
    namespace = topic.split("://", 1)[1].rsplit("/", 1)[0]
    admin.post(f"/namespaces/{namespace}/retention", {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1})


# The copy cases' topics (`<namespace>/<topic>`), each in a namespace of its own: a TTL is set on the namespace or on
# the topic, and a backlog clearing is namespace-wide.
TTL_TOPICS = {"namespace": "ttl-ns/t", "topic": "ttl-topic/t"}  # by where the TTL is set
EXPIRE_ALL_TOPICS = {"java": "expire-java/t", "python": "expire-python/t"}  # no TTL, watched
CLEARED_TOPIC = "clear/t"  # no TTL, watched
COPY_TOPICS = [*TTL_TOPICS.values(), *EXPIRE_ALL_TOPICS.values(), CLEARED_TOPIC]


@pytest.fixture(scope="module")
def synced(cluster_a: LocalCluster, cluster_b: LocalCluster, spark: SparkSession,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One tenant on cluster-a holding every copy case's topic (empty, its policies set), synced to cluster-b by one
    sync_metadata (a Spark job of 20-30 s here, once per case before); each case produces into its own topic and
    copies that one alone (its spec's include). Yields the tenant; drops it on both clusters at the end."""
    admin_a = PulsarAdmin(cluster_a.admin_url, name=cluster_a.name)
    admin_b = PulsarAdmin(cluster_b.admin_url, name=cluster_b.name)
    tenant = unique("it-ttl")
    try:
        admin_a.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": [cluster_a.name]})
        for local in COPY_TOPICS:
            admin_a.put(f"/namespaces/{tenant}/{local.split('/')[0]}")
        # A TTL far off: the guard is on, and nothing expires but what a case expires. Set on the namespace, or on
        # the topic (a topic policy: the step reads that topic's applied TTL on its own).
        for local in TTL_TOPICS.values():
            admin_a.put(admin_a.topic_path(f"persistent://{tenant}/{local}"))
        admin_a.post(f"/namespaces/{tenant}/{TTL_TOPICS['namespace'].split('/')[0]}/messageTTL", 3600)
        on_topic = admin_a.topic_path(f"persistent://{tenant}/{TTL_TOPICS['topic']}")
        admin_a.post(f"{on_topic}/messageTTL", params={"messageTTL": 3600})
        deadline = time.monotonic() + 30
        while admin_a.get(f"{on_topic}/messageTTL", params={"applied": "true"}) != 3600:
            assert time.monotonic() < deadline, "the topic policy never applied"
            time.sleep(0.2)
        for local in [*EXPIRE_ALL_TOPICS.values(), CLEARED_TOPIC]:
            watch(admin_a, f"persistent://{tenant}/{local}")
        tmp = tmp_path_factory.mktemp("ttl-sync")
        spec = write_spec(tmp / "spec.json", tenant, cluster_a, cluster_b)
        assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(tmp / "run")]) == 0
        yield tenant
    finally:
        cleanup(tenant, admin_a, admin_b)
        admin_a.close()
        admin_b.close()


def wait_for_reader(admin: PulsarAdmin, topic: str) -> None:
    """Until a copy's reader of `topic` is there (60 s at most)."""
    deadline = time.monotonic() + 60
    while not any(n.startswith(READER_PREFIX) for n in admin.get(f"{admin.topic_path(topic)}/stats")["subscriptions"]):
        assert time.monotonic() < deadline, "no reader of the topic appeared"
        time.sleep(0.05)


def capped_copy(tmp_path: Path, tenant: str, local: str, a: LocalCluster, b: LocalCluster, engine: str,
                rate: int) -> tuple[Path, Path]:
    """The spec of a copy of the synced tenant's topic `local` alone through `engine` capped at `rate` messages/s,
    and its run dir."""
    options = {"copy_engine": engine, "copy_max_msgs_per_s": rate}
    spec = write_spec(tmp_path / "spec.json", tenant, a, b, topics={"include": [f"^{local}$"]}, options=options)
    return spec, tmp_path / "run"


def run_while_expiring(run: Callable[[], int], admin: PulsarAdmin, topic: str, far: pulsar.MessageId) -> int:
    """Runs a step in a thread and, once its reader of `topic` is there, expires that reader up to `far`; returns
    the step's exit code."""
    return run_while(run, lambda: expire_reader_up_to(admin, topic, far))


def run_while(run: Callable[[], int], action: Callable[[], None]) -> int:
    """Runs a step in a thread while `action` runs in this one; returns the step's exit code."""
    codes: list[int] = []
    running = threading.Thread(target=lambda: codes.append(run()))
    running.start()
    try:
        action()
    finally:
        running.join(300)
    assert len(codes) == 1, "the step did not end"
    return codes[0]


# Counts and caps: the copy takes about 10 s, and the reader has queued (5,000 messages through the engine, 2,000
# through the Python path) and read well short of three quarters of the topic when it is expired there.
@pytest.mark.parametrize(("engine", "count", "rate", "level"),
                         [("java", 20_000, 2_000, "namespace"), ("python", 8_000, 800, "topic")])
def test_a_reader_moved_by_the_sources_message_ttl_reads_again_and_the_copy_is_whole(
    engine: str, count: int, rate: int, level: str, synced: str, cluster_a: LocalCluster, cluster_b: LocalCluster,
    admin_a: PulsarAdmin, spark: SparkSession, tmp_path: Path,
) -> None:
    """A source topic whose TTL is set on its namespace (engine) or on itself (Python path): the copy's reader,
    expired up to three quarters in mid-copy, reads again and the target holds every message in order."""
    local = TTL_TOPICS[level]
    topic = f"persistent://{synced}/{local}"
    far = produce_and_mark(cluster_a, topic, count)
    spec, run_dir = capped_copy(tmp_path, synced, local, cluster_a, cluster_b, engine, rate)
    assert run_while_expiring(lambda: step(spec, run_dir), admin_a, topic, far) == 0
    result = report(run_dir)
    assert result["verdict"] == "ok" and result["details"]["message_ttl_topics"] == 1
    assert result["counts"]["reader_rereads"] >= 1, result["counts"]
    assert result["counts"]["copied_messages"] == count
    expected = [f"m{i}".encode() for i in range(count)]
    assert [m["data"] for m in drain(cluster_b, topic)] == expected == [m["data"] for m in drain(cluster_a, topic)]


@pytest.mark.parametrize(("engine", "older", "newer", "rate"), [("java", 16_000, 4_000, 2_000),
                                                                 ("python", 6_000, 2_000, 800)])
def test_an_expiry_of_every_subscription_moves_the_copys_reader_on_any_topic_and_the_copy_reads_again(
    engine: str, older: int, newer: int, rate: int, synced: str, cluster_a: LocalCluster, cluster_b: LocalCluster,
    admin_a: PulsarAdmin, spark: SparkSession, tmp_path: Path,
) -> None:
    """An operator's `topics expire-messages-all-subscriptions` (the admin call behind it) expires the copy's
    reader with the subscriptions, on a topic without a TTL: the copy had a hole with verdict ok (12,500 of 30,000
    messages through the engine, 3,200 of 8,000 through the Python path, before the guard covered every topic).
    The older half of a topic is expired in the middle of a capped copy; the target gets every message, in order,
    while the source's own subscription shows the expiry did happen. Through the engine and the Python path."""
    # The expiry's threshold, a second after the older half and two before the rest: its whole seconds put it up to
    # a second later, which leaves at least a second either side.
    pause_s, threshold_s = 3.0, 1.0
    local = EXPIRE_ALL_TOPICS[engine]
    topic = f"persistent://{synced}/{local}"
    c = client(cluster_a)
    try:
        producer = c.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
        for i in range(older + newer):
            if i == older:
                producer.flush()
                between = time.time() + threshold_s
                time.sleep(pause_s)
            producer.send_async(f"m{i}".encode(), None)
        producer.flush()
    finally:
        c.close()
    spec, run_dir = capped_copy(tmp_path, synced, local, cluster_a, cluster_b, engine, rate)

    def expire_all() -> None:
        wait_for_reader(admin_a, topic)
        seconds = int(time.time() - between)
        admin_a.post(f"{admin_a.topic_path(topic)}/all_subscription/expireMessages/{seconds}")

    assert run_while(lambda: step(spec, run_dir), expire_all) == 0
    # The expiry happened: the source's own subscription was moved past the older half.
    assert admin_a.get(f"{admin_a.topic_path(topic)}/stats")["subscriptions"]["app"]["msgBacklog"] == newer
    result = report(run_dir)
    assert result["details"]["reader_gap_tolerance"] == {"0": 1}  # no marker can be stored here: strict
    assert result["counts"]["reader_rereads"] >= 1, result["counts"]
    assert result["counts"]["copied_messages"] == older + newer
    expected = [f"m{i}".encode() for i in range(older + newer)]
    assert [m["data"] for m in drain(cluster_b, topic)] == expected


def test_a_backlog_cleared_in_the_middle_of_a_copy_is_read_again_in_the_same_run(
    synced: str, cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin, spark: SparkSession,
    tmp_path: Path,
) -> None:
    """An operator's `namespaces clear-backlog` moves the copy's reader to the topic's end with the subscriptions:
    the reader then gets nothing while the broker counts more, and the run failed after 60 s as a stalled read
    (a re-run healed it). The engine's guarded reader standing still for 10 s where the topic holds the range's end
    is now replaced by one reading from the last entry taken, once per place: the same run copies everything, in
    order. (The Python path still fails as a stall: a new Python reader loses a chunked message begun before it.)"""
    engine, count, rate = "java", 6_000, 1_500
    topic = f"persistent://{synced}/{CLEARED_TOPIC}"
    produce_and_mark(cluster_a, topic, count)
    spec, run_dir = capped_copy(tmp_path, synced, CLEARED_TOPIC, cluster_a, cluster_b, engine, rate)

    def clear_backlog() -> None:
        wait_for_reader(admin_a, topic)
        time.sleep(1.0)  # a second into a copy of four
        admin_a.post(f"/namespaces/{synced}/{CLEARED_TOPIC.split('/')[0]}/clearBacklog")

    assert run_while(lambda: step(spec, run_dir), clear_backlog) == 0, report(run_dir).get("error")
    # The clearing happened: the source's own subscription has no backlog left.
    assert admin_a.get(f"{admin_a.topic_path(topic)}/stats")["subscriptions"]["app"]["msgBacklog"] == 0
    result = report(run_dir)
    assert result["counts"]["reader_rereads"] >= 1 and result["counts"]["copied_messages"] == count, result
    assert [m["data"] for m in drain(cluster_b, topic)] == [f"m{i}".encode() for i in range(count)]


def test_a_window_archived_from_a_source_with_a_message_ttl_is_whole_though_its_reader_was_moved(
    cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin, spark: SparkSession, tmp_path: Path,
) -> None:
    """The backfill DAG's archive sink reads windows of older messages, the ones a TTL expires."""
    count = 8_000
    tenant = source_tenant(admin_a, cluster_a, unique("it-ttl-archive"))
    admin_a.post(f"/namespaces/{tenant}/ns/messageTTL", 3600)
    topic = f"persistent://{tenant}/ns/t"
    admin_a.put(admin_a.topic_path(topic))
    try:
        start = int(time.time() * 1000) - 1
        far = produce_and_mark(cluster_a, topic, count)
        time.sleep(0.2)
        end = int(time.time() * 1000)
        archive = tmp_path / "archive"
        spec = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b,
                          options={"backfill_sink": "parquet", "archive_path": str(archive),
                                   "copy_max_msgs_per_s": 800})
        args = ["--spec", str(spec), "--run-dir", str(tmp_path / "w"), "--start", iso(start), "--end", iso(end)]
        assert run_while_expiring(lambda: run_step(BACKFILL_STEP, run_backfill, args, add_args=add_window_args),
                                  admin_a, topic, far) == 0
        rows = pads.dataset(str(archive), format="parquet", partitioning="hive").to_table().to_pylist()
        assert sorted(r["payload"] for r in rows) == sorted(f"m{i}".encode() for i in range(count))
    finally:
        cleanup(tenant, admin_a)
