"""Replication at tenant scale: replicate_topics (copy mode) on a tenant of many small topics vs. a bare client copy.

    .venv/bin/python -m benchmarks.replication_scale [--topics 1000] [--messages 10] [--master local[2]]

A tenant's size is mostly its number of topics, not its bytes: what each partition costs (lookups, producers,
readers, admin calls, processes) decides the step's time there. Against the local cluster pair (cluster-a ->
cluster-b), one run:

1. builds a source tenant on cluster-a with metadata_scale's layout (N topics over 5 namespaces, ~10% partitioned)
   and sends `--messages` unbatched keyed messages of `--size` bytes to every partition, 16 threads, a producer
   per partition: **produce**, the bare cost of writing the data once;
2. **naive**: a bare client copy of the same data into a tenant of the same layout on cluster-b, 16 threads, per
   partition a reader on the source and a producer on the target, nothing verified and nothing recorded: the
   least a client-side copy must do;
3. **geo** (unless `--no-geo`): native geo-replication catching up on the same data in a third tenant (the same
   layout on both clusters, both allowed), timed from the `pulsar.repl.cluster-b` cursors created at the earliest
   entry of every partition, through the namespaces' replication clusters and every partition unloaded and
   loaded again, until the target holds as many entries as the source on every partition (raw admin calls, the
   recipe of replication_throughput's geo);
4. **copy**: sync_metadata (timed apart), then replicate_topics in-process on a warm SparkSession: the first run,
   a no-op re-run (nothing new), and a re-run after one more message in every tenth partition.

It prints a markdown row, writes `benchmarks/results/replication_scale-<UTC time>.json` and force-deletes the
tenants it created (and only those).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pulsar_migration.admin import NotFound, PulsarAdmin, seg

from benchmarks.metadata_scale import (
    Cluster,
    TenantLedger,
    admins,
    all_healthy,
    create_source_tenant,
    git_revision,
    machine,
    write_spec,
)
from benchmarks.replication_throughput import start_spark

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"
SOURCE = Cluster("cluster-a", "http://127.0.0.1:8081", "pulsar://127.0.0.1:6651")
TARGET = Cluster("cluster-b", "http://127.0.0.1:8082", "pulsar://127.0.0.1:6652")
THREADS = 16
NAMESPACES = 5
DELTA_EVERY = 10  # the delta re-run: one more message in every tenth partition
GEO_CURSOR = f"pulsar.repl.{TARGET.name}"
GEO_POLL_S = 0.5
GEO_CLEANUP_WAIT_S = 60.0


def entries(admin: PulsarAdmin, topic: str) -> int:
    return int(admin.get(f"{admin.topic_path(topic)}/internalStats")["numberOfEntries"])


def geo_catch_up(admin_a: PulsarAdmin, admin_b: PulsarAdmin, tenant: str, topics: list[str],
                 timeout_s: float) -> dict[str, Any]:
    """Native geo-replication of the backlog `topics` hold on the source, timed until the target holds it all."""
    with ThreadPoolExecutor(THREADS) as pool:
        want = dict(zip(topics, pool.map(lambda t: entries(admin_a, t), topics), strict=True))
        list(pool.map(lambda t: admin_a.put(f"{admin_a.topic_path(t)}/subscription/{seg(GEO_CURSOR)}",
                                            {"ledgerId": -1, "entryId": -1}), topics))
        started = time.monotonic()
        for ns in admin_a.get(f"/namespaces/{seg(tenant)}"):
            admin_a.post(f"/namespaces/{ns}/replication", [SOURCE.name, TARGET.name])

        def reload(topic: str) -> None:  # an unloaded topic has no replicator until something looks it up
            admin_a.put(f"{admin_a.topic_path(topic)}/unload")
            admin_a.get(f"{admin_a.topic_path(topic)}/stats")

        list(pool.map(reload, topics))
        enable_s = time.monotonic() - started
        pending = [t for t in topics if want[t]]
        while pending:
            have = pool.map(lambda t: target_entries(admin_b, t), pending)
            pending = [t for t, h in zip(pending, have, strict=True) if h < want[t]]
            if pending and time.monotonic() - started > timeout_s:
                raise RuntimeError(f"geo: {len(pending)} partition(s) not caught up after {timeout_s:.0f}s")
            if pending:
                time.sleep(GEO_POLL_S)
    return {"geo_s": round(time.monotonic() - started, 3), "geo_enable_s": round(enable_s, 3),
            "geo_entries": sum(want.values())}


def target_entries(admin: PulsarAdmin, topic: str) -> int:
    try:
        return entries(admin, topic)
    except NotFound:  # the replicator has not created it yet
        return 0


def unreplicate(admin_a: PulsarAdmin, tenant: str, topics: list[str]) -> None:
    """Benchmark tenants only: the target out of the namespaces' replication clusters (its topics go by cascade),
    then waits until the source's replicators are gone, so the force delete does not race them (on 4.0.8 that
    left topics fenced for good)."""
    for ns in admin_a.get(f"/namespaces/{seg(tenant)}"):
        admin_a.post(f"/namespaces/{ns}/replication", [SOURCE.name])
    deadline = time.monotonic() + GEO_CLEANUP_WAIT_S
    with ThreadPoolExecutor(THREADS) as pool:
        while time.monotonic() < deadline:
            if not any(pool.map(lambda t: bool(admin_a.get(f"{admin_a.topic_path(t)}/stats").get("replication")),
                                topics)):
                break
            time.sleep(1.0)
        else:
            log.warning("replicators of %s still running %.0fs after un-replicating", tenant, GEO_CLEANUP_WAIT_S)
    time.sleep(1.0)


def tenant_partitions(admin: PulsarAdmin, tenant: str) -> list[str]:
    """Every partition of the tenant (a namespace's topic list names partitions, not partitioned topics)."""
    return sorted(t for ns in admin.get(f"/namespaces/{seg(tenant)}") for t in admin.get(f"/persistent/{ns}"))


def client(cluster: Cluster) -> Any:
    import pulsar

    return pulsar.Client(cluster.service_url, operation_timeout_seconds=60,
                         logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))


def produce(cluster: Cluster, topics: list[str], messages: int, size: int, tag: str) -> float:
    """`messages` unbatched keyed messages of `size` bytes to each topic, THREADS producers at a time; seconds."""
    c = client(cluster)

    def fill(topic: str) -> None:
        producer = c.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
        for i in range(messages):
            producer.send_async(f"{tag}-{i}-".encode().ljust(size, b"x"), None, partition_key=f"k{i}")
        producer.flush()
        producer.close()

    started = time.monotonic()
    try:
        with ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(fill, topics))
    finally:
        c.close()
    return round(time.monotonic() - started, 3)


def naive_copy(topics: list[str], source_tenant: str, target_tenant: str) -> tuple[float, int]:
    """A reader per source partition, a producer on the same partition of `target_tenant`; (seconds, messages)."""
    import pulsar

    src, tgt = client(SOURCE), client(TARGET)

    def copy(topic: str) -> int:
        reader = src.create_reader(topic, pulsar.MessageId.earliest)
        producer = tgt.create_producer(topic.replace(f"://{source_tenant}/", f"://{target_tenant}/", 1),
                                       batching_enabled=False, block_if_queue_full=True)
        copied = 0
        while reader.has_message_available():
            m = reader.read_next(30_000)
            producer.send_async(m.data(), None, partition_key=m.partition_key() or None,
                                properties=m.properties(), event_timestamp=m.event_timestamp() or None)
            copied += 1
        producer.flush()
        producer.close()
        reader.close()
        return copied

    started = time.monotonic()
    try:
        with ThreadPoolExecutor(THREADS) as pool:
            copied = sum(pool.map(copy, topics))
    finally:
        src.close()
        tgt.close()
    return round(time.monotonic() - started, 3), copied


def run_step_timed(name: str, spec: Path, run_dir: Path) -> tuple[float, dict[str, Any]]:
    from pulsar_migration.metadata.step import run as meta_run
    from pulsar_migration.replication.step import run as copy_run
    from pulsar_migration.stepjob import run_step

    body = meta_run if name == "sync_metadata" else copy_run
    started = time.monotonic()
    code = run_step(name, body, ["--spec", str(spec), "--run-dir", str(run_dir)])
    wall = round(time.monotonic() - started, 3)
    report = json.loads((run_dir / f"{name}.json").read_text())
    if code != 0 or report.get("verdict") != "ok":
        raise RuntimeError(f"{name} exited {code}, verdict {report.get('verdict')} (run dir {run_dir})")
    return wall, report


def copy_figures(wall: float, report: dict[str, Any]) -> dict[str, Any]:
    counts, details = report["counts"], report["details"]
    parts = details.get("partitions") or []
    processes = {json.dumps(p["engine_times"].get("partitions")) for p in parts if p.get("engine_times")}
    return {"wall_s": wall, **{k: details.get(k) for k in ("inventory_s", "prepare_s", "engine_phase_s",
                                                            "replicate_s")},
            **{k: counts.get(k) for k in ("partitions", "copied_messages", "target_messages", "partitions_unchanged",
                                          "map_rows_appended")},
            "engine_partitions_per_process": sorted(processes)}


def one_run(topics: int, messages: int, size: int, work: Path, ledger: TenantLedger,
            geo_timeout_s: float | None) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    src, bare, geo = f"bench-scale-{tag}", f"bench-scale-bare-{tag}", f"bench-scale-geo-{tag}"
    out: dict[str, Any] = {}
    with admins(SOURCE, TARGET) as (admin_a, admin_b):
        create_source_tenant(admin_a, ledger.add(SOURCE, src), [SOURCE.name], topics, NAMESPACES, THREADS)
        ledger.add(TARGET, src)
        create_source_tenant(admin_b, ledger.add(TARGET, bare), [TARGET.name], topics, NAMESPACES, THREADS)
        partitions = tenant_partitions(admin_a, src)
        out["partitions"] = len(partitions)
        out["produce_s"] = produce(SOURCE, partitions, messages, size, "first")
        out["naive_s"], out["naive_messages"] = naive_copy(partitions, src, bare)
        if geo_timeout_s is not None:
            both = [SOURCE.name, TARGET.name]
            create_source_tenant(admin_a, ledger.add(SOURCE, geo), both, topics, NAMESPACES, THREADS)
            create_source_tenant(admin_b, ledger.add(TARGET, geo), both, topics, NAMESPACES, THREADS)
            geo_partitions = tenant_partitions(admin_a, geo)
            produce(SOURCE, geo_partitions, messages, size, "first")
            try:
                out.update(geo_catch_up(admin_a, admin_b, geo, geo_partitions, geo_timeout_s))
            finally:
                unreplicate(admin_a, geo, geo_partitions)
    spec = write_spec(work / f"spec-{tag}.json", src, SOURCE, TARGET, THREADS)
    run_dir = work / f"run-{tag}"
    out["sync_metadata_s"], _ = run_step_timed("sync_metadata", spec, run_dir)
    out["copy_first"] = copy_figures(*run_step_timed("replicate_topics", spec, run_dir))
    out["copy_noop"] = copy_figures(*run_step_timed("replicate_topics", spec, run_dir))
    delta = partitions[::DELTA_EVERY]
    produce(SOURCE, delta, 1, size, "delta")
    out["delta_partitions"] = len(delta)
    out["copy_delta"] = copy_figures(*run_step_timed("replicate_topics", spec, run_dir))
    expected = {"copy_first": len(partitions) * messages, "copy_noop": 0, "copy_delta": len(delta)}
    for key, want in expected.items():
        if out[key]["copied_messages"] != want or out[key]["target_messages"] != want:
            raise RuntimeError(f"{key}: {out[key]['copied_messages']} copied, {out[key]['target_messages']} on the "
                               f"target, {want} expected")
    return out


def row(result: dict[str, Any]) -> str:
    """| result | git | topics (partitions) | messages | produce | naive | geo | sync_metadata | copy first | copy
    speed / geo | copy speed / naive | no-op re-run | delta re-run | partitions per engine process |"""
    r = result["run"]
    first, noop, delta = r["copy_first"], r["copy_noop"], r["copy_delta"]
    geo, copy_s = r.get("geo_s"), first["wall_s"]
    vs_geo = f"{geo / copy_s:.2f}x" if geo else "-"
    return (f"| `…{result['file_stamp']}` | {result['git']} | {result['topics']} ({r['partitions']}) | "
            f"{result['messages']} | {r['produce_s']} | {r['naive_s']} | {geo or '-'} | {r['sync_metadata_s']} | "
            f"{copy_s} | {vs_geo} | {r['naive_s'] / copy_s:.2f}x | {noop['wall_s']} | {delta['wall_s']} | "
            f"{', '.join(first['engine_partitions_per_process']) or '-'} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.replication_scale", description=__doc__.split("\n")[0])
    parser.add_argument("--topics", type=int, default=1000, help="topics in the source tenant (default 1000)")
    parser.add_argument("--messages", type=int, default=10, help="messages per partition (default 10)")
    parser.add_argument("--size", type=int, default=200, help="payload bytes (default 200)")
    parser.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    parser.add_argument("--keep", action="store_true", help="do not delete the benchmark tenants")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR, help="where the JSON goes")
    parser.add_argument("--no-geo", action="store_true", help="skip native geo-replication")
    parser.add_argument("--geo-timeout", type=float, default=600.0, help="seconds to wait for geo (default 600)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for chatty in ("py4j", "urllib3"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    if not all_healthy(SOURCE, TARGET):
        return 1
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H%M%SZ")
    result: dict[str, Any] = {
        "benchmark": "replication_scale", "started": stamp, "file_stamp": stamp[-8:], "topics": args.topics,
        "messages": args.messages, "size": args.size, "master": args.master, "machine": machine(),
        "git": git_revision(), "library": str(Path(sys.modules["pulsar_migration.admin"].__file__).parent),
        "loadavg_start": os.getloadavg(),
    }
    ledger = TenantLedger()
    spark, owned = None, False
    work = Path(tempfile.mkdtemp(prefix="replication-scale-"))
    try:
        spark, owned, result["spark_start_s"] = start_spark(args.master)  # an active session is reused, kept
        result["run"] = one_run(args.topics, args.messages, args.size, work, ledger,
                                None if args.no_geo else args.geo_timeout)
    finally:
        if spark is not None and owned:
            spark.stop()
        result["tenants"] = sorted({tenant for _, tenant in ledger.created})
        if not args.keep:
            result["cleanup_s"] = ledger.cleanup()
    result["loadavg_end"] = os.getloadavg()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / f"replication_scale-{stamp}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(row(result))
    print(f"\nresult: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
