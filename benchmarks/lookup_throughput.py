"""Lookup throughput: the lookup service against a broker's own HTTP lookup, side by side.

    .venv/bin/python -m benchmarks.lookup_throughput [--seconds 10] [--concurrency 1,16,64] [--topics 100]

Against the local cluster pair: a tenant with `--topics` topics on cluster-a; the lookup service started as
its own process (`python -m pulsar_migration.lookup`, SQLite routes, the tenant routed to cluster-a).
For each concurrency, `--seconds` of `GET /lookup/v2/topic/persistent/<tenant>/ns/t<i>` round-robin over
the topics from that many concurrent keep-alive HTTP clients (httpx, one asyncio loop), first against
the broker (http://127.0.0.1:8081), then through the service. Both answer the same question; the service
adds a route lookup and a forward to the broker, so the broker's figure is the ceiling.

Writes `benchmarks/results/lookup_throughput-<UTC time>.json` and prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from pulsar_migration.admin import PulsarAdmin

from benchmarks.metadata_scale import git_revision, machine
from benchmarks.replication_throughput import SOURCE, TARGET

RESULTS_DIR = Path(__file__).resolve().parent / "results"
TOKEN = "benchmark-" + uuid.uuid4().hex


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def hammer(base: str, paths: list[str], concurrency: int, seconds: float) -> dict[str, Any]:
    latencies: list[float] = []
    errors = 0
    stop = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30) as client:
        async def worker(offset: int) -> None:
            nonlocal errors
            i = offset
            while time.monotonic() < stop:
                started = time.monotonic()
                resp = await client.get(paths[i % len(paths)])
                latencies.append(time.monotonic() - started)
                if resp.status_code != 200 or "brokerUrl" not in resp.json():
                    errors += 1
                i += concurrency
        started = time.monotonic()
        await asyncio.gather(*(worker(k) for k in range(concurrency)))
        elapsed = time.monotonic() - started
    latencies.sort()

    def pct(p: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000, 2) if latencies else 0.0

    return {"requests": len(latencies), "errors": errors, "per_s": round(len(latencies) / elapsed, 1),
            "p50_ms": pct(0.5), "p99_ms": pct(0.99), "max_ms": pct(1.0)}


def start_lookup_service(work: Path, default: str) -> tuple[subprocess.Popen[bytes], str]:
    """The lookup service as its own process (SQLite routes in `work`); returns it and its URL."""
    port = free_port()
    config = work / "lookup.json"
    config.write_text(json.dumps({
        "clusters": {c.name: {"http_url": c.admin_url} for c in (SOURCE, TARGET)}, "default_cluster": default,
        "database_url": f"sqlite:///{work / 'routes.db'}", "port": port}))
    proc = subprocess.Popen([sys.executable, "-m", "pulsar_migration.lookup", "--config", str(config)],
                            env={**os.environ, "PM_LOOKUP_ADMIN_TOKEN": TOKEN})
    return proc, f"http://127.0.0.1:{port}"


def wait_healthy(service: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{service}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("the lookup service did not start")
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.lookup_throughput", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    levels = [int(v) for v in args.concurrency.split(",") if v.strip()]
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a log line per request would be the bottleneck
    admin = PulsarAdmin(SOURCE.admin_url, name=SOURCE.name)
    tenant = f"bench-lookup-{uuid.uuid4().hex[:6]}"
    work = Path(tempfile.mkdtemp(prefix="lookup-throughput-"))
    proc, service = start_lookup_service(work, default=TARGET.name)
    stamp = datetime.now(UTC)
    result: dict[str, Any] = {"benchmark": "lookup_throughput", "started": stamp.isoformat(timespec="seconds"),
                              "machine": machine(), "git": git_revision(), "topics": args.topics,
                              "seconds": args.seconds, "loadavg_start": os.getloadavg(), "runs": []}
    try:
        admin.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": [SOURCE.name]})
        admin.put(f"/namespaces/{tenant}/ns")
        for i in range(args.topics):
            admin.put(f"/persistent/{tenant}/ns/t{i}")
        wait_healthy(service)
        httpx.put(f"{service}/api/v1/routes/{tenant}", json={"cluster": SOURCE.name, "reason": "benchmark"},
                  headers={"Authorization": f"Bearer {TOKEN}"}).raise_for_status()
        paths = [f"/lookup/v2/topic/persistent/{tenant}/ns/t{i}" for i in range(args.topics)]
        for concurrency in levels:
            for name, base in (("broker", SOURCE.admin_url), ("lookup service", service)):
                run = asyncio.run(hammer(base, paths, concurrency, args.seconds))
                run.update(target=name, concurrency=concurrency)
                result["runs"].append(run)
                print(f"{name:15s} c={concurrency:3d}: {run}", flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        try:
            admin.delete(f"/tenants/{tenant}", params={"force": "true"})
        finally:
            admin.close()
    result["loadavg_end"] = os.getloadavg()
    by = {(r["target"], r["concurrency"]): r for r in result["runs"]}
    lines = ["| concurrency | broker lookups/s (p50 / p99 ms) | lookup service lookups/s (p50 / p99 ms) | ratio |",
             "|---|---|---|---|"]
    for c in levels:
        b, s = by[("broker", c)], by[("lookup service", c)]
        lines.append(f"| {c} | {b['per_s']} ({b['p50_ms']} / {b['p99_ms']}) | {s['per_s']} ({s['p50_ms']} / "
                     f"{s['p99_ms']}) | {s['per_s'] / b['per_s']:.2f}x |")
    result["table"] = lines
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / f"lookup_throughput-{stamp.strftime('%Y-%m-%dT%H%M%SZ')}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print("\n".join(lines))
    print(f"\nresult: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
