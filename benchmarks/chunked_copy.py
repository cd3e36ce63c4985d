"""A partition with a chunked message first: replicate_topics through the engine (which puts chunked messages
together itself since 2026-11-27) against the Python path (which, before that, copied everything after the first
chunked entry), side by side on the same data.

    .venv/bin/python -m benchmarks.chunked_copy [--messages 200000] [--size 256] [--chunked 2] [--master local[2]]

Against the local cluster pair (cluster-a -> cluster-b): two source tenants with one non-partitioned topic each get
the same data through one batched producer (client defaults), `--chunked` messages of 6 MiB (chunked at the broker's
5 MiB) first, then `--messages` messages of `--size` bytes. Each tenant is copied once, in-process on a warm
SparkSession: one with `copy_engine: auto`, one with `copy_engine: python`; both must end with verdict ok. The
anchor is **produce**: the time to write the data once. It prints a markdown row, writes
`benchmarks/results/chunked_copy-<UTC time>.json` and force-deletes the tenants it created (and only those).
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.metadata_scale import TenantLedger, admins, all_healthy, git_revision, machine, write_spec
from benchmarks.replication_scale import RESULTS_DIR, SOURCE, TARGET, THREADS, client, run_step_timed
from benchmarks.replication_throughput import start_spark

log = logging.getLogger(__name__)

CHUNKED_BYTES = 6 * 1024 * 1024


def produce(topic: str, chunked: int, messages: int, size: int) -> float:
    """The data set, written once; returns the seconds it took."""
    c = client(SOURCE)
    started = time.monotonic()
    try:
        large = c.create_producer(topic, batching_enabled=False, chunking_enabled=True)
        for i in range(chunked):
            large.send(bytes([i % 256]) * CHUNKED_BYTES, properties={"kind": "chunked"})
        producer = c.create_producer(topic, block_if_queue_full=True, max_pending_messages=5000)
        payload = b"x" * size
        for i in range(messages):
            producer.send_async(payload, None, partition_key=f"k{i % 64}")
        producer.flush()
    finally:
        c.close()
    return round(time.monotonic() - started, 3)


def copy(tenant: str, engine: str, work: Path) -> dict[str, Any]:
    spec = write_spec(work / f"spec-{tenant}.json", tenant, SOURCE, TARGET, THREADS)
    data = json.loads(spec.read_text())
    data["options"]["copy_engine"] = engine
    spec.write_text(json.dumps(data))
    run_dir = work / tenant
    metadata_s, _ = run_step_timed("sync_metadata", spec, run_dir)
    wall, report = run_step_timed("replicate_topics", spec, run_dir)
    part = report["details"]["partitions"][0]
    return {"engine": engine, "sync_metadata_s": metadata_s, "wall_s": wall, "copy_engine": part["copy_engine"],
            "copy_s": part["copy_s"], "verify_s": part["verify_s"], "messages": part["copied_messages"],
            "bytes": part["copied_bytes"], "msgs_per_s": round(part["copied_messages"] / wall),
            "mb_per_s": round(part["copied_bytes"] / wall / 1e6, 2)}


def row(result: dict[str, Any]) -> str:
    engine, python = result["copies"]
    return (f"| `…{result['stamp'][-8:]}` | {result['git'][:7]} | {result['chunked']} x 6 MiB + {result['messages']:,}"
            f" x {result['size']} B | {result['produce_s']} | {python['wall_s']} ({python['copy_engine']}) | "
            f"{engine['wall_s']} ({engine['copy_engine']}) | {round(python['wall_s'] / engine['wall_s'], 2)}x |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--chunked", type=int, default=2)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not all_healthy(SOURCE, TARGET):
        log.error("the local clusters are not up: make clusters-up")
        return 1
    spark, owned, _ = start_spark(args.master)
    ledger = TenantLedger()
    tag = uuid.uuid4().hex[:8]
    result: dict[str, Any] = {"stamp": datetime.now(UTC).strftime("%Y-%m-%dT%H%M%SZ"), "git": git_revision(),
                              "machine": machine(), "chunked": args.chunked, "messages": args.messages,
                              "size": args.size, "master": args.master}
    try:
        with admins(SOURCE, TARGET) as (admin_a, _), tempfile.TemporaryDirectory(prefix="bench-chunked-") as work:
            copies = []
            for engine in ("auto", "python"):
                tenant = ledger.add(SOURCE, f"bench-chunked-{engine}-{tag}")
                admin_a.put(f"/tenants/{tenant}", {"allowedClusters": [SOURCE.name], "adminRoles": []})
                admin_a.put(f"/namespaces/{tenant}/ns")
                admin_a.put(f"/persistent/{tenant}/ns/mixed")
                ledger.add(TARGET, tenant)
                result["produce_s"] = produce(f"persistent://{tenant}/ns/mixed", args.chunked, args.messages,
                                              args.size)
                copies.append(copy(tenant, engine, Path(work)))
            result["copies"] = copies
    finally:
        result["cleanup_s"] = ledger.cleanup()
        if owned:
            spark.stop()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / f"chunked_copy-{result['stamp']}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(row(result))
    log.info("wrote %s", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
