"""One engine process over many partitions in a small heap (real brokers, no Spark): a partition's copy that ended
must not stay in memory to the round's end. Each holds a 1 MiB send-time ring and its hash buffers; kept for the
progress lines, the 607 partitions of one engine process of a 1000-topic tenant ran its 512 MB heap out (817 of
1214 partitions failed). Here 200 partitions in a 48 MB heap: about 1.2 MB each kept would need five times that."""

from __future__ import annotations

from pathlib import Path

import pytest
from localdev.pulsar_local import LocalCluster
from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.metadata.step import run as sync_metadata
from pulsar_migration.positions import Position
from pulsar_migration.replication import engine
from pulsar_migration.spec import MigrationSpec
from pulsar_migration.stepjob import run_step

from tests.conftest import unique
from tests.integration.replication_helpers import client, source_tenant
from tests.integration.tenant_builders import write_spec
from tests.integration.test_replicate_topics import cleanup

PARTITIONS = 200


def test_an_engine_process_copies_many_partitions_in_a_small_heap(
        cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin, admin_b: PulsarAdmin,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tenant = source_tenant(admin_a, cluster_a, unique("it-engine-heap"))
    topic = f"persistent://{tenant}/ns/many"
    admin_a.put(f"/persistent/{tenant}/ns/many/partitions", PARTITIONS)
    c = client(cluster_a)
    try:
        for i in range(PARTITIONS):
            producer = c.create_producer(f"{topic}-partition-{i}", batching_enabled=False)
            producer.send(f"m-{i}".encode())
            producer.close()
    finally:
        c.close()
    spec_path = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b, options={"progress_interval_s": 1})
    try:
        assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec_path), "--run-dir", str(tmp_path)]) == 0
        spec = MigrationSpec.load(str(spec_path))
        jobs = []
        for i in range(PARTITIONS):
            part = f"{topic}-partition-{i}"
            last = admin_a.get(f"{admin_a.topic_path(part)}/lastMessageId")
            jobs.append(engine.EngineJob(part, topic, None, None, Position(last["ledgerId"], last["entryId"]),
                                         rows_file=str(tmp_path / f"{i}.rows"), receiver_queue=10))
        monkeypatch.setenv("PM_ENGINE_JAVA_OPTIONS", "-Xmx48m")  # after the defaults: this heap it is
        results, _ = engine.EngineProcess(spec, spec.copy_max_in_flight).run(jobs)
        failed = {t: r for t, r in results.items() if not isinstance(r, engine.EngineResult)}
        assert not failed, f"{len(failed)} of {PARTITIONS} failed, first: {next(iter(failed.items()))}"
        assert sum(r.copied_messages for r in results.values()) == PARTITIONS  # type: ignore[union-attr]
        assert all(r.scan is not None and r.scan.hash == r.source_hash for r in results.values())  # type: ignore[union-attr]
    finally:
        cleanup(tenant, admin_a, admin_b)
