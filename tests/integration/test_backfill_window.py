"""backfill_window (to a cluster and to a Parquet archive) and restore_window against the real cluster pair,
judged by draining topics with the plain Python client and reading the archive with plain pyarrow.

Three batches are produced a moment apart; the windows are cut between them, so each window must hold exactly
its batch, whatever order the windows run in and however often."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.dataset as pads
import pytest
from localdev.pulsar_local import LocalCluster
from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.backfill.edges import edge_name
from pulsar_migration.backfill.step import BACKFILL_STEP, RESTORE_STEP, add_window_args, run_backfill, run_restore
from pulsar_migration.backfill.window import Window
from pulsar_migration.stepjob import run_step
from pulsar_migration.throttle import BURST_S

from tests.conftest import unique
from tests.integration.replication_helpers import client, drain
from tests.integration.tenant_builders import write_spec

BATCHES = 3
PER_BATCH = 12
TOPICS = ("ns/events", "ns/parted")  # non-partitioned, 2 partitions


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def seed(admin: PulsarAdmin, cluster: LocalCluster, tenant: str,
         batches: int = BATCHES) -> tuple[list[int], dict[int, set[bytes]]]:
    """Batches on both topics, a pause between; returns the window edges and each batch's payloads."""
    create_topics(admin, cluster, tenant)
    c = client(cluster)
    edges = [int(time.time() * 1000) - 1]
    payloads: dict[int, set[bytes]] = {}
    try:
        producers = [c.create_producer(f"persistent://{tenant}/{t}", batching_enabled=(i == 1))
                     for i, t in enumerate(TOPICS)]
        for batch in range(batches):
            payloads[batch] = set()
            for i in range(PER_BATCH):
                for topic, producer in zip(TOPICS, producers, strict=True):
                    data = f"{topic}|b{batch}|m{i}".encode()
                    producer.send_async(data, None, partition_key=f"k{i % 3}", properties={"batch": str(batch)})
                    payloads[batch].add(data)
            for producer in producers:
                producer.flush()
            time.sleep(1.2)
            edges.append(int(time.time() * 1000))
            time.sleep(0.3)
    finally:
        c.close()
    return edges, payloads


def create_topics(admin: PulsarAdmin, cluster: LocalCluster, tenant: str) -> None:
    """The tenant's namespace and the two topics (one with 2 partitions), as `seed` makes them."""
    admin.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": [cluster.name]})
    admin.put(f"/namespaces/{tenant}/ns")
    admin.put(f"/persistent/{tenant}/ns/events")
    admin.put(f"/persistent/{tenant}/ns/parted/partitions", 2)


def window_args(spec: Path, run_dir: Path, edges: list[int], k: int) -> list[str]:
    return ["--spec", str(spec), "--run-dir", str(run_dir), "--start", iso(edges[k]), "--end", iso(edges[k + 1])]


def backfill(spec: Path, run_dir: Path, edges: list[int], k: int) -> int:
    return run_step(BACKFILL_STEP, run_backfill, window_args(spec, run_dir, edges, k), add_args=add_window_args)


def restore(spec: Path, run_dir: Path, edges: list[int], k: int) -> int:
    return run_step(RESTORE_STEP, run_restore, window_args(spec, run_dir, edges, k), add_args=add_window_args)


def step_report(run_dir: Path, step: str) -> dict[str, Any]:
    return json.loads((run_dir / f"{step}.json").read_text())


def target_payloads(cluster: LocalCluster, tenant: str) -> list[bytes]:
    topics = [f"persistent://{tenant}/ns/events"] + [f"persistent://{tenant}/ns/parted-partition-{i}" for i in (0, 1)]
    return [m["data"] for t in topics for m in drain(cluster, t)]


def test_windows_to_a_cluster_copy_each_batch_once_and_a_failed_first_window_is_carried_by_the_next(
    cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin, admin_b: PulsarAdmin, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    tenant = unique("it-bf-pulsar")
    edges, payloads = seed(admin_a, cluster_a, tenant)
    spec = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b,
                      options={"backfill_state_dir": str(tmp_path / "state")})
    # The target lacks the partitioned topic: the middle window, the state dir's first, fails on it.
    admin_b.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": [cluster_b.name]})
    admin_b.put(f"/namespaces/{tenant}/ns")
    admin_b.put(f"/persistent/{tenant}/ns/events")
    assert backfill(spec, tmp_path / "w1", edges, 1) == 2
    assert "ns/parted" in capsys.readouterr().err.strip().splitlines()[-1]
    assert drain(cluster_b, f"persistent://{tenant}/ns/events") == []  # (a reader of parted would create it)
    admin_b.put(f"/persistent/{tenant}/ns/parted/partitions", 2)

    # The next window brings both: partitions new to the map start where the state dir began (window 1), not at
    # this window's first entry (window 1's messages were skipped for good before).
    assert backfill(spec, tmp_path / "w2", edges, 2) == 0
    assert step_report(tmp_path / "w2", BACKFILL_STEP)["counts"]["copied_messages"] == PER_BATCH * 2 * 2
    held = target_payloads(cluster_b, tenant)
    assert len(held) == len(set(held)) and set(held) == payloads[1] | payloads[2]

    # Window 1 again: nothing left to send. Window 0, before where the state dir began, is refused in one line
    # (its messages would land after later ones; before, it reported ok having copied nothing).
    assert backfill(spec, tmp_path / "w1-again", edges, 1) == 0
    assert step_report(tmp_path / "w1-again", BACKFILL_STEP)["counts"]["copied_messages"] == 0
    capsys.readouterr()
    assert backfill(spec, tmp_path / "w0", edges, 0) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"error: {BACKFILL_STEP}: window ") and "has messages before" in line and "state dir" in line
    assert sorted(target_payloads(cluster_b, tenant)) == sorted(held)


def test_windows_to_the_archive_and_back_exactly_once(
    cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin, admin_b: PulsarAdmin, tmp_path: Path,
) -> None:
    tenant = unique("it-bf-archive")
    edges, payloads = seed(admin_a, cluster_a, tenant)
    archive = tmp_path / "archive"
    spec = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b,
                      options={"backfill_sink": "parquet", "archive_path": str(archive)})

    for k in range(BATCHES):
        assert backfill(spec, tmp_path / f"w{k}", edges, k) == 0
    first = step_report(tmp_path / "w0", BACKFILL_STEP)
    assert first["counts"]["archived_messages"] == PER_BATCH * 2 == first["counts"]["source_messages"]
    assert first["hashes"]["source"] == first["hashes"]["archive"]

    rows = pads.dataset(str(archive), format="parquet", partitioning="hive").to_table().to_pylist()
    by_window: dict[str, set[bytes]] = {}
    for row in rows:
        by_window.setdefault(row["window"], set()).add(row["payload"])
        assert row["tenant"] == tenant and row["properties"] and row["key"] in ("k0", "k1", "k2")
    assert len(rows) == BATCHES * PER_BATCH * 2  # nothing twice, nothing missing
    assert sorted(by_window.values(), key=sorted) == sorted(payloads.values(), key=sorted)
    day = datetime.fromtimestamp(edges[0] / 1000, UTC).strftime("%Y-%m-%d")
    assert (archive / f"tenant={tenant}" / "namespace=ns" / "topic=parted" / f"date={day}").is_dir()

    # Each edge was cut once, by the first window to reach it, and kept for the window on its other side.
    assert sorted(p.name for p in (archive / "_edges" / f"tenant={tenant}").iterdir()) == sorted(
        edge_name(ms) for ms in edges)
    assert {row["window"] for row in rows} == {Window.parse(iso(edges[k]), iso(edges[k + 1])).label
                                               for k in range(BATCHES)}

    # Re-running a window reads the same rows and leaves the archive as it is.
    assert backfill(spec, tmp_path / "w0-again", edges, 0) == 0
    again = pads.dataset(str(archive), format="parquet", partitioning="hive").to_table().to_pylist()
    assert sorted(r["digest"] for r in again) == sorted(r["digest"] for r in rows)
    rerun = step_report(tmp_path / "w0-again", BACKFILL_STEP)
    assert rerun["hashes"]["archive"] == first["hashes"]["archive"] and rerun["details"]["already_archived"] is True

    # Restore window 1 into the target, twice: its batch arrives once, in order per partition.
    create_topics(admin_b, cluster_b, tenant)
    for run in ("r1", "r1-again"):
        assert restore(spec, tmp_path / run, edges, 1) == 0
    restored = step_report(tmp_path / "r1", RESTORE_STEP)
    assert restored["counts"]["sent"] == PER_BATCH * 2 == restored["counts"]["restored"]
    assert step_report(tmp_path / "r1-again", RESTORE_STEP)["counts"]["sent"] == 0
    held = target_payloads(cluster_b, tenant)
    assert len(held) == len(set(held)) and set(held) == payloads[1]
    events = [m["data"] for m in drain(cluster_b, f"persistent://{tenant}/ns/events")]
    assert events == [f"ns/events|b1|m{i}".encode() for i in range(PER_BATCH)]


def test_a_capped_window_reads_the_source_no_faster_than_the_cap(
    cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin, tmp_path: Path,
) -> None:
    tenant = unique("it-bf-cap")
    edges, payloads = seed(admin_a, cluster_a, tenant, batches=1)
    cap_mb = 0.0002  # 200 bytes a second: the window's ~400 bytes of payload take at least 1.6 s
    spec = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b,
                      options={"backfill_sink": "parquet", "archive_path": str(tmp_path / "archive"),
                               "copy_max_mb_per_s": cap_mb})
    assert backfill(spec, tmp_path / "w0", edges, 0) == 0
    done = step_report(tmp_path / "w0", BACKFILL_STEP)
    assert done["counts"]["archived_messages"] == PER_BATCH * 2
    assert done["details"]["throttle"]["max_mb_per_s"] == cap_mb
    payload = sum(len(p) for p in payloads[0])
    # Every reading task may take one burst at once (two tasks on the test session's one slot, one after another).
    least_s = (payload - 2 * BURST_S * cap_mb * 1e6) / (cap_mb * 1e6)
    assert done["details"]["read_s"] >= least_s > 1, (done["details"]["read_s"], least_s, payload)
    # The reads themselves were held back (the read's Spark job alone takes seconds in a fresh session: 4.7 s
    # uncapped here, so read_s alone would not tell).
    assert done["details"]["throttle"]["held_back_s"] >= 0.5 * least_s, done["details"]["throttle"]


@pytest.mark.parametrize("case", ["end-before-start", "no-archive-path"])
def test_bad_windows_and_sinks_exit_2_and_write_nothing(
    case: str, cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    tenant = unique("it-bf-bad")
    admin_a.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": [cluster_a.name]})
    admin_a.put(f"/namespaces/{tenant}/ns")
    options = {"backfill_sink": "parquet"} if case == "no-archive-path" else {}
    spec = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b, options=options)
    now = int(time.time() * 1000)
    edges = [now, now - 1000] if case == "end-before-start" else [now - 1000, now]
    assert backfill(spec, tmp_path / "run", edges, 0) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"error: {BACKFILL_STEP}: ")
    assert ("is not before" in line) if case == "end-before-start" else ("archive_path" in line)
