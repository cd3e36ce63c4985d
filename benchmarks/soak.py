"""Soak: live producers at a steady rate while replicate_topics copies again and again, for 10+ minutes.

    .venv/bin/python -m benchmarks.soak [--minutes 10] [--rate 200] [--master local[2]]

Against the local pair (cluster-a -> cluster-b): a fresh tenant with a 2-partition and a plain topic, one
unbatched producer per topic sending `--rate` messages per second in all (each payload unique, every send's
receipt counted). While they run, replicate_topics runs in-process on one warm SparkSession, back to back;
each run copies what arrived since the last. After each run it samples this process (the Python driver) and
its Spark JVM (driver and, in local mode, the executors) and the PySpark workers: resident memory, open file
descriptors and threads. At the end the producers stop, a last run copies the tail, and the target is read
back: every partition must hold exactly the source's messages in the same order, and every acknowledged send
exactly once.

It prints a markdown table (one row per minute), the first-third vs last-third medians of each figure, and
writes `benchmarks/results/soak-<UTC time>.json`. It deletes the tenant it created on both clusters.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.metadata_scale import Cluster, git_revision, machine
from benchmarks.replication_throughput import start_spark

log = logging.getLogger(__name__)

RESULTS_DIR = Path(__file__).resolve().parent / "results"
SOURCE = Cluster("cluster-a", "http://127.0.0.1:8081", "pulsar://127.0.0.1:6651")
TARGET = Cluster("cluster-b", "http://127.0.0.1:8082", "pulsar://127.0.0.1:6652")
TOPICS = {"orders": 2, "events": 0}


def proc_figures(pid: int) -> dict[str, int]:
    """Resident KiB, open fds and threads of one process (0s if it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return {"rss_kib": 0, "fds": 0, "threads": 0}
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    rss = fields.get("VmRSS", "0 kB")  # absent for a process that is exiting
    return {"rss_kib": int(rss.split()[0]), "fds": fds, "threads": int(fields.get("Threads", "0"))}


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def sample(jvm_pid: int) -> dict[str, Any]:
    """The Python driver, the Spark JVM, and the PySpark worker processes under the JVM (summed)."""
    workers = [c for p in children(jvm_pid) for c in [p, *children(p)]]
    summed = {"rss_kib": 0, "fds": 0, "threads": 0, "count": len(workers)}
    for pid in workers:
        for key, value in proc_figures(pid).items():
            summed[key] += value
    return {"driver": proc_figures(os.getpid()), "jvm": proc_figures(jvm_pid), "workers": summed}


class Producers:
    """One unbatched producer per topic, together at `rate` messages/s; records every acknowledged payload."""

    def __init__(self, tenant: str, rate: float) -> None:
        import pulsar

        self.client = pulsar.Client(SOURCE.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
        self.producers = {t: self.client.create_producer(f"persistent://{tenant}/ns/{t}", batching_enabled=False,
                                                         block_if_queue_full=True) for t in TOPICS}
        self.rate = rate
        self.acked: dict[str, list[bytes]] = {t: [] for t in TOPICS}
        self.failed = 0
        self.sent = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import pulsar

        started, n = time.monotonic(), 0
        names = list(TOPICS)
        while not self._stop.is_set():
            topic = names[n % len(names)]
            payload = f"{topic}-{n}".encode()

            def done(result: Any, _msg_id: Any, topic: str = topic, payload: bytes = payload) -> None:
                with self._lock:
                    if result == pulsar.Result.Ok:
                        self.acked[topic].append(payload)
                    else:
                        self.failed += 1

            self.producers[topic].send_async(payload, done, partition_key=f"k{n % 11}")
            n += 1
            self.sent = n
            pause = started + n / self.rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        for producer in self.producers.values():
            producer.flush()
            producer.close()
        self.client.close()


def read_all(cluster: Cluster, topic: str) -> list[bytes]:
    import pulsar

    c = pulsar.Client(cluster.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        reader = c.create_reader(topic, pulsar.MessageId.earliest)
        out = []
        while reader.has_message_available():
            out.append(reader.read_next(10_000).data())
        return out
    finally:
        c.close()


def partitions(tenant: str) -> list[str]:
    return [f"persistent://{tenant}/ns/{t}-partition-{i}" if n else f"persistent://{tenant}/ns/{t}"
            for t, n in TOPICS.items() for i in range(max(n, 1))]


def drift(rows: list[dict[str, Any]], path: tuple[str, str]) -> dict[str, float]:
    """Median of a figure over the first and the last third of the samples."""
    values = [row["sample"][path[0]][path[1]] for row in rows]
    third = max(1, len(values) // 3)
    first, last = statistics.median(values[:third]), statistics.median(values[-third:])
    return {"first": first, "last": last, "growth_pct": round(100 * (last - first) / first, 1) if first else 0.0}


def run_copy(spec: Path, run_dir: Path) -> dict[str, Any]:
    from pulsar_migration.replication.step import STEP, run
    from pulsar_migration.stepjob import run_step

    started = time.monotonic()
    code = run_step(STEP, run, ["--spec", str(spec), "--run-dir", str(run_dir)])
    report = json.loads((run_dir / f"{STEP}.json").read_text())
    if code != 0:
        raise RuntimeError(f"replicate_topics failed: {report.get('error')}")
    return {"seconds": round(time.monotonic() - started, 2), "copied": report["counts"].get("copied_messages", 0)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=200.0, help="messages per second, all producers together")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    for noisy in ("py4j", "pulsar_migration"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    from pulsar_migration.metadata.step import run as meta_run
    from pulsar_migration.stepjob import run_step

    tenant = f"bench-soak-{uuid.uuid4().hex[:8]}"
    src, tgt = SOURCE.admin(), TARGET.admin()
    work = Path(tempfile.mkdtemp(prefix="soak-"))
    result: dict[str, Any] = {"tenant": tenant, "minutes": args.minutes, "rate": args.rate, "master": args.master,
                              "git": git_revision(), "machine": machine(), "started": datetime.now(UTC).isoformat()}
    try:
        src.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": [SOURCE.name]})
        src.put(f"/namespaces/{tenant}/ns")
        src.post(f"/namespaces/{tenant}/ns/retention", {"retentionTimeInMinutes": 120, "retentionSizeInMB": 512})
        for topic, count in TOPICS.items():
            if count:
                src.put(f"/persistent/{tenant}/ns/{topic}/partitions", count)
            else:
                src.put(f"/persistent/{tenant}/ns/{topic}")
        spec = work / "spec.json"
        spec.write_text(json.dumps({
            "tenant": tenant, "source": SOURCE.name, "target": TARGET.name,
            "clusters": {c.name: {"admin_url": c.admin_url, "service_url": c.service_url, "token_env": None,
                                  "tls": None} for c in (SOURCE, TARGET)}}))
        run_dir = work / "run"
        spark, owned, _ = start_spark(args.master)
        jvm_pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
        if run_step("sync_metadata", meta_run, ["--spec", str(spec), "--run-dir", str(run_dir)]) != 0:
            raise RuntimeError("sync_metadata failed")
        producers = Producers(tenant, args.rate)
        producers.start()
        started = time.monotonic()
        rows: list[dict[str, Any]] = []
        while time.monotonic() - started < args.minutes * 60:
            copy = run_copy(spec, run_dir)
            rows.append({"t_s": round(time.monotonic() - started, 1), **copy, "sent": producers.sent,
                         "sample": sample(jvm_pid)})
            log.info("t=%.0fs copy %.1fs, %d copied; driver %s, jvm %s", rows[-1]["t_s"], copy["seconds"],
                     copy["copied"], rows[-1]["sample"]["driver"], rows[-1]["sample"]["jvm"])
        producers.stop()
        final = run_copy(spec, run_dir)
        stored = {t: read_all(TARGET, t) for t in partitions(tenant)}
        source = {t: read_all(SOURCE, t) for t in partitions(tenant)}
        acked = [p for topic in TOPICS for p in producers.acked[topic]]
        held = [p for msgs in stored.values() for p in msgs]
        verification = {
            "partitions_equal_in_order": all(stored[t] == source[t] for t in stored),
            "acked": len(acked), "failed_sends": producers.failed, "target_messages": len(held),
            "lost": len(set(acked) - set(held)), "duplicated": len(held) - len(set(held)),
            "final_copy": final}
        elapsed = rows[-1]["t_s"] if rows else 0.0
        result.update({"rows": rows, "verification": verification, "copies": len(rows),
                       "produced_per_s": round(producers.sent / max(elapsed, 1e-9), 1),
                       "copied_per_s": round(sum(r["copied"] for r in rows) / max(elapsed, 1e-9), 1),
                       "drift": {f"{a}.{b}": drift(rows, (a, b)) for a in ("driver", "jvm", "workers")
                                 for b in ("rss_kib", "fds", "threads")}})
        if owned:
            spark.stop()
    finally:
        for admin in (src, tgt):
            try:
                if tenant in admin.get("/tenants"):
                    admin.delete(f"/tenants/{tenant}", params={"force": "true"})
            finally:
                admin.close()
    RESULTS_DIR.mkdir(exist_ok=True)
    out = RESULTS_DIR / f"soak-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    out.write_text(json.dumps(result, indent=2))
    minute = -1
    print("| t (s) | copy (s) | copied | driver RSS (MiB) | JVM RSS (MiB) | JVM fds | JVM threads "
          "| workers RSS (MiB) |")
    print("|---|---|---|---|---|---|---|---|")
    for row in result["rows"]:
        if int(row["t_s"] // 60) == minute:
            continue
        minute = int(row["t_s"] // 60)
        s = row["sample"]
        print(f"| {row['t_s']:.0f} | {row['seconds']:.1f} | {row['copied']} | {s['driver']['rss_kib'] / 1024:.0f} | "
              f"{s['jvm']['rss_kib'] / 1024:.0f} | {s['jvm']['fds']} | {s['jvm']['threads']} | "
              f"{s['workers']['rss_kib'] / 1024:.0f} |")
    print(json.dumps({"verification": result["verification"], "drift": result["drift"],
                      "produced_per_s": result["produced_per_s"], "copied_per_s": result["copied_per_s"]}, indent=1))
    print(f"results: {out}")
    ok = result["verification"]["lost"] == 0 == result["verification"]["duplicated"]
    return 0 if ok and result["verification"]["partitions_equal_in_order"] else 1


if __name__ == "__main__":
    sys.exit(main())
