"""replicate_topics in geo mode against the real cluster pair: Pulsar's replicator brings a historical backlog
(batched and unbatched, keys, properties) to the target; the step pairs and maps it, and a re-run maps only
what arrived since. Judged by reading both sides with the plain Python client, not the library's hashing."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from localdev.pulsar_local import LocalCluster
from pulsar_migration.admin import NotFound, PulsarAdmin
from pulsar_migration.metadata.step import run as sync_metadata
from pulsar_migration.replication.posmap import POSITION_MAP_DATASET
from pulsar_migration.replication.step import enable_deduplication_on
from pulsar_migration.spec import MigrationSpec
from pulsar_migration.stepjob import run_step
from pulsar_migration.switch.geo_dedup import last_sequence_ids, teach_target
from pyspark.sql import SparkSession

from tests.conftest import unique
from tests.integration.replication_helpers import GEO_PROPERTY, client, drain
from tests.integration.replication_helpers import replicate as step
from tests.integration.replication_helpers import replicate_report as report
from tests.integration.tenant_builders import drop_tenant, write_spec

log = logging.getLogger(__name__)



def produce(cluster: LocalCluster, topics: list[str], tag: str, unbatched: int, batches: list[int]) -> int:
    """Per partition: `unbatched` single messages, then one batch per size in `batches`; returns the entries
    written per partition. Keys, properties and event times vary per message."""
    c = client(cluster)
    try:
        for topic in topics:
            single = c.create_producer(topic, batching_enabled=False)
            for i in range(unbatched):
                single.send(f"{tag}-u{i}-{topic}".encode(), partition_key=f"k{i % 3}",
                            properties={"round": tag, "i": str(i)}, event_timestamp=1_700_000_000_000 + i)
            batching = c.create_producer(topic, batching_enabled=True, batching_max_messages=1000,
                                         batching_max_publish_delay_ms=60_000, block_if_queue_full=True)
            for b, size in enumerate(batches):
                for i in range(size):
                    batching.send_async(f"{tag}-b{b}-{i}".encode(), None, partition_key=f"bk{b}",
                                        properties={"round": tag, "batch": str(b), "i": str(i)})
                batching.flush()  # closes the batch here: one entry of `size` messages
            single.close()
            batching.close()
    finally:
        c.close()
    return unbatched + len(batches)


def content(messages: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(m["data"], m["key"], m["event_time"], sorted(m["props"].items()), m["batch_index"]) for m in messages]


def entry_count(messages: list[dict[str, Any]]) -> int:
    return len({m["entry"] for m in messages})


def cursor_mark(admin: PulsarAdmin, topic: str, target: str) -> tuple[int, int]:
    cursors = admin.get(f"{admin.topic_path(topic)}/internalStats")["cursors"]
    ledger, entry = cursors[f"pulsar.repl.{target}"]["markDeletePosition"].split(":")
    return int(ledger), int(entry)


def teardown(tenant: str, admin_a: PulsarAdmin, admin_b: PulsarAdmin, source: str) -> None:
    """Deletes the test tenant on both clusters. Each side's namespaces are set back to replicate to their own
    cluster only first (a namespace replicating elsewhere cannot be deleted; after a geo-mode rollback the target's
    replicate back too); each cluster has its own configuration store, so that change removes only that side's
    replicators and deletes nothing on the other. Deleting topics while the broker still deletes their replicator
    cursors left them fenced for good on 4.0.8 (HTTP 500 "Topic is already fenced" until a broker restart): wait
    for the cursors to go first."""
    for admin, own in ((admin_a, source), (admin_b, admin_b.name)):
        replicate_to_itself(tenant, admin, own)
    drop_tenant(tenant, admin_a, admin_b)


def replicate_to_itself(tenant: str, admin: PulsarAdmin, own: str) -> None:
    try:
        namespaces = admin.get(f"/namespaces/{tenant}")
    except NotFound:
        namespaces = []
    for full in namespaces:
        if admin.get(f"/namespaces/{full}/replication") in ([own], []):
            continue
        admin.post(f"/namespaces/{full}/replication", [own])
        deadline = time.monotonic() + 30
        for topic in admin.get(f"/persistent/{full}", params={"includeSystemTopic": "true"}):
            while time.monotonic() < deadline and any(
                    name.startswith("pulsar.repl.")
                    for name in admin.get(f"{admin.topic_path(topic)}/internalStats")["cursors"]):
                time.sleep(0.2)


@pytest.fixture
def geo_tenant(cluster_a: LocalCluster, admin_a: PulsarAdmin, admin_b: PulsarAdmin) -> Iterator[str]:
    tenant = unique("it-geo")
    admin_a.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": [cluster_a.name]})
    admin_a.put(f"/namespaces/{tenant}/ns")
    admin_a.put(f"/persistent/{tenant}/ns/orders/partitions", 2)
    admin_a.put(f"/persistent/{tenant}/ns/audit")
    try:
        yield tenant
    finally:
        teardown(tenant, admin_a, admin_b, cluster_a.name)


def test_geo_replicates_backlog_then_maps_only_new_entries(
    geo_tenant: str, spark: SparkSession, cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin,
    admin_b: PulsarAdmin, tmp_path: Path,
) -> None:
    tenant = geo_tenant
    topics = [f"persistent://{tenant}/ns/orders-partition-0", f"persistent://{tenant}/ns/orders-partition-1",
              f"persistent://{tenant}/ns/audit"]
    # The historical backlog, written before replication exists: 5 unbatched + 3 batches (4, 1, 6 messages).
    first_entries = produce(cluster_a, topics, "r1", 5, [4, 1, 6])
    spec = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b, replication={"mode": "geo"},
                      options={"geo_timeout_s": 120})
    run_dir = tmp_path / "run"
    assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(run_dir)]) == 0

    # A dry run plans from the source and turns nothing on.
    assert step(spec, tmp_path / "dry", "--dry-run") == 0
    assert report(tmp_path / "dry")["verdict"] == "planned"
    # Without retention the source trims what every cursor passed, the replicator's too (the unload's ledger
    # roll does it at once): nothing would be left to verify against, so the step refuses up front.
    assert step(spec, tmp_path / "no-retention") == 1
    assert "retention" in report(tmp_path / "no-retention")["error"]
    assert admin_a.get(f"/namespaces/{tenant}/ns/replication") == [cluster_a.name]
    assert "pulsar.repl.cluster-b" not in admin_a.get(f"{admin_a.topic_path(topics[2])}/internalStats")["cursors"]
    admin_a.post(f"/namespaces/{tenant}/ns/retention", {"retentionTimeInMinutes": 60, "retentionSizeInMB": 64})

    assert step(spec, run_dir) == 0
    first = report(run_dir)
    geo = first["details"]["geo"]
    log.info("geo run 1: prepare %ss; after the policy change: unload %ss, first arrival %ss, caught up %ss",
             geo["prepare_s"], geo["unload_after_s"], geo["first_arrival_s"], geo["wait_s"])
    counts = first["counts"]
    assert first["verdict"] == "ok" and first["details"]["mode"] == "geo"
    assert counts["partitions"] == 3 and counts["partitions_failed"] == 0
    assert counts["source_entries"] == counts["target_entries"] == counts["mapped_entries"] == 3 * first_entries
    assert counts["source_messages"] == counts["target_messages"] == 3 * (5 + 4 + 1 + 6)
    assert first["hashes"]["source"] == first["hashes"]["target"]
    assert geo["namespaces_changed"] == ["ns"] and sorted(geo["cursors_created"]) == sorted(topics)
    assert sorted(geo["partitions_unloaded"]) == sorted(topics)
    # Clusters were only added on the source; the target namespace still replicates to itself only.
    assert sorted(admin_a.get(f"/namespaces/{tenant}/ns/replication")) == sorted([cluster_a.name, cluster_b.name])
    assert admin_b.get(f"/namespaces/{tenant}/ns/replication") == [cluster_b.name]

    # A second implementation: both sides read with a plain reader hold the same messages in the same entries.
    sources = {t: drain(cluster_a, t) for t in topics}
    targets = {t: drain(cluster_b, t) for t in topics}
    for topic in topics:
        assert content(targets[topic]) == content(sources[topic]), topic
        assert entry_count(targets[topic]) == first_entries
        assert [m["origin"] for m in targets[topic] if m["batch_index"] < 0] == \
            [f"{m['entry'][0]}:{m['entry'][1]}" for m in sources[topic] if m["batch_index"] < 0]

    rows = spark.read.parquet(str(run_dir / POSITION_MAP_DATASET)).collect()
    assert len(rows) == 3 * first_entries
    assert {r.mode for r in rows} == {"geo"}
    assert len({(r.topic, r.target_ledger, r.target_entry) for r in rows}) == len(rows)
    # Sampled rows, one batched and one unbatched: the entries they name hold the same messages on both sides,
    # and the target entry's metadata names the source entry.
    by_entry = {(t, side): {} for t in topics for side in ("s", "t")}
    for topic in topics:
        for side, messages in (("s", sources[topic]), ("t", targets[topic])):
            for m in messages:
                by_entry[(topic, side)].setdefault(m["entry"], []).append(m)
    for batched in (True, False):
        row = next(r for r in rows if r.source_batched is batched and r.topic == topics[1])
        src = by_entry[(row.topic, "s")][(row.source_ledger, row.source_entry)]
        tgt = by_entry[(row.topic, "t")][(row.target_ledger, row.target_entry)]
        assert content(tgt) == content(src) and len(src) == row.source_messages == row.target_messages
        headers = admin_b.entry_headers(row.topic, row.target_ledger, row.target_entry)
        assert json.loads(headers["X-Pulsar-PROPERTY"])[GEO_PROPERTY] == f"{row.source_ledger}:{row.source_entry}"
        assert headers["X-Pulsar-replicated-from"] == cluster_a.name
    marks = {t: cursor_mark(admin_a, t, cluster_b.name) for t in topics}

    # More messages after the first run: live replication carries them, the re-run verifies and maps only them.
    second_entries = produce(cluster_a, topics, "r2", 2, [3])
    assert step(spec, run_dir) == 0
    second = report(run_dir)
    geo2 = second["details"]["geo"]
    log.info("geo run 2: prepare %ss, caught up %ss", geo2["prepare_s"], geo2["wait_s"])
    counts = second["counts"]
    assert second["verdict"] == "ok"
    assert counts["source_entries"] == counts["target_entries"] == counts["mapped_entries"] == 3 * second_entries
    assert counts["source_messages"] == counts["target_messages"] == 3 * (2 + 3)
    assert second["hashes"]["source"] == second["hashes"]["target"]
    assert (geo2["namespaces_changed"], geo2["cursors_created"], geo2["partitions_unloaded"]) == ([], [], [])
    for topic in topics:  # the replicator's cursor never went backwards
        assert cursor_mark(admin_a, topic, cluster_b.name) >= marks[topic]
        assert content(drain(cluster_b, topic)) == content(drain(cluster_a, topic)), topic

    rows2 = spark.read.parquet(str(run_dir / POSITION_MAP_DATASET)).collect()
    assert len(rows2) == 3 * (first_entries + second_entries)
    assert len({(r.topic, r.target_ledger, r.target_entry) for r in rows2}) == len(rows2)
    assert len({(r.topic, r.source_ledger, r.source_entry) for r in rows2}) == len(rows2)
    old = {(r.topic, r.target_ledger, r.target_entry) for r in rows}
    for topic in topics:
        new = [r for r in rows2 if r.topic == topic and (r.topic, r.target_ledger, r.target_entry) not in old]
        assert len(new) == second_entries
        last_old = max((r.source_ledger, r.source_entry) for r in rows if r.topic == topic)
        assert all((r.source_ledger, r.source_entry) > last_old for r in new)

    # Something on the target that did not come from the source breaks the 1:1 pairing: the step fails, names
    # the partition, and maps nothing for it.
    c = client(cluster_b)
    try:
        c.create_producer(topics[2]).send(b"written on the target")
    finally:
        c.close()
    produce(cluster_a, topics, "r3", 1, [])
    assert step(spec, run_dir) == 1
    third = report(run_dir)
    assert third["verdict"] == "failed" and third["counts"]["partitions_failed"] == 1
    assert third["details"]["failures"][0]["topic"] == topics[2]
    failed = next(p for p in third["details"]["partitions"] if p["topic"] == topics[2])
    assert any("was not replicated" in problem for problem in failed["problems"]), failed["problems"]
    rows3 = spark.read.parquet(str(run_dir / POSITION_MAP_DATASET)).collect()
    assert len(rows3) == len(rows2) + 2 and not [r for r in rows3 if r.topic == topics[2] and r not in rows2]

    # The target's dedup and replicated producers (switch.geo_dedup). A producer on the source whose receipt the
    # switch's fence cut off re-sends to the target after the flip; the live target recorded the replicated copy
    # by source position only, so it would store the re-send again. A reload replays the entries under their
    # producers' own names; then the re-send is dropped and the next message stored once.
    resender, topic = "it-geo-resender", topics[0]
    pairs = [(topic, resender)]
    parsed = MigrationSpec.load(str(spec))
    enable_deduplication_on(admin_a, parsed, ["ns"], [topic])  # as the switch's source_dedup phase does
    c = client(cluster_a)
    try:
        producer = c.create_producer(topic, producer_name=resender, batching_enabled=False)
        for i in (1, 2, 3):
            producer.send(f"resend-{i}".encode(), sequence_id=i)
        producer.close()
    finally:
        c.close()
    deadline = time.monotonic() + 60
    while [m["data"] for m in drain(cluster_b, topic)][-3:] != [b"resend-1", b"resend-2", b"resend-3"]:
        assert time.monotonic() < deadline, "the replicator did not carry the three messages"
        time.sleep(0.5)
    assert last_sequence_ids(parsed.source_cluster, pairs) == {pairs[0]: 3}
    assert last_sequence_ids(parsed.target_cluster, pairs) == {pairs[0]: -1}  # not learned from replication
    taught = teach_target(parsed, admin_b, {topic: [resender]})
    assert (taught["partitions"], taught["producers"], taught["sequence_ids_known"]) == (1, 1, 1)
    assert last_sequence_ids(parsed.target_cluster, pairs) == {pairs[0]: 3}
    before = drain(cluster_b, topic)
    c = client(cluster_b)
    try:
        producer = c.create_producer(topic, producer_name=resender, batching_enabled=False)
        producer.send(b"resend-3", sequence_id=3)  # the re-send: dropped
        producer.send(b"resend-4", sequence_id=4)  # new: stored once
        producer.close()
    finally:
        c.close()
    assert [m["data"] for m in drain(cluster_b, topic)] == [m["data"] for m in before] + [b"resend-4"]


def test_geo_carries_a_message_chunked_small_and_names_chunks_at_the_full_size_it_drops(
    geo_tenant: str, spark: SparkSession, cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin,
    tmp_path: Path,
) -> None:
    """Pulsar's replicator (4.0.8) on chunked messages: a message in 10 KB chunks arrives whole; of one whose chunks
    are at the broker's 5 MB limit (a chunking producer's default) only the last chunk arrives, so no reader on the
    target delivers it. The step fails that partition in one line that names the chunked message and copy mode
    (it said only "entries dropped on the target?")."""
    from tests.integration.test_copy_chunked_engine import split_chunk_parts

    tenant = geo_tenant
    small, full = f"persistent://{tenant}/ns/audit", f"persistent://{tenant}/ns/orders-partition-0"
    c = client(cluster_a)
    try:
        for topic in (small, full):
            producer = c.create_producer(topic, batching_enabled=False, chunking_enabled=True)
            producer.send(b"before")
            if topic == small:
                split_chunk_parts(["first", "rest"], cluster_a.service_url, topic, "geo-small", "6", "3", "60000",
                                  "0123456789")
            else:
                producer.send(b"F" * (6 * 1024 * 1024))
            producer.send(b"after")
    finally:
        c.close()
    admin_a.post(f"/namespaces/{tenant}/ns/retention", {"retentionTimeInMinutes": 60, "retentionSizeInMB": 64})
    spec = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b, replication={"mode": "geo"},
                      options={"geo_timeout_s": 180})  # the failing partitions end through the settle
    assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(tmp_path)]) == 0
    assert step(spec, tmp_path / "run") == 1
    parts = {p["topic"]: p for p in report(tmp_path / "run")["details"]["partitions"]}
    assert parts[small]["status"] == "ok" and parts[small]["target_messages"] == 3
    assert content(drain(cluster_b, small)) == content(drain(cluster_a, small))
    assert parts[full]["status"] == "failed"
    assert "the source holds 1 chunked message(s)" in parts[full]["error"], parts[full]["error"]
    assert "replication.mode copy" in parts[full]["error"]


def test_geo_names_messages_their_producer_kept_from_other_clusters(
    geo_tenant: str, spark: SparkSession, cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin,
    tmp_path: Path,
) -> None:
    """A producer can keep a message from other clusters (`disable_replication`, or `replication_clusters` without
    the target): every reader of the source gets it, Pulsar's replicator never sends it. The step fails that
    partition in one line that names such entries and copy mode (it said "entries dropped on the target?"); a
    partition without them is replicated as usual."""
    tenant = geo_tenant
    kept, plain = f"persistent://{tenant}/ns/audit", f"persistent://{tenant}/ns/orders-partition-0"
    c = client(cluster_a)
    try:
        for topic in (kept, plain):
            producer = c.create_producer(topic, batching_enabled=False)
            producer.send(b"before")
            if topic == kept:
                producer.send(b"local only", disable_replication=True)
                producer.send(b"source cluster only", replication_clusters=[cluster_a.name])
            producer.send(b"after")
            producer.close()
    finally:
        c.close()
    admin_a.post(f"/namespaces/{tenant}/ns/retention", {"retentionTimeInMinutes": 60, "retentionSizeInMB": 64})
    assert [m["data"] for m in drain(cluster_a, kept)] == [b"before", b"local only", b"source cluster only",
                                                            b"after"]  # what the source's readers get
    spec = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b, replication={"mode": "geo"},
                      options={"geo_timeout_s": 180})  # the failing partitions end through the settle
    assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(tmp_path)]) == 0
    assert step(spec, tmp_path / "run") == 1
    parts = {p["topic"]: p for p in report(tmp_path / "run")["details"]["partitions"]}
    assert [m["data"] for m in drain(cluster_b, kept)] == [b"before", b"after"]
    error = parts[kept]["error"]
    assert parts[kept]["status"] == "failed" and "\n" not in error
    assert "2 source entries are marked by the producer for other clusters only" in error, error
    assert "replicated-to __local__" in error and "replication.mode copy" in error and "dropped" not in error
    assert parts[plain]["status"] == "ok" and content(drain(cluster_b, plain)) == content(drain(cluster_a, plain))
