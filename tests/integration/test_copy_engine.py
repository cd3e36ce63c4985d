"""The Java copy engine (replication.engine) against the real cluster pair: what the Python path would copy, the
engine copies the same, entry for entry, judged by the plain Python client reading both sides.

Compressed batches (the engine sends them decompressed, as one entry each), an unbatched compressed topic with a
delayed message (the engine keeps the delivery time from the entry's metadata, no admin lookups), batches of
large messages (the engine takes them too), a re-run that copies nothing, and the Python
path's own hash of the same source range (a dry run reads it with the Python client) equal to the engine's.
The engine also reads the target back (its verification and map rows): the Python client's read-back of the same
target range (partition.scan_copied_target) must give the same hash, pairs and rows, and a message on the target
that no copy wrote must fail the engine's read-back.
"""

from __future__ import annotations

import base64
import functools
import logging
import time
from pathlib import Path
from typing import Any

import pulsar
import pytest
from localdev import java_programs
from localdev.pulsar_dist import pulsar_home
from localdev.pulsar_local import LocalCluster
from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.metadata.step import run as sync_metadata
from pulsar_migration.positions import Position
from pulsar_migration.replication import engine, posmap
from pulsar_migration.replication.partition import PartitionJob, average_from_stats, scan_copied_target
from pulsar_migration.replication.step import STEP, run
from pulsar_migration.spec import MigrationSpec
from pulsar_migration.stepjob import run_step
from pyspark.sql import SparkSession

from tests.conftest import unique
from tests.integration.replication_helpers import client, delivery_time_ms, drain, source_tenant
from tests.integration.replication_helpers import replicate as step
from tests.integration.replication_helpers import replicate_report as report
from tests.integration.tenant_builders import write_spec
from tests.integration.test_replicate_topics import cleanup, content, partitions, shape

log = logging.getLogger(__name__)
BIG_BATCH = 40_000


def big_batch_producer(c: pulsar.Client, topic: str, **kwargs: Any) -> pulsar.Producer:
    """A producer whose batch closes only when flushed and can hold BIG_BATCH small messages."""
    return c.create_producer(topic, batching_enabled=True, batching_max_messages=BIG_BATCH,
                             batching_max_allowed_size_in_bytes=5_000_000, batching_max_publish_delay_ms=60_000,
                             max_pending_messages=BIG_BATCH, block_if_queue_full=True, **kwargs)


def send_big_batch(producer: pulsar.Producer, site: str) -> None:
    """One uncompressed batch of BIG_BATCH JSON-like messages (about 3.3 MB stored): under the broker's 5 MiB as
    stored, over it once every message carries the copy's two added properties."""
    for i in range(BIG_BATCH):
        producer.send_async(f'{{"sensor": {i % 500}, "reading": {i * 7919 % 100_000}, "unit": "celsius", '
                            f'"site": "{site}-{i % 3}"}}'.encode(), None)
    producer.flush()


def test_the_engine_copies_compressed_batches_and_delivery_times_exactly(
    cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin, admin_b: PulsarAdmin,
    spark: SparkSession, tmp_path: Path,
) -> None:
    assert engine.unavailable_reason() is None  # the development set-up has a JDK and the Pulsar distribution
    tenant = unique("it-engine")
    topics = {"ns/lz4": 2, "ns/zstd": 0, "ns/large": 0, "ns/wide": 0, "ns/big": 0}
    admin_a.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": [cluster_a.name]})
    admin_a.put(f"/namespaces/{tenant}/ns")
    admin_a.put(f"/persistent/{tenant}/ns/lz4/partitions", 2)
    admin_a.put(f"/persistent/{tenant}/ns/zstd")
    admin_a.put(f"/persistent/{tenant}/ns/large")
    admin_a.put(f"/persistent/{tenant}/ns/wide")
    admin_a.put(f"/persistent/{tenant}/ns/big")
    c = client(cluster_a)
    batched = c.create_producer(f"persistent://{tenant}/ns/lz4", compression_type=pulsar.CompressionType.LZ4,
                                batching_enabled=True, batching_max_messages=100, batching_max_publish_delay_ms=20,
                                block_if_queue_full=True)
    for i in range(6000):
        batched.send_async(f"z-{i}".encode() * 20, None, partition_key=f"k{i % 13}", properties={"i": str(i)},
                           event_timestamp=1_700_000_000_000 + i)
    batched.flush()
    unbatched = c.create_producer(f"persistent://{tenant}/ns/zstd", compression_type=pulsar.CompressionType.ZSTD,
                                  batching_enabled=False)
    for i in range(300):
        unbatched.send(f"u-{i}".encode() * 30, ordering_key=f"o{i % 4}")
    deliver_at = int(time.time() * 1000) + 3_600_000
    unbatched.send(b"delayed", deliver_at=deliver_at)
    unbatched.send(b"after")
    unbatched.send(b"w" * (7 * 1024 * 1024))  # over the broker's 5 MiB once decompressed: the engine compresses it
    large = c.create_producer(f"persistent://{tenant}/ns/large", batching_enabled=True, batching_max_messages=4,
                              batching_max_publish_delay_ms=50, block_if_queue_full=True)
    for i in range(20):  # batches of 12 KiB messages: the engine copies them too (the Python path loses binary keys)
        large.send_async(bytes([i]) * 12_288, None)
    large.flush()
    wide = c.create_producer(f"persistent://{tenant}/ns/wide", batching_enabled=False)
    for i in range(20):  # unbatched 12 KiB messages: the engine copies them
        wide.send(bytes([i]) * 12_288)
    # One uncompressed batch of 40,000 small messages, under the broker's 5 MiB as stored but over it once every
    # message carries the two added properties: the engine sends it LZ4-compressed (refused on every run before).
    send_big_batch(big_batch_producer(c, f"persistent://{tenant}/ns/big"), "eu-west")
    c.close()
    spec = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b)
    try:
        assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(tmp_path)]) == 0
        assert step(spec, tmp_path / "dry", "--dry-run") == 0  # the Python path reads and hashes the source
        python_hashes = {p["topic"]: p["source_hash"] for p in report(tmp_path / "dry")["details"]["partitions"]}

        assert step(spec, tmp_path / "run") == 0
        rep = report(tmp_path / "run")
        assert rep["details"]["copy_engine"] == "java"
        parts = {p["topic"]: p for p in rep["details"]["partitions"]}
        engines = {t.rsplit("/", 1)[1]: p["copy_engine"] for t, p in parts.items()}
        batched = {t.rsplit("/", 1)[1] for t, p in parts.items() if p["source_entries"] < p["source_messages"]}
        assert batched == {"lz4-partition-0", "lz4-partition-1", "large", "big"}  # the producers really batched
        assert parts[f"persistent://{tenant}/ns/big"]["source_entries"] == 1
        assert engines == {"lz4-partition-0": "java", "lz4-partition-1": "java", "zstd": "java", "large": "java",
                           "wide": "java", "big": "java"}
        assert rep["details"]["copy_engines_ran"] == {"java": 6}
        assert {t: p["source_hash"] for t, p in parts.items()} == python_hashes
        assert rep["counts"]["copied_messages"] == rep["counts"]["target_messages"] == 6000 + 303 + 20 + 20 + BIG_BATCH
        # the engine reads delivery times from the entries; the Python path looks up unbatched entries only
        assert rep["counts"]["delivery_time_lookups"] == 0 and rep["counts"]["delayed_messages"] == 1
        # The engine's read-back of the target against the Python client's read-back of the same range.
        assert {t.rsplit("/", 1)[1]: p["verified_by"] for t, p in parts.items()} == {
            "lz4-partition-0": "java", "lz4-partition-1": "java", "zstd": "java", "large": "java", "wide": "java",
            "big": "java"}
        rows = posmap.read_local(str(tmp_path / "run"))
        python_client = client(cluster_b)
        try:
            for topic, part in parts.items():
                if part["verified_by"] != "java":
                    continue
                job = PartitionJob(topic, topic.split("/", 3)[3], part["partition"], Position.parse(part["range_to"]))
                scan = scan_copied_target(python_client, job, None, None, admin_b.last_entry(topic))
                assert (scan.content.hexdigest, scan.content.messages, scan.content.entries) == (
                    part["target_hash"], part["target_messages"], part["target_entries"]), topic
                assert scan.pairs.hexdigest == part["target_pairs_digest"] and not scan.shape_errors, topic
                mine = rows[rows.topic == topic].sort_values(["target_ledger", "target_entry"])
                assert [r.as_tuple() for r in scan.rows] == [tuple(r) for r in mine.itertuples(index=False)], topic
        finally:
            python_client.close()
        for topic in partitions(tenant, topics):
            source, target = drain(cluster_a, topic), drain(cluster_b, topic)
            assert content(target) == content(source), topic
            assert shape(target) == shape(source), topic
        zstd = drain(cluster_b, f"persistent://{tenant}/ns/zstd")
        delayed = next(m for m in zstd if m["data"] == b"delayed")
        assert delivery_time_ms(admin_b, f"persistent://{tenant}/ns/zstd", delayed) == deliver_at
        # The copies' producers are the Python path's (the target's dedup state is shared by both paths).
        headers = admin_b.entry_headers(f"persistent://{tenant}/ns/zstd", *delayed["entry"])
        producers = {headers["X-Pulsar-producer-name"]}
        large_one = next(m for m in zstd if len(m["data"]) > 5 * 1024 * 1024)
        stored = admin_b.entry_headers(f"persistent://{tenant}/ns/zstd", *large_one["entry"])
        assert stored["X-Pulsar-compression"] == "ZSTD" and stored["X-Pulsar-uncompressed-size"] == str(7 * 1024 * 1024)
        assert all(name.startswith("pm-copy-") for name in producers)
        big_topic = f"persistent://{tenant}/ns/big"
        big_source, big_target = (admin.entry_headers(big_topic, entry.ledger, entry.entry)
                                  for admin in (admin_a, admin_b) for entry in [admin.last_entry(big_topic)])
        log.info("the big batch: source %s, target %s", big_source, big_target)
        assert "X-Pulsar-compression" not in big_source and big_target["X-Pulsar-compression"] == "LZ4"
        assert int(big_target["X-Pulsar-uncompressed-size"]) > 5 * 1024 * 1024

        assert step(spec, tmp_path / "run") == 0  # a re-run finds nothing new
        again = report(tmp_path / "run")
        assert again["counts"]["copied_messages"] == 0 and again["counts"]["partitions_unchanged"] == 6
    finally:
        cleanup(tenant, admin_a, admin_b)


def test_the_python_path_looks_up_delivery_times_of_unbatched_entries(
    cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin, admin_b: PulsarAdmin,
    spark: SparkSession, tmp_path: Path,
) -> None:
    """copy_engine python (also what runs where no JDK is found): the Python client cannot read a message's delivery
    time, so every unbatched entry is looked up through the admin API and the delayed one keeps its time."""
    tenant = source_tenant(admin_a, cluster_a, unique("it-pypath"))
    admin_a.put(f"/persistent/{tenant}/ns/t")
    topic = f"persistent://{tenant}/ns/t"
    c = client(cluster_a)
    producer = c.create_producer(topic, batching_enabled=False)
    for i in range(10):
        producer.send(f"m-{i}".encode())
    deliver_at = int(time.time() * 1000) + 3_600_000
    producer.send(b"delayed", deliver_at=deliver_at)
    c.close()
    spec = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b, options={"copy_engine": "python"})
    try:
        assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(tmp_path)]) == 0
        assert step(spec, tmp_path / "run") == 0
        rep = report(tmp_path / "run")
        assert rep["details"]["copy_engine"] == "python"
        assert rep["counts"]["delivery_time_lookups"] == 11 and rep["counts"]["delayed_messages"] == 1
        target = drain(cluster_b, topic)
        assert content(target) == content(drain(cluster_a, topic))
        delayed = next(m for m in target if m["data"] == b"delayed")
        assert delivery_time_ms(admin_b, topic, delayed) == deliver_at
    finally:
        cleanup(tenant, admin_a, admin_b)


def test_the_python_path_compresses_entries_too_large_to_send_decompressed(
    cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin, admin_b: PulsarAdmin,
    spark: SparkSession, tmp_path: Path,
) -> None:
    """The Python path (copy_engine python, dry runs, the cutover's final delta) sends what the client gives it
    decompressed. Three source entries fit the broker's 5 MiB only as stored: an uncompressed batch of 40,000 small
    messages that the two added properties push over it, a ZSTD batch of 8 MiB, and an unbatched 7 MiB ZSTD message.
    They were refused (the batches) or chunked into several target entries (the message); now each goes as one entry
    compressed with the source's codec (LZ4 for the uncompressed batch), with normal entries around it. The final
    delta's identity producers (source producer names) do the same."""
    tenant = source_tenant(admin_a, cluster_a, unique("it-pyz"))
    topics = {"ns/big": 0, "ns/zbatch": 0, "ns/zone": 0}
    for name in topics:
        admin_a.put(f"/persistent/{tenant}/{name}")
    c = client(cluster_a)

    def big_batch(round_: int) -> None:
        big = big_batch_producer(c, f"persistent://{tenant}/ns/big", producer_name=f"big-{round_}")
        big.send_async(f"before-{round_}".encode(), None)
        big.flush()
        send_big_batch(big, f"round-{round_}")
        big.send_async(f"after-{round_}".encode(), None)
        big.flush()
        big.close()

    big_batch(1)
    zbatch = c.create_producer(f"persistent://{tenant}/ns/zbatch", compression_type=pulsar.CompressionType.ZSTD,
                               batching_enabled=True, batching_max_messages=8,
                               batching_max_allowed_size_in_bytes=16 * 1024 * 1024,
                               batching_max_publish_delay_ms=60_000, block_if_queue_full=True)
    zbatch.send_async(b"small", None)
    zbatch.flush()
    for i in range(8):
        zbatch.send_async(bytes([65 + i]) * (1024 * 1024), None, properties={"i": str(i)})
    zbatch.flush()
    zbatch.send_async(b"small again", None)
    zbatch.flush()
    zone = c.create_producer(f"persistent://{tenant}/ns/zone", compression_type=pulsar.CompressionType.ZSTD,
                             batching_enabled=False)
    zone.send(b"first")
    zone.send(b"w" * (7 * 1024 * 1024))
    zone.send(b"last")
    spec = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b, options={"copy_engine": "python"})

    def stored(topic: str) -> list[dict[str, str]]:
        """The headers of the target's entries, in order."""
        entries = dict.fromkeys(tuple(m["entry"]) for m in drain(cluster_b, topic))
        return [admin_b.entry_headers(topic, *entry) for entry in entries]

    try:
        assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(tmp_path)]) == 0
        assert step(spec, tmp_path / "run") == 0
        rep = report(tmp_path / "run")
        assert rep["details"]["copy_engine"] == "python" and rep["counts"]["partitions_failed"] == 0
        for topic in partitions(tenant, topics):
            source, target = drain(cluster_a, topic), drain(cluster_b, topic)
            assert content(target) == content(source), topic
            assert shape(target) == shape(source), topic
        codecs = {name: [(h.get("X-Pulsar-compression"), h["X-Pulsar-producer-name"].rsplit("-", 1)[1])
                         for h in stored(f"persistent://{tenant}/{name}")] for name in topics}
        log.info("target entries (codec, producer name's end): %s", codecs)
        assert codecs["ns/big"] == [(None, "bn"), ("LZ4", "bnzlz4"), (None, "bn")]
        assert codecs["ns/zbatch"] == [(None, "bn"), ("ZSTD", "bnzzstd"), (None, "bn")]
        assert codecs["ns/zone"] == [(None, "un"), ("ZSTD", "unzzstd"), (None, "un")]

        # The cutover's final delta keeps the source producer's name whatever the codec.
        big_batch(2)
        c.close()
        delta = functools.partial(run, keep_identity=True)
        assert run_step(STEP, delta, ["--spec", str(spec), "--run-dir", str(tmp_path / "run")]) == 0
        topic = f"persistent://{tenant}/ns/big"
        source, target = drain(cluster_a, topic), drain(cluster_b, topic)
        assert content(target) == content(source)
        assert shape(target) == shape(source)
        delta_entries = [(h.get("X-Pulsar-compression"), h["X-Pulsar-producer-name"]) for h in stored(topic)[3:]]
        assert delta_entries == [(None, "big-2"), ("LZ4", "big-2"), (None, "big-2")]
    finally:
        cleanup(tenant, admin_a, admin_b)


def test_the_final_delta_keeps_a_source_producer_that_sent_batched_and_delayed_messages(
    cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin, admin_b: PulsarAdmin,
    spark: SparkSession, tmp_path: Path,
) -> None:
    """The cutover's final delta sends under the source producers' names. A batching producer's delayed message is
    never batched, so one name owns batched and unbatched entries, and the broker admits one producer per name on a
    topic: the delta must close one before it opens the other, in the source's order."""
    tenant = source_tenant(admin_a, cluster_a, unique("it-mixed"))
    topic = f"persistent://{tenant}/ns/mixed"
    admin_a.put(f"/persistent/{tenant}/ns/mixed")
    c = client(cluster_a)
    producer = c.create_producer(topic, producer_name="mixed-source", batching_enabled=True,
                                 batching_max_messages=5, batching_max_publish_delay_ms=60_000)
    deliver_at = int(time.time() * 1000) + 3_600_000
    for round_ in range(2):
        for i in range(5):
            producer.send_async(f"batched-{round_}-{i}".encode(), None)
        producer.flush()
        producer.send(f"delayed-{round_}".encode(), deliver_at=deliver_at)
    c.close()
    spec = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b, options={"copy_engine": "python"})
    try:
        assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(tmp_path)]) == 0
        delta = functools.partial(run, keep_identity=True)
        assert run_step(STEP, delta, ["--spec", str(spec), "--run-dir", str(tmp_path / "run")]) == 0
        source, target = drain(cluster_a, topic), drain(cluster_b, topic)
        assert content(target) == content(source) and shape(target) == shape(source)
        entries = dict.fromkeys(tuple(m["entry"]) for m in target)
        names = [admin_b.entry_headers(topic, *entry)["X-Pulsar-producer-name"] for entry in entries]
        assert names == ["mixed-source"] * 4
        delayed = next(m for m in target if m["data"] == b"delayed-1")
        assert delivery_time_ms(admin_b, topic, delayed) == deliver_at
    finally:
        cleanup(tenant, admin_a, admin_b)


def binary_keys(*args: str) -> list[str]:
    """localdev/java/BinaryKeys.java through the distribution's Java client: `produce` or `read` (its lines)."""
    reads = binary_keys_runs([list(args)])
    return reads[0] if reads else []


def binary_keys_runs(commands: list[list[str]]) -> list[list[str]]:
    """Several BinaryKeys commands in one JVM, in order; the lines of each `read`, in order."""
    done = java_programs.run_commands("BinaryKeys", pulsar_home(), commands)
    assert done.returncode == 0, done.stderr[-3000:]
    return java_programs.read_blocks(done.stdout)


def test_binary_keys_of_java_producers_arrive_as_bytes_through_the_engine(
    cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin, admin_b: PulsarAdmin,
    spark: SparkSession, tmp_path: Path,
) -> None:
    """A Java producer's binary key (`keyBytes`) is stored base64-encoded with a flag in the metadata; a Java
    consumer gets the bytes back only if the flag is there. The Java client is the judge on both sides: through the
    engine (which keeps the entry's metadata) every key, batched and unbatched, reads back as the same bytes. The
    Python path cannot set the flag (the C++ client has no setter): its copies carry the base64 text as a plain key,
    the limitation the README states."""
    tenants = {engine_choice: source_tenant(admin_a, cluster_a, unique(f"it-keys-{engine_choice}"))
               for engine_choice in ("auto", "python")}
    topics = {engine_choice: f"persistent://{tenant}/ns/keys" for engine_choice, tenant in tenants.items()}
    # Batches of 12 KiB messages (the Python path took them until 2026-11-26, and lost the flag).
    large = f"persistent://{tenants['auto']}/ns/large-keys"
    try:
        for topic in (*topics.values(), large):
            admin_a.put(admin_a.topic_path(topic))
        a = cluster_a.service_url
        # One Java client run writes all three topics and reads them back; one more reads the copies.
        read = (*topics.values(), large)
        sources = dict(zip(read, binary_keys_runs(
            [["produce", a, topics["auto"], "30"], ["produce", a, topics["python"], "30"],
             ["produce", a, large, "20", str(12 * 1024)], *(["read", a, topic] for topic in read)]), strict=True))
        for engine_choice, tenant in tenants.items():
            source = sources[topics[engine_choice]]
            assert len(source) == 62 and sum(line.startswith("true ") for line in source) == 60
            spec = write_spec(tmp_path / f"spec-{engine_choice}.json", tenant, cluster_a, cluster_b,
                              options={"copy_engine": engine_choice})
            assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(tmp_path)]) == 0
            assert step(spec, tmp_path / engine_choice) == 0
            assert report(tmp_path / engine_choice)["details"]["copy_engine"] == (
                "java" if engine_choice == "auto" else "python")
        targets = dict(zip(read, binary_keys_runs([["read", cluster_b.service_url, topic] for topic in read]),
                           strict=True))
        assert targets[topics["auto"]] == sources[topics["auto"]]
        large_source = sources[large]
        assert len(large_source) == 42 and sum(line.startswith("true ") for line in large_source) == 40
        parts = {p["topic"]: p for p in report(tmp_path / "auto")["details"]["partitions"]}
        assert parts[large]["copy_engine"] == "java" and parts[large]["copied_messages"] == 42
        assert parts[large]["source_entries"] < parts[large]["source_messages"]  # batched
        assert targets[large] == large_source
        # The Python path: the key's base64 text, as a plain key.
        expected = [f"false {base64.b64encode(bytes.fromhex(key)).hex()} {value}" if flag == "true"
                    else line for line in sources[topics["python"]] for flag, key, value in [line.split(" ")]]
        assert targets[topics["python"]] == expected
    finally:
        for tenant in tenants.values():
            cleanup(tenant, admin_a, admin_b)


def test_the_final_delta_goes_through_the_engine_with_identities_binary_keys_and_last_sequence_ids(
    cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin, admin_b: PulsarAdmin,
    spark: SparkSession, tmp_path: Path,
) -> None:
    """The cutover's driver deltas as the switch runs them: a catch-up round, then the final delta of what was
    written since, both in the driver through one engine process started before them (switch.step.delta_engine).
    Every delta entry keeps its source producer's name, sequence id and highest sequence id; the binary keys
    read back as bytes (the Java client judges both sides); and the target's deduplication knows each producer's
    last sequence id as the source stored it (a batch's highest, which the client sends only for batches it built
    itself: a producer created there with that name is told it)."""
    from pulsar_migration.switch.step import delta_engine

    tenant = source_tenant(admin_a, cluster_a, unique("it-delta-engine"))
    topic = f"persistent://{tenant}/ns/keys"
    admin_a.put(f"/persistent/{tenant}/ns/keys")
    spec_path = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b)

    def headers(admin: PulsarAdmin, cluster: LocalCluster) -> list[dict[str, str]]:
        entries = dict.fromkeys(tuple(m["entry"]) for m in drain(cluster, topic))
        return [admin.entry_headers(topic, *entry) for entry in entries]

    try:
        binary_keys("produce", cluster_a.service_url, topic, "10")
        assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec_path), "--run-dir", str(tmp_path)]) == 0
        process = delta_engine(MigrationSpec.load(str(spec_path)))
        assert process is not None
        catch_up = functools.partial(run, in_driver=True, engine_process=process)
        assert run_step(STEP, catch_up, ["--spec", str(spec_path), "--run-dir", str(tmp_path / "run")]) == 0
        assert report(tmp_path / "run")["details"]["copy_engine"] == "java" and process.alive()
        caught_up = len(headers(admin_b, cluster_b))
        assert caught_up == len(headers(admin_a, cluster_a)) == 13  # a batch of ten, one of one, 11 unbatched
        binary_keys("produce", cluster_a.service_url, topic, "25")
        c = client(cluster_a)  # the C++ client leaves a batch's highest sequence id out of its metadata
        producer = c.create_producer(topic, producer_name="python-batches", batching_enabled=True,
                                     batching_max_messages=5, batching_max_publish_delay_ms=60_000)
        for i in range(10):
            producer.send_async(f"python-{i}".encode(), None, partition_key=f"k{i}")
        producer.flush()
        c.close()
        delta = functools.partial(run, keep_identity=True, in_driver=True, engine_process=process)
        assert run_step(STEP, delta, ["--spec", str(spec_path), "--run-dir", str(tmp_path / "run")]) == 0
        process.close()
        rep = report(tmp_path / "run")
        part = rep["details"]["partitions"][0]
        assert rep["details"]["in_driver"] and rep["details"]["copy_engine"] == "java"
        assert (part["copy_engine"], part["verified_by"], part["copied_messages"]) == ("java", "python", 62)
        target, source = binary_keys_runs([["read", cluster_b.service_url, topic],
                                           ["read", cluster_a.service_url, topic]])
        assert target == source

        identity = ("X-Pulsar-producer-name", "X-Pulsar-sequence-id", "X-Pulsar-highest-sequence-id")
        source = [tuple(h.get(name) for name in identity) for h in headers(admin_a, cluster_a)]
        target = [tuple(h.get(name) for name in identity) for h in headers(admin_b, cluster_b)]
        assert len(source) == len(target) and target[caught_up:] == source[caught_up:]
        assert all(name.startswith("pm-copy-") for name, _, _ in target[:caught_up])
        log.info("delta entries (producer, sequence id, highest): %s", target[caught_up:])
        # The broker's deduplication state as the source's would be (without dedup the source keeps none): a batch's
        # highest sequence id, else its lowest plus its size less one.
        last: dict[str, int] = {}
        for h in headers(admin_a, cluster_a)[caught_up:]:
            sequence = int(h["X-Pulsar-sequence-id"])
            highest = h.get("X-Pulsar-highest-sequence-id")
            batch = int(h.get("X-Pulsar-num-batch-message", "1"))
            name = h["X-Pulsar-producer-name"]
            last[name] = max(last.get(name, -1), int(highest) if highest else sequence + batch - 1)
        assert last["python-batches"] == 9
        c = client(cluster_b)
        try:
            told = {}
            for name in last:
                producer = c.create_producer(topic, producer_name=name)
                told[name] = producer.last_sequence_id()
                producer.close()
        finally:
            c.close()
        assert told == last and len(last) == 3
    finally:
        cleanup(tenant, admin_a, admin_b)


def test_the_engines_read_back_leaves_out_dropped_resends_and_fails_on_a_message_no_copy_wrote(
    cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin, admin_b: PulsarAdmin,
    spark: SparkSession, tmp_path: Path,
) -> None:
    tenant = source_tenant(admin_a, cluster_a, unique("it-engine-tamper"))
    topic = f"persistent://{tenant}/ns/t"
    admin_a.put(f"/persistent/{tenant}/ns/t")
    c = client(cluster_a)
    producer = c.create_producer(topic, batching_enabled=True, batching_max_messages=10,
                                 batching_max_publish_delay_ms=20)
    for i in range(100):
        producer.send_async(f"m-{i}".encode(), None)
    producer.flush()
    c.close()
    spec_path = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b)
    try:
        assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec_path), "--run-dir", str(tmp_path)]) == 0
        assert step(spec_path, tmp_path / "run") == 0
        part = report(tmp_path / "run")["details"]["partitions"][0]
        assert part["verified_by"] == "java" and part["shape_errors"] == 0
        spec = MigrationSpec.load(str(spec_path))
        upper = Position.parse(part["range_to"])
        # Everything sent again (no resume point): the target's deduplication drops every entry, so no receipt
        # names a target entry and the read-back must leave all its pairs out too.
        again = engine.EngineJob(topic, topic, None, None, upper, rows_file=str(tmp_path / "rows-again"))
        result = engine.copy_many(spec, [again], 100)[0][topic]
        assert isinstance(result, engine.EngineResult) and result.scan is not None
        assert result.deduplicated == 100 and result.receipts == 0
        assert result.scan.pairs == 0 and result.scan.pairs_digest == result.receipts_digest
        assert (result.scan.messages, result.scan.hash) == (100, result.source_hash) == (100, part["target_hash"])
        foreign = client(cluster_b)
        foreign.create_producer(topic, batching_enabled=False).send(b"not a copy")
        foreign.close()
        job = engine.EngineJob(topic, topic, None, upper, upper, rows_file=str(tmp_path / "rows"))
        results, _ = engine.copy_many(spec, [job], 100)
        result = results[topic]
        assert isinstance(result, engine.EngineResult) and result.copied_messages == 0
        assert result.scan is not None
        assert result.scan.messages == 101 and result.scan.shape_errors == 1
        assert "has no source tag" in result.scan.first_shape_errors[0]
        assert result.scan.hash != result.source_hash and result.scan.hash != part["target_hash"]
        written = posmap.engine_rows_table(str(tmp_path / "rows"), topic, -1).num_rows
        assert result.scan.rows == written == part["target_entries"]
    finally:
        cleanup(tenant, admin_a, admin_b)


def test_the_engine_copies_four_partitions_of_large_batches_in_a_small_heap(
    cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin, admin_b: PulsarAdmin,
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Entries of 128 KiB (eight 16 KiB messages) on four partitions at once, in an engine of 192 MB of heap: its
    pending sends are bounded by bytes (the client's memory limit) and its readers' queues by the partition's
    average message size, so it cannot hold the whole range (768 MB in 4 partitions once ran a 512 MB heap out)."""
    tenant = source_tenant(admin_a, cluster_a, unique("it-engine-heap"))
    base = f"persistent://{tenant}/ns/big"
    admin_a.put(f"/persistent/{tenant}/ns/big/partitions", 4)
    c = client(cluster_a)
    producer = c.create_producer(base, batching_enabled=True, batching_max_messages=8,
                                 batching_max_publish_delay_ms=50,
                                 block_if_queue_full=True, max_pending_messages=2000)
    payload = bytes(range(256)) * 64
    for i in range(12_000):  # 197 MB
        producer.send_async(payload, None, partition_key=f"k{i}")
    producer.flush()
    c.close()
    spec_path = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b)
    try:
        assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec_path), "--run-dir", str(tmp_path)]) == 0
        spec = MigrationSpec.load(str(spec_path))
        jobs = []
        for index in range(4):
            topic = f"{base}-partition-{index}"
            last = admin_a.get(f"{admin_a.topic_path(topic)}/lastMessageId")
            queue = engine.receiver_queue_for(average_from_stats(admin_a.get(f"{admin_a.topic_path(topic)}/stats")))
            assert queue < engine.RECEIVER_QUEUE
            jobs.append(engine.EngineJob(topic, base, None, None, Position(last["ledgerId"], last["entryId"]),
                                         rows_file=str(tmp_path / f"rows-{index}"), receiver_queue=queue))
        # 192 MB: before the byte bounds this ran out of heap (measured); 128 MB is too little even now under load, as
        # the direct memory (= the heap size) is full of reader queues and the client falls back to heap buffers.
        monkeypatch.setenv("PM_ENGINE_JAVA_OPTIONS", "-Xmx192m")
        results, _ = engine.copy_many(spec, jobs, spec.copy_max_in_flight)
        copied = 0
        for job in jobs:
            result = results[job.topic]
            assert isinstance(result, engine.EngineResult), result
            assert result.scan is not None and result.scan.hash == result.source_hash
            assert result.scan.shape_errors == 0 and result.scan.pairs_digest == result.receipts_digest
            copied += result.copied_messages
            assert result.source_entries * 4 <= result.source_messages  # batches, mostly of eight
        assert copied == 12_000
    finally:
        cleanup(tenant, admin_a, admin_b)


def test_the_first_real_copy_records_the_full_class_archive_and_later_starts_map_it(
    cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin, admin_b: PulsarAdmin,
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fresh build (its own cache directory) has only the training archive; the first copy records the classes a
    real copy loads at its exit, frees its claim, and a later start maps that archive (-Xshare:on refuses to start
    on an archive that does not fit). The copy itself is judged as always."""
    lib = engine.pulsar_lib()
    assert lib is not None
    monkeypatch.setenv("PULSAR_HOME", str(lib.parent))
    monkeypatch.setenv("PM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PM_ENGINE_JAVA_OPTIONS", raising=False)
    tenant = source_tenant(admin_a, cluster_a, unique("it-engine-cds"))
    topic = f"persistent://{tenant}/ns/t"
    admin_a.put(f"/persistent/{tenant}/ns/t")
    c = client(cluster_a)
    producer = c.create_producer(topic, batching_enabled=True, batching_max_messages=10, block_if_queue_full=True)
    for i in range(200):
        producer.send_async(f"m-{i}".encode(), None)
    producer.flush()
    c.close()
    spec_path = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b)
    try:
        assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec_path), "--run-dir", str(tmp_path)]) == 0
        spec = MigrationSpec.load(str(spec_path))
        build = engine.compiled(lib)
        assert build.archive is not None and build.archive.name == "engine.jsa"
        last = admin_a.get(f"{admin_a.topic_path(topic)}/lastMessageId")
        upper = Position(last["ledgerId"], last["entryId"])
        job = engine.EngineJob(topic, topic, None, None, upper, rows_file=str(tmp_path / "rows"))
        results, _ = engine.copy_many(spec, [job], spec.copy_max_in_flight)
        result = results[topic]
        assert isinstance(result, engine.EngineResult), result
        assert result.copied_messages == 200 and result.scan is not None and result.scan.hash == result.source_hash
        directory = build.jar.parent
        assert (directory / engine.FULL_ARCHIVE).is_file()
        assert sorted(p.name for p in directory.iterdir()) == ["done", "engine-full.jsa", "engine.jar", "engine.jsa",
                                                                engine.LOG_CONFIG_NAME]
        assert engine.compiled(lib).archive == directory / engine.FULL_ARCHIVE
        monkeypatch.setenv("PM_ENGINE_JAVA_OPTIONS", "-Xshare:on")
        again = engine.EngineJob(topic, topic, None, upper, upper)  # everything is there: hashed, nothing sent
        results, timings = engine.copy_many(spec, [again], spec.copy_max_in_flight)
        assert timings, "the full class archive was not used"
        rerun = results[topic]
        assert isinstance(rerun, engine.EngineResult), rerun
        assert rerun.copied_messages == 0 and rerun.source_hash == result.source_hash
    finally:
        cleanup(tenant, admin_a, admin_b)


def test_a_topic_limited_to_one_producer_takes_a_copy_that_needs_two(
    cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin, admin_b: PulsarAdmin,
    spark: SparkSession, tmp_path: Path,
) -> None:
    """The source's namespace allows one producer per topic (sync_metadata carries that): its clients took turns,
    batched then unbatched, three times. The engine sends batched and unbatched entries through a producer each
    (with identities, through one per name and schema version); the second was refused ("reached max producers
    limit") on every run. Now the drained other one is closed first (the Python path's same rule:
    tests/unit/test_sending_producer_limit.py)."""
    copy_engine = "java"
    tenant = source_tenant(admin_a, cluster_a, unique("it-maxprod"))
    topic = f"persistent://{tenant}/ns/mixed"
    admin_a.put(admin_a.topic_path(topic))
    c = client(cluster_a)
    sent = []
    for turn in range(3):
        batched = c.create_producer(topic, batching_enabled=True, batching_max_messages=10,
                                    batching_max_publish_delay_ms=20)
        for i in range(20):
            sent.append(f"b{turn}-{i}".encode())
            batched.send_async(sent[-1], None)
        batched.flush()
        batched.close()
        unbatched = c.create_producer(topic, batching_enabled=False)
        for i in range(5):
            sent.append(f"u{turn}-{i}".encode())
            unbatched.send(sent[-1])
        unbatched.close()
    c.close()
    admin_a.post(f"/namespaces/{tenant}/ns/maxProducersPerTopic", 1)
    spec = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b, options={"copy_engine": copy_engine})
    run_dir = tmp_path / "run"
    try:
        assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(run_dir)]) == 0
        assert admin_b.get(f"/namespaces/{tenant}/ns/maxProducersPerTopic") == 1
        assert step(spec, run_dir) == 0, report(run_dir).get("error")
        done = report(run_dir)
        assert done["counts"]["copied_messages"] == len(sent) and done["hashes"]["source"] == done["hashes"]["target"]
        assert {p["copy_engine"] for p in done["details"]["partitions"]} == {copy_engine}
        assert [m["data"] for m in drain(cluster_b, topic)] == sent
    finally:
        cleanup(tenant, admin_a, admin_b)


def test_an_incompressible_message_near_the_size_limit_is_copied_through_the_engine(
    cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin, admin_b: PulsarAdmin,
    spark: SparkSession, tmp_path: Path,
) -> None:
    """An unbatched uncompressed message of random bytes that fits the broker's 5 MiB on the source is too large to
    send decompressed with the two added properties' room (RECOMPRESS_ABOVE_BYTES), so the engine compresses it
    with LZ4, which makes random bytes larger: the Java client refused it ("exceeds 5242880 bytes") on every run
    (found by a review on 2026-11-29). A message the codec does not bring under the limit now goes uncompressed
    (chunked by the client only where it exceeds the broker's limit so; this one fits, one entry as at the source)."""
    import os

    tenant = source_tenant(admin_a, cluster_a, unique("it-lz4big"))
    topic = f"persistent://{tenant}/ns/random"
    admin_a.put(admin_a.topic_path(topic))
    c = client(cluster_a)
    producer = c.create_producer(topic, batching_enabled=False)
    producer.send(b"before")
    producer.send(os.urandom(5_225_000))
    producer.send(b"after")
    c.close()
    spec = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b, options={"copy_engine": "java"})
    run_dir = tmp_path / "run"
    try:
        assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(run_dir)]) == 0
        assert step(spec, run_dir) == 0, report(run_dir).get("error")
        done = report(run_dir)
        assert {p["copy_engine"] for p in done["details"]["partitions"]} == {"java"}
        assert done["counts"]["copied_messages"] == 3 and done["hashes"]["source"] == done["hashes"]["target"]
        target = drain(cluster_b, topic)
        assert content(target) == content(drain(cluster_a, topic))
        # It fits uncompressed (the room RECOMPRESS_ABOVE_BYTES keeps is a margin): one entry, as at the source.
        stored = admin_b.entry_headers(topic, *target[1]["entry"])
        assert "X-Pulsar-compression" not in stored and "X-Pulsar-num-chunks-from-msg" not in stored, stored
        assert done["counts"]["target_entries"] == done["counts"]["source_entries"] == 3
        assert step(spec, run_dir) == 0 and report(run_dir)["counts"]["copied_messages"] == 0  # a re-run: nothing
    finally:
        cleanup(tenant, admin_a, admin_b)
