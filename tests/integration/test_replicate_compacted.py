"""replicate_topics on a compacted topic whose ledgers were trimmed after the compaction (no retention, no
subscription behind them): the compacted ledger alone holds each key's last message from before the source's first
stored entry. A reader of the topic itself starts at that entry, so until 2026-11-27 the copy left those messages
out on both sides' hashes and the target's table lost every key not written again since, with verdict ok. The
copy engine now reads that part of the range through the compacted view; the Python path fails it in one line,
and geo mode refuses it before turning anything on.
"""

from __future__ import annotations

import time
from pathlib import Path

import pulsar
from localdev.pulsar_local import LocalCluster
from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.metadata.step import run as sync_metadata
from pulsar_migration.replication.geo import compacted_view_before
from pulsar_migration.replication.partition import compacted_gap
from pulsar_migration.spec import MigrationSpec
from pulsar_migration.stepjob import run_step

from tests.conftest import unique
from tests.integration.replication_helpers import client, create_topics, source_tenant
from tests.integration.replication_helpers import replicate as step
from tests.integration.replication_helpers import replicate_report as report
from tests.integration.tenant_builders import write_spec
from tests.integration.test_copy_chunked_engine import neighbours_runs
from tests.integration.test_replicate_topics import cleanup


def produce(cluster: LocalCluster, topic: str, round_: int, keys: int = 10) -> None:
    """Two values of every key: unbatched for the first half of the keys, in batches of 4 for the other half (a
    compaction keeps a batch's surviving messages in their places)."""
    c = client(cluster)
    try:
        plain = c.create_producer(topic, batching_enabled=False)
        batched = c.create_producer(topic, batching_enabled=True, batching_max_messages=4,
                                    batching_max_publish_delay_ms=1000)
        for value in (1, 2):
            for k in range(keys):
                producer = plain if k < keys // 2 else batched
                producer.send_async(f"k{k}=r{round_}v{value}".encode(), None, partition_key=f"k{k}")
            plain.flush()
            batched.flush()
    finally:
        c.close()


def compact(admin: PulsarAdmin, topic: str) -> None:
    path = admin.topic_path(topic)
    admin.put(f"{path}/compaction")
    deadline = time.monotonic() + 60
    while admin.get(f"{path}/compaction").get("status") == "RUNNING":
        assert time.monotonic() < deadline, "compaction did not finish"
        time.sleep(0.3)
    assert admin.get(f"{path}/compaction").get("status") == "SUCCESS"


def compact_and_trim(admin: PulsarAdmin, topic: str, cluster: LocalCluster, tail: bytes) -> None:
    """Compacts the topic, rolls its ledger (an unload) and stores `tail` in the new one, then trims the ledgers
    every cursor (the compaction's alone) has passed."""
    path = admin.topic_path(topic)
    compact(admin, topic)
    admin.put(f"{path}/unload")
    c = client(cluster)
    try:
        c.create_producer(topic, batching_enabled=False).send(tail, partition_key=tail.decode().split("=")[0])
    finally:
        c.close()
    admin.post(f"{path}/trim")


def view(cluster: LocalCluster, topic: str, compacted: bool) -> list[tuple[bytes, bool]]:
    """(payload, batched) of every message a reader of the topic (or of its compacted view) gets."""
    c = client(cluster)
    try:
        reader = c.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=compacted)
        out = []
        while reader.has_message_available():
            m = reader.read_next(10_000)
            out.append((m.data(), m.message_id().batch_index() >= 0))
        return out
    finally:
        c.close()


def table(messages: list[tuple[bytes, bool]]) -> dict[str, str]:
    """What a table view of the topic holds: each key's last value. (The C++ client gives the places a compaction
    left in a batch as empty messages; the Java client skips them.)"""
    return dict(m.decode().split("=", 1) for m, _ in messages if m)


def test_a_compacted_topic_whose_ledgers_were_trimmed_keeps_its_table_on_the_target(
    cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin, admin_b: PulsarAdmin, tmp_path: Path,
) -> None:
    tenant = source_tenant(admin_a, cluster_a, unique("it-compacted"))
    topic, python_topic = f"persistent://{tenant}/ns/table", f"persistent://{tenant}/ns/python"
    kept = f"persistent://{tenant}/ns/kept"  # compacted, nothing trimmed
    create_topics(admin_a, topic, python_topic, kept)
    try:
        for t in (topic, python_topic):
            produce(cluster_a, t, 1)
            compact_and_trim(admin_a, t, cluster_a, b"k0=r1tail")
        produce(cluster_a, kept, 1)
        compact(admin_a, kept)
        compacted = view(cluster_a, topic, compacted=True)
        assert len(compacted) == 11 and sum(b for _, b in compacted) == 5  # the premise: all the view holds
        assert view(cluster_a, topic, compacted=False) == [(b"k0=r1tail", False)]

        spec = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b, topics={"include": ["ns/table"]})
        assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(tmp_path)]) == 0
        assert step(spec, tmp_path / "run") == 0
        part = report(tmp_path / "run")["details"]["partitions"][0]
        assert part["copy_engine"] == "java" and part["compacted_messages"] == 10, part
        assert part["copied_messages"] == part["source_messages"] == part["target_messages"] == 11
        assert report(tmp_path / "run")["counts"]["compacted_messages"] == 10
        # Every message in its place, a batch kept as a batch; the Java client (which skips the places a compaction
        # left in a batch) reads the target as the source's compacted view.
        assert view(cluster_b, topic, compacted=False) == compacted
        java_source, java_target = ([seen for _, seen in read] for read in neighbours_runs(
            [["read-compacted", cluster_a.service_url, topic], ["read", cluster_b.service_url, topic]]))
        assert len(java_source) == 11 and java_source == java_target

        # Again after another round, compaction and trim: the range from the first run's end is read through the
        # view (what the compaction kept of it), and the target's table is the source's.
        produce(cluster_a, topic, 2, keys=6)
        compact_and_trim(admin_a, topic, cluster_a, b"k1=r2tail")
        assert step(spec, tmp_path / "run") == 0
        part = report(tmp_path / "run")["details"]["partitions"][0]
        assert part["status"] == "ok" and part["compacted_messages"] == 6, part
        assert table(view(cluster_b, topic, compacted=False)) == table(view(cluster_a, topic, compacted=True))
        assert step(spec, tmp_path / "run") == 0  # a re-run copies nothing
        assert report(tmp_path / "run")["counts"]["copied_messages"] == 0

        # The Python path reads no compacted view: one line, where it lost the table with verdict ok.
        python = write_spec(tmp_path / "python.json", tenant, cluster_a, cluster_b,
                            topics={"include": ["ns/python"]}, options={"copy_engine": "python"})
        assert run_step("sync_metadata", sync_metadata, ["--spec", str(python), "--run-dir", str(tmp_path)]) == 0
        assert step(python, tmp_path / "python") == 1
        errors = [p["error"] for p in report(tmp_path / "python")["details"]["partitions"] if p["error"]]
        assert len(errors) == 1 and "only in its compacted ledger" in errors[0], errors

        # Nor does geo-replication carry them: refused before anything is turned on (retention set, as geo needs).
        admin_a.post(f"/namespaces/{tenant}/ns/retention", {"retentionTimeInMinutes": 60, "retentionSizeInMB": 64})
        geo = write_spec(tmp_path / "geo.json", tenant, cluster_a, cluster_b, topics={"include": ["ns/python"]},
                         replication={"mode": "geo"})
        assert step(geo, tmp_path / "geo") == 1
        error = report(tmp_path / "geo")["error"]
        assert "only in their compacted ledger" in error and "copy mode" in error, error
        assert cluster_b.name not in admin_a.get(f"/namespaces/{tenant}/ns/replication")  # nothing turned on
        # A compacted topic whose ledgers are all kept is not refused (every compacted one was, until 2026-11-29):
        # only a compacted view beginning before the first stored entry holds what no ledger does.
        loaded = MigrationSpec.load(str(geo))
        for name, lost in ((kept, False), (python_topic, True)):
            first = compacted_gap(admin_a, name, None)
            assert first is not None, name  # a compaction ran on both
            assert compacted_view_before(loaded, name, first) is lost, name
    finally:
        cleanup(tenant, admin_a, admin_b)
