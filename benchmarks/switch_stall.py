"""Publish stall of live clients during switch_lookup on a many-topic tenant, against Pulsar's own floor.

    .venv/bin/python -m benchmarks.switch_stall [--topics 100] [--rate 200] [--mode copy]

Against the local cluster pair: a tenant with `--topics` non-partitioned topics on cluster-a, the lookup
service as its own process routing it there. One Python client through the lookup service runs a producer
(batching, the default 30 s send timeout) and an acknowledging Failover consumer on every topic; a
sender thread publishes `--rate` messages/s round-robin over the topics. Measured, in one run:

1. **floor**: the namespace merely unloaded on cluster-a; the stall (send to receipt) of every message
   sent in the 10 s after, and the messages consumers received twice.
2. **cutover**: sync_metadata, replicate_topics and sync_progress in this process, then switch_lookup;
   the same figures for the messages sent from the switch's start until 10 s after it, plus its hold
   and phase times.

Afterwards every acknowledged send must be stored on the target exactly once and received by its
consumer (lost and stored-twice counts in the result). Writes `benchmarks/results/switch_stall-<UTC
time>.json` and prints a markdown row.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from localdev.live_clients import LiveClients
from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.metadata.step import run as sync_metadata
from pulsar_migration.progress.step import add_args as progress_args
from pulsar_migration.progress.step import run as sync_progress
from pulsar_migration.replication.step import run as replicate_topics
from pulsar_migration.stepjob import run_step
from pulsar_migration.switch.step import run as switch_lookup

from benchmarks.lookup_throughput import TOKEN, start_lookup_service, wait_healthy
from benchmarks.metadata_scale import git_revision, machine
from benchmarks.replication_throughput import SOURCE, TARGET

RESULTS_DIR = Path(__file__).resolve().parent / "results"
WINDOW_S = 10.0
log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.switch_stall", description=__doc__.split("\n")[0])
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--rate", type=float, default=200.0, help="messages/s over all topics")
    parser.add_argument("--mode", choices=("copy", "geo"), default="copy")
    parser.add_argument("--copy-engine", choices=("auto", "java", "python"), default="auto",
                        help="the spec's copy_engine (the final delta's path in copy mode)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    admin = PulsarAdmin(SOURCE.admin_url, name=SOURCE.name)
    tenant = f"bench-switch-{uuid.uuid4().hex[:6]}"
    work = Path(tempfile.mkdtemp(prefix="switch-stall-"))
    proc, service = start_lookup_service(work, default=SOURCE.name)
    topics = [f"persistent://{tenant}/ns/t{i}" for i in range(args.topics)]
    result: dict[str, Any] = {"benchmark": "switch_stall", "started": datetime.now(UTC).isoformat(timespec="seconds"),
                              "machine": machine(), "git": git_revision(), "topics": args.topics, "rate": args.rate,
                              "mode": args.mode, "copy_engine": args.copy_engine, "loadavg_start": os.getloadavg()}
    load = None
    try:
        admin.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": [SOURCE.name]})
        admin.put(f"/namespaces/{tenant}/ns")
        admin.post(f"/namespaces/{tenant}/ns/retention", {"retentionTimeInMinutes": 60, "retentionSizeInMB": 256})
        admin.post(f"/namespaces/{tenant}/ns/deduplication", True)
        for topic in topics:
            admin.put(admin.topic_path(topic))
        wait_healthy(service)
        load = LiveClients(service, topics, args.rate, subscription="bench").start()
        time.sleep(5)
        floor_from = time.monotonic()
        admin.put(f"/namespaces/{tenant}/ns/unload", expect_json=False)
        time.sleep(WINDOW_S)
        result["floor"] = load.window(floor_from, time.monotonic())
        log.info("floor (unload): %s", result["floor"])

        spec = work / "spec.json"
        spec.write_text(json.dumps({
            "tenant": tenant, "source": SOURCE.name, "target": TARGET.name,
            "clusters": {c.name: {"admin_url": c.admin_url, "service_url": c.service_url, "token_env": None,
                                  "tls": None} for c in (SOURCE, TARGET)},
            "replication": {"mode": args.mode}, "options": {"geo_timeout_s": 300, "copy_engine": args.copy_engine},
            "lookup": {"url": service, "token_env": "PM_BENCH_LOOKUP_TOKEN"}}))
        os.environ["PM_BENCH_LOOKUP_TOKEN"] = TOKEN
        step_args = ["--spec", str(spec), "--run-dir", str(work / "run")]
        steps_started = time.monotonic()
        for name, body, extra in (("sync_metadata", sync_metadata, None), ("replicate_topics", replicate_topics, None),
                                  ("sync_progress", sync_progress, progress_args)):
            if run_step(name, body, step_args, add_args=extra) != 0:
                raise RuntimeError(f"{name} failed: see {work / 'run'}")
        result["steps_before_switch_s"] = round(time.monotonic() - steps_started, 1)
        switch_from = time.monotonic()
        code = run_step("switch_lookup", switch_lookup, step_args)
        switch_s = time.monotonic() - switch_from
        time.sleep(WINDOW_S)
        report = json.loads((work / "run" / "switch_lookup.json").read_text())
        result["switch"] = {"exit": code, "verdict": report["verdict"], "error": report.get("error"),
                            "duration_s": round(switch_s, 1), "hold_s": report["details"].get("hold_s"),
                            "phases_s": report["details"].get("phases_s"),
                            "final_replicate": report["details"].get("final_replicate")}
        result["cutover"] = load.window(switch_from, time.monotonic())
        log.info("switch: %s; cutover: %s", result["switch"], result["cutover"])
        load.close()
        result["check"] = load.check(TARGET.service_url)
    finally:
        if load is not None and not load.stop.is_set():
            load.close()
        proc.terminate()
        proc.wait(timeout=30)
        for side in (SOURCE, TARGET):
            a = PulsarAdmin(side.admin_url, name=side.name)
            try:
                for full in a.get(f"/namespaces/{tenant}") if tenant in a.get("/tenants") else []:
                    a.post(f"/namespaces/{full}/replication", [side.name])
                if tenant in a.get("/tenants"):
                    a.delete(f"/tenants/{tenant}", params={"force": "true"})
            except Exception:
                log.warning("cleanup of %s on %s failed", tenant, side.name, exc_info=True)
            finally:
                a.close()
        admin.close()
    result["loadavg_end"] = os.getloadavg()
    f, c, s = result["floor"], result["cutover"], result["switch"]
    row = (f"| {args.topics} | {args.rate:.0f} | {args.mode} | {f['stall_p50_s']} / {f['stall_p99_s']} / "
           f"{f['stall_max_s']} | {c['stall_p50_s']} / {c['stall_p99_s']} / {c['stall_max_s']} | {s['hold_s']} | "
           f"{f['received_twice']} / {c['received_twice']} | {result['check']['failed_sends']} / "
           f"{result['check']['lost_on_target']} / {result['check']['stored_twice_on_target']} |")
    result["row"] = row
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / f"switch_stall-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    out.write_text(json.dumps(result, indent=2))
    print(row)
    print(f"written {out}")
    return 0 if s["exit"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
