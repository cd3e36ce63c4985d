"""replicate_topics on a tenant of many small topics, as platform teams have them: every partition copied and
verified in one engine process per Spark slot, empty topics and a no-op re-run judged on shared clients in a few
Spark tasks (a process or a task per partition cost seconds each at a thousand topics)."""

from __future__ import annotations

from pathlib import Path

import pulsar
from localdev.pulsar_local import LocalCluster
from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.metadata.step import run as sync_metadata
from pulsar_migration.replication import posmap
from pulsar_migration.stepjob import run_step
from pyspark.sql import SparkSession

from tests.conftest import unique
from tests.integration.replication_helpers import client, drain
from tests.integration.replication_helpers import replicate as step
from tests.integration.replication_helpers import replicate_report as report
from tests.integration.tenant_builders import drop_tenant, write_spec

NAMESPACES = ("ns0", "ns1", "ns2")
TOPICS_PER_NAMESPACE = 20
PARTITIONED = {"ns0/wide": 3, "ns2/wide": 3}


def produce(c: pulsar.Client, topic: str, count: int, tag: str) -> None:
    producer = c.create_producer(topic, batching_enabled=False)
    for i in range(count):
        producer.send_async(f"{tag}-{i}".encode(), None, partition_key=f"k{i}")
    producer.flush()
    producer.close()


def test_many_small_topics_copy_in_one_engine_process_and_a_rerun_copies_only_what_is_new(
        cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin, admin_b: PulsarAdmin,
        spark: SparkSession, tmp_path: Path) -> None:
    tenant = unique("it-many")
    admin_a.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": [cluster_a.name]})
    partitions: list[str] = []
    for ns in NAMESPACES:
        admin_a.put(f"/namespaces/{tenant}/{ns}")
        for i in range(TOPICS_PER_NAMESPACE):
            admin_a.put(f"/persistent/{tenant}/{ns}/t{i:02d}")
            partitions.append(f"persistent://{tenant}/{ns}/t{i:02d}")
    for name, count in PARTITIONED.items():
        admin_a.put(f"/persistent/{tenant}/{name}/partitions", count)
        partitions += [f"persistent://{tenant}/{name}-partition-{i}" for i in range(count)]
    filled = [p for i, p in enumerate(partitions) if i % 3]  # every third partition stays empty
    c = client(cluster_a)
    for topic in filled:
        produce(c, topic, 3, "first")
    spec = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b)
    try:
        assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(tmp_path)]) == 0
        assert step(spec, tmp_path) == 0
        first = report(tmp_path)
        assert first["counts"]["partitions"] == len(partitions) == 66
        assert first["counts"]["copied_messages"] == first["counts"]["target_messages"] == 3 * len(filled)
        parts = {p["topic"]: p for p in first["details"]["partitions"]}
        assert {t for t, p in parts.items() if p["copied_messages"]} == set(filled)
        # local[1]: one slot, so one engine process took every partition with messages.
        assert {p["copy_engine"] for t, p in parts.items() if t in filled} == {"java"}
        assert {p["engine_times"]["partitions"] for t, p in parts.items() if t in filled} == {len(filled)}
        for topic in filled[::5]:
            assert [(m["data"], m["key"]) for m in drain(cluster_b, topic)] == \
                [(m["data"], m["key"]) for m in drain(cluster_a, topic)]
        # A part file of the map per partition copied, merged into one at the end of the run; the re-runs below
        # continue from the merged map's ends.
        compaction = first["details"]["position_map_compaction"]
        assert compaction["files_merged"] >= len(filled) and compaction["rows"] == 3 * len(filled)
        assert len(posmap.part_files(str(tmp_path))) == 1

        assert step(spec, tmp_path) == 0
        again = report(tmp_path)
        assert again["counts"]["copied_messages"] == 0
        assert again["counts"]["partitions_unchanged"] == len(filled)

        newer = [filled[0], filled[-1], partitions[0]]  # two copied before, one empty until now
        for topic in newer:
            produce(c, topic, 2, "second")
        assert step(spec, tmp_path) == 0
        third = report(tmp_path)
        assert third["counts"]["copied_messages"] == third["counts"]["target_messages"] == 2 * len(newer)
        assert third["counts"]["partitions_unchanged"] == len(filled) - 2
        for topic in newer:
            assert [m["data"] for m in drain(cluster_b, topic)] == [m["data"] for m in drain(cluster_a, topic)]
        assert third["details"]["position_map_compaction"] is None  # a few new parts: left until there are more
        position_map = posmap.read_local(str(tmp_path))
        assert position_map is not None and len(position_map) == 3 * len(filled) + 2 * len(newer)
        assert set(position_map["topic"]) == set(filled) | {partitions[0]}
    finally:
        c.close()
        drop_tenant(tenant, admin_a, admin_b)
