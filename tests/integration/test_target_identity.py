"""A target partition that is not the one the position map describes (real brokers, read with the plain client):
one whose consumed ledgers were trimmed is still it and the copy goes on from the map's end; one deleted and
created again since (empty) is not, and the run says so instead of copying only the map's tail into it."""

from __future__ import annotations

from pathlib import Path

import pytest
from localdev.pulsar_local import LocalCluster
from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.metadata.step import run as sync_metadata
from pulsar_migration.replication.partition import COPY_TARGET_PROPERTY
from pulsar_migration.stepjob import run_step
from pyspark.sql import SparkSession

from tests.conftest import unique
from tests.integration.replication_helpers import drain, source_tenant
from tests.integration.replication_helpers import replicate as step
from tests.integration.replication_helpers import replicate_report as report
from tests.integration.tenant_builders import write_spec
from tests.integration.test_replicate_topics import cleanup, produce_unbatched


def payloads(cluster: LocalCluster, topic: str) -> list[bytes]:
    return [m["data"] for m in drain(cluster, topic)]


def test_trimmed_target_goes_on_and_recreated_target_fails_clearly(
    cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin, admin_b: PulsarAdmin,
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    tenant = source_tenant(admin_a, cluster_a, unique("it-copy-ident"))
    admin_a.put(f"/persistent/{tenant}/ns/t/partitions", 2)
    topic = f"persistent://{tenant}/ns/t"
    parts = [f"{topic}-partition-{i}" for i in range(2)]
    spec = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b)
    run_dir = tmp_path / "run"
    try:
        produce_unbatched(cluster_a, topic, 40, keys=5)
        assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(tmp_path)]) == 0
        assert step(spec, run_dir) == 0
        for part in parts:  # marked before the map holds any of it
            assert admin_b.get(f"{admin_b.topic_path(part)}/properties") == {COPY_TARGET_PROPERTY: cluster_a.name}
            assert payloads(cluster_b, part) == payloads(cluster_a, part)

        # Consumed ledgers trimmed (no subscription, no retention; deduplication off for a moment, its cursor holds
        # the ledger until its next snapshot): the target looks empty yet is the same topic. The run turns it on.
        admin_b.post(f"/namespaces/{tenant}/ns/deduplication", False)
        admin_b.put(f"{admin_b.topic_path(parts[0])}/unload")
        admin_b.post(f"{admin_b.topic_path(parts[0])}/trim")
        assert admin_b.last_entry(parts[0]) is None  # the premise
        before = [len(payloads(cluster_a, part)) for part in parts]
        produce_unbatched(cluster_a, topic, 20, keys=5)
        assert step(spec, run_dir) == 0
        assert report(run_dir)["counts"]["partitions_ok"] == 2
        assert payloads(cluster_b, parts[0]) == payloads(cluster_a, parts[0])[before[0]:]  # only the new ones
        assert payloads(cluster_b, parts[1]) == payloads(cluster_a, parts[1])

        # Deleted and created again (empty, as sync_metadata would): copying the map's tail would verify, wrongly.
        produce_unbatched(cluster_a, topic, 10, keys=5)
        admin_b.delete(f"/persistent/{tenant}/ns/t/partitions", params={"force": "true"})
        admin_b.put(f"/persistent/{tenant}/ns/t/partitions", 2)
        capsys.readouterr()
        assert step(spec, run_dir) == 1
        line = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()][-1]
        assert line.startswith("error: replicate_topics: ") and "ns/t-partition-" in line
        assert "deleted and created again" in line and "new run dir" in line
        assert [admin_b.last_entry(part) for part in parts] == [None, None]  # nothing was copied into it

        # What the line says to do: a new run dir copies every partition whole.
        assert step(spec, tmp_path / "fresh") == 0
        for part in parts:
            assert payloads(cluster_b, part) == payloads(cluster_a, part)
            assert len(payloads(cluster_b, part)) > 0
    finally:
        cleanup(tenant, admin_a, admin_b)
