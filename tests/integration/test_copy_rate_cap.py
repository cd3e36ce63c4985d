"""options.copy_max_mb_per_s on real clusters: a capped copy reads the source no faster than the cap, through the
Java engine and through the Python path, and stays exact (counts, hashes, entries: the step's own verification,
then a plain reader of the target)."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pulsar
import pytest
from localdev.pulsar_local import LocalCluster
from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.metadata.step import run as sync_metadata
from pulsar_migration.positions import Position
from pulsar_migration.replication import engine
from pulsar_migration.spec import MigrationSpec
from pulsar_migration.stepjob import run_step
from pulsar_migration.throttle import BURST_S, Caps
from pyspark.sql import SparkSession

from tests.conftest import unique
from tests.integration.replication_helpers import client, drain, source_tenant
from tests.integration.replication_helpers import replicate as step
from tests.integration.replication_helpers import replicate_report as report
from tests.integration.tenant_builders import write_spec

MESSAGE = 1024


def produce(c: pulsar.Client, topic: str, count: int) -> None:
    producer = c.create_producer(topic, batching_enabled=True, batching_max_messages=100, block_if_queue_full=True)
    for i in range(count):
        producer.send_async(i.to_bytes(4, "big") * (MESSAGE // 4), None, partition_key=f"k{i % 7}")
    producer.flush()
    producer.close()


def capped_copy(cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin, tmp_path: Path,
                partitions: int, messages: int, options: dict[str, Any]) -> tuple[dict[str, Any], str]:
    tenant = source_tenant(admin_a, cluster_a, unique("it-cap"))
    topic = f"persistent://{tenant}/ns/capped"
    if partitions:
        admin_a.put(f"/persistent/{tenant}/ns/capped/partitions", partitions)
    c = client(cluster_a)
    try:
        produce(c, topic, messages)
    finally:
        c.close()
    stats = admin_a.get(f"/persistent/{tenant}/ns/capped/partitioned-stats" if partitions
                        else f"/persistent/{tenant}/ns/capped/stats")
    assert stats["msgInCounter"] == messages
    spec = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b, options=options)
    assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(tmp_path)]) == 0
    # A dry run first: what the cap means for the run's length, nothing held back, nothing written.
    assert step(spec, tmp_path / "dry", "--dry-run") == 0
    planned = report(tmp_path / "dry")
    by_bytes, by_messages = options.get("copy_max_mb_per_s"), options.get("copy_max_msgs_per_s")
    assert planned["details"]["throttle"]["held_back_s"] == 0
    # The source's intake as its brokers last computed it (nothing produces now: no warning).
    assert planned["details"]["throttle"]["source_in_mb_per_s"] >= 0 and "warning" not in planned["details"]["throttle"]
    assert planned["details"]["throttle"]["least_copy_s"] == round(max(
        messages * MESSAGE / (by_bytes * 1e6) if by_bytes else 0, messages / by_messages if by_messages else 0), 1)
    assert step(spec, tmp_path) == 0
    return report(tmp_path), topic


def assert_capped(done: dict[str, Any], cap_mb: float, copy_s: float) -> None:
    copied = done["counts"]["copied_bytes"]
    assert done["counts"]["copied_messages"] == done["counts"]["target_messages"] == done["counts"]["source_messages"]
    assert done["counts"]["target_entries"] == done["counts"]["source_entries"]
    assert done["details"]["throttle"]["max_mb_per_s"] == cap_mb
    assert done["details"]["throttle"]["held_back_s"] > 0
    # No faster than the cap allows after its first burst (with 2% for the clocks).
    least_s = (copied - cap_mb * 1e6 * BURST_S) / (cap_mb * 1e6)
    assert copy_s >= 0.98 * least_s, (copy_s, least_s, copied)


def test_the_engine_keeps_a_two_partition_copy_under_the_cap_and_exact(
        cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin, spark: SparkSession,
        tmp_path: Path) -> None:
    # 4 MB across two partitions at 1.5 MB/s: at least 2.5 s, where the engine alone copies it in well under one.
    done, topic = capped_copy(cluster_a, cluster_b, admin_a, tmp_path, 2, 4000,
                              {"copy_max_mb_per_s": 1.5, "copy_engine": "java"})
    assert done["counts"]["copied_bytes"] == 4000 * MESSAGE
    rows = done["details"]["partitions"]
    assert {row["copy_engine"] for row in rows} == {"java"}
    assert done["details"]["throttle"]["engine_process"] == {"max_mb_per_s": 1.5}  # two partitions: one process
    # The partitions copy at once and share the process's part: the run lasts as long as its longest partition.
    assert_capped(done, 1.5, max(row["engine_times"]["partition_copy_s"] for row in rows))
    for index in range(2):
        source, target = drain(cluster_a, f"{topic}-partition-{index}"), drain(cluster_b, f"{topic}-partition-{index}")
        assert [(m["data"], m["key"]) for m in target] == [(m["data"], m["key"]) for m in source]


def test_the_python_path_keeps_to_the_cap_and_a_rerun_copies_nothing(
        cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin, spark: SparkSession,
        tmp_path: Path) -> None:
    # 0.6 MB at 0.25 MB/s: at least 2 s.
    done, topic = capped_copy(cluster_a, cluster_b, admin_a, tmp_path, 0, 600,
                              {"copy_max_mb_per_s": 0.25, "copy_engine": "python"})
    assert done["counts"]["copied_bytes"] == 600 * MESSAGE
    (row,) = done["details"]["partitions"]
    assert row["copy_engine"] == "python" and row["throttled_s"] > 0
    assert done["details"]["throttle"]["python_task"] == {"max_mb_per_s": 0.25}
    assert_capped(done, 0.25, row["copy_s"])
    assert [m["data"] for m in drain(cluster_b, topic)] == [m["data"] for m in drain(cluster_a, topic)]
    spec = tmp_path / "spec.json"
    assert step(spec, tmp_path) == 0
    assert report(tmp_path)["counts"]["copied_messages"] == 0


def test_an_engine_process_alone_keeps_to_its_part_and_logs_its_progress(
        cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin, spark: SparkSession, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """The engine's own bucket, without Spark: one process given 1 MB/s copies 3 MB of one partition in no less
    than 2.8 s, exactly, and says how far it got every second (options.progress_interval_s)."""
    tenant = source_tenant(admin_a, cluster_a, unique("it-cap-engine"))
    topic = f"persistent://{tenant}/ns/capped"
    c = client(cluster_a)
    try:
        produce(c, topic, 3000)
    finally:
        c.close()
    spec_path = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b, options={"progress_interval_s": 1})
    assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec_path), "--run-dir", str(tmp_path)]) == 0
    spec = MigrationSpec.load(str(spec_path))
    last = admin_a.get(f"{admin_a.topic_path(topic)}/lastMessageId")
    job = engine.EngineJob(topic, topic, None, None, Position(last["ledgerId"], last["entryId"]),
                           rows_file=str(tmp_path / "rows"))
    with caplog.at_level(logging.INFO, logger="pulsar_migration.replication.engine"):
        results, _ = engine.EngineProcess(spec, spec.copy_max_in_flight, caps=Caps(1e6)).run([job])
    result = results[topic]
    assert isinstance(result, engine.EngineResult), result
    assert result.copied_bytes == 3000 * MESSAGE and result.copied_messages == 3000
    assert result.scan is not None and result.scan.hash == result.source_hash and result.scan.shape_errors == 0
    assert result.copy_s >= 0.98 * (3000 * MESSAGE - BURST_S * 1e6) / 1e6
    assert result.throttle_wait_s > 1
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("copy engine progress")]
    assert len(lines) >= 2, lines
    copied = [float(re.search(r"entries, ([\d.,]+) MB copied", line).group(1).replace(",", "")) for line in lines]
    assert copied == sorted(copied) and 0 < copied[-1] <= round(3000 * MESSAGE / 1e6, 1), lines  # MB to 0.1


def test_a_message_cap_holds_the_engine_to_its_messages_per_second(
        cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin, spark: SparkSession,
        tmp_path: Path) -> None:
    # 1,500 messages (batches of 100) at 500 a second: at least 2.8 s after the first burst of 100.
    done, _ = capped_copy(cluster_a, cluster_b, admin_a, tmp_path, 0, 1500,
                          {"copy_max_msgs_per_s": 500, "copy_engine": "java"})
    (row,) = done["details"]["partitions"]
    assert row["copy_engine"] == "java" and row["throttled_s"] > 0
    assert done["details"]["throttle"]["max_msgs_per_s"] == 500 and "max_mb_per_s" not in done["details"]["throttle"]
    assert done["counts"]["copied_messages"] == done["counts"]["target_messages"] == 1500
    assert row["engine_times"]["partition_copy_s"] >= 0.98 * (1500 - 500 * BURST_S) / 500
