"""far_target: the copy to a target one long round trip away, with the read-back's two lag bounds.

    .venv/bin/python -m benchmarks.far_target [--delay-ms 100] [--messages 100000] [--size 256] [--partitions 1]
        [--master local[2]]

The copy engine keeps its copy close to its read-back of the target, so that the target broker serves the
read-back from its entry cache (about 1 s) instead of its bookie. Held to 1,000 entries ahead, a copy to a far
target could send at most 1,000 unbatched entries per round trip and partition; now it runs further ahead while
the oldest entry not read back is younger than 300 ms. This measures both on the same data, side by side:

* **near**: the copy straight to cluster-c (loopback);
* **far, age bound**: the same through a delay-line proxy (`localdev.faulty_proxy`, `delay_s`: every chunk
  arrives `--delay-ms` late each way, many chunks in flight) in front of cluster-c's broker and admin ports,
  reached by the spec's `listener_name`, the engine as shipped (`-Dpm.readBackAgeMs=300`);
* **far, count bound**: the same with `-Dpm.readBackAgeMs=0`, the count alone (the engine before 2026-11-25).

Each variant copies its own source tenant on cluster-a holding the same unbatched data set, after an untimed
warm-up copy (a fresh standalone's first topics and ledgers, the engine's first start). cluster-c is started
with the proxied listener and stopped at the end (its data deleted: it is the tests' throwaway cluster); the
source tenants are deleted. Throughput is payload MB (10^6 bytes) and messages per second of the step's wall.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from localdev import pulsar_local
from localdev.faulty_proxy import FaultyProxy
from pulsar_migration.admin import PulsarAdmin

from benchmarks.metadata_scale import git_revision, machine
from benchmarks.replication_throughput import (
    RESULTS_DIR,
    SOURCE,
    BenchmarkError,
    DataSet,
    Tenants,
    client,
    copy_step,
    load1,
    produce,
    rate,
    start_spark,
    topic_name,
)

log = logging.getLogger(__name__)

LISTENER = "far"
PROXY_WEB_PORT, PROXY_BROKER_PORT = 18093, 16663
VARIANTS = (("near", False, 300), ("far-age", True, 300), ("far-count", True, 0))


def write_spec(path: Path, tenant: str, target: pulsar_local.LocalCluster, far: bool) -> Path:
    target_doc: dict[str, Any] = {"admin_url": target.admin_url, "service_url": target.service_url,
                                  "token_env": None, "tls": None}
    if far:
        target_doc.update(admin_url=f"http://127.0.0.1:{PROXY_WEB_PORT}",
                          service_url=f"pulsar://127.0.0.1:{PROXY_BROKER_PORT}", listener_name=LISTENER)
    spec = {"tenant": tenant, "source": SOURCE.name, "target": target.name,
            "clusters": {SOURCE.name: {"admin_url": SOURCE.admin_url, "service_url": SOURCE.service_url,
                                       "token_env": None, "tls": None}, target.name: target_doc},
            "options": {"copy_engine": "java", "delayed_delivery_horizon_s": 0}}
    path.write_text(json.dumps(spec))
    return path


def copy(ds: DataSet, tenant: str, target: pulsar_local.LocalCluster, far: bool, work: Path) -> dict[str, Any]:
    run_dir = work / f"run-{tenant}"
    _, _, wall, report = copy_step(write_spec(work / f"spec-{tenant}.json", tenant, target, far), run_dir, ds.messages)
    parts = report["details"]["partitions"]
    times = [p.get("engine_times") or {} for p in parts]
    return {"load1": load1(), "step_wall": rate(ds.messages, ds.bytes, wall),
            "copy_engine": sorted({p.get("copy_engine") or "python" for p in parts}),
            "partition_copy_s": [t.get("partition_copy_s") for t in times],
            "read_back_wait_s": [t.get("read_back_wait_s") for t in times],
            "send_wait_s": [t.get("send_wait_s") for t in times], "run_dir": str(run_dir)}


def one_variant(args: argparse.Namespace) -> int:
    """A child process per variant: the engine's JVM options reach it through the environment of the Spark
    workers, which fork from a daemon that keeps the environment it started with."""
    name, far = args.one, args.one.startswith("far")
    target = pulsar_local.local_clusters(3)[2]
    src = PulsarAdmin(SOURCE.admin_url, name=SOURCE.name)
    tenants = Tenants(src, PulsarAdmin(target.admin_url, name=target.name))
    ds = DataSet(args.size, False, args.messages)
    spark, owned, _ = start_spark(args.master)
    try:
        tenant = tenants.create(f"bench-far-{name}-{uuid.uuid4().hex[:6]}", on_source=True, on_target=False,
                                allowed=[SOURCE.name], partitions=args.partitions)
        c = client(SOURCE)
        try:
            produce(c, topic_name(tenant), ds, ds.payloads())
        finally:
            c.close()
        out = copy(ds, tenant, target, far, Path(args.work_dir))
        out["engine_java_options"] = os.environ.get("PM_ENGINE_JAVA_OPTIONS", "")
        Path(args.work_dir, f"{name}.json").write_text(json.dumps(out))
    finally:
        tenants.cleanup()  # the source tenant; cluster-c goes away whole
        if owned:
            spark.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.far_target", description=__doc__.split("\n")[0])
    parser.add_argument("--delay-ms", type=float, default=100.0, help="proxy delay each way (default 100)")
    parser.add_argument("--messages", type=int, default=100_000, help="unbatched messages (default 100000)")
    parser.add_argument("--size", type=int, default=256, help="payload bytes per message (default 256)")
    parser.add_argument("--partitions", type=int, default=1, help="partitions of the topic (default 1)")
    parser.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    parser.add_argument("--variants", default=",".join(v[0] for v in VARIANTS),
                        help="which of near,far-age,far-count (default all)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR, help="where the JSON goes")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child's variant
    parser.add_argument("--work-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    if args.one:
        return one_variant(args)

    target = pulsar_local.local_clusters(3)[2]
    pulsar_local.stop_clusters([target])
    shutil.rmtree(target.root, ignore_errors=True)
    pulsar_local.start_with_overrides(target, pulsar_local.proxied_listener_overrides(target, LISTENER,
                                                                                      PROXY_BROKER_PORT))
    work = Path(tempfile.mkdtemp(prefix="far-target-"))
    result: dict[str, Any] = {"benchmark": "far_target", "started": datetime.now(UTC).isoformat(timespec="seconds"),
                              "delay_ms_each_way": args.delay_ms, "messages": args.messages, "size": args.size,
                              "partitions": args.partitions, "master": args.master, "machine": machine(),
                              "git": git_revision(), "loadavg_start": os.getloadavg(), "variants": {}}
    common = ["--messages", str(args.messages), "--size", str(args.size), "--partitions", str(args.partitions),
              "--master", args.master, "--work-dir", str(work)]
    try:
        with (FaultyProxy(PROXY_WEB_PORT, target.web_port, delay_s=args.delay_ms / 1000),
              FaultyProxy(PROXY_BROKER_PORT, target.broker_port, delay_s=args.delay_ms / 1000)):
            chosen = [v for v in VARIANTS if v[0] in args.variants.split(",")]
            # A fresh standalone's first topics and ledgers, the engine's first start: not in any figure.
            for name, _, age_ms in (("near-warm-up", False, 300), *chosen):
                env = {**os.environ, "PM_ENGINE_JAVA_OPTIONS": f"-Dpm.readBackAgeMs={age_ms}"}
                size = ["--messages", str(min(2000, args.messages))] if name.endswith("warm-up") else []
                answer = subprocess.run([sys.executable, "-m", "benchmarks.far_target", "--one", name, *common,
                                         *size], env=env)
                if answer.returncode != 0:
                    raise BenchmarkError(f"variant {name} exited {answer.returncode}")
                if name.endswith("warm-up"):
                    continue
                out = json.loads((work / f"{name}.json").read_text())
                result["variants"][name] = out
                log.info("%s: step wall %.2f MB/s (%.0f msg/s), read-back waits %s s", name,
                         out["step_wall"]["mb_per_s"], out["step_wall"]["msgs_per_s"], out["read_back_wait_s"])
    finally:
        pulsar_local.stop_clusters([target])
        shutil.rmtree(target.root, ignore_errors=True)
    result["loadavg_end"] = os.getloadavg()
    result["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
    variants = result["variants"]
    near = variants["near"]["step_wall"]["msgs_per_s"] if "near" in variants else None
    result["ratios"] = {name: round(v["step_wall"]["msgs_per_s"] / near, 3) if near else None
                        for name, v in variants.items()}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path = args.out_dir / f"far_target-{result['started'].replace(':', '').replace('+0000', 'Z')}.json"
    path.write_text(json.dumps(result, indent=1))
    print("| variant | step wall MB/s | msg/s | / near | copy s | read-back wait s | send wait s |")
    print("|---|---|---|---|---|---|---|")
    for name, v in variants.items():
        print(f"| {name} | {v['step_wall']['mb_per_s']:.2f} | {v['step_wall']['msgs_per_s']:,.0f} | "
              f"{result['ratios'][name] or 0:.2f}x | {v['partition_copy_s']} | {v['read_back_wait_s']} | "
              f"{v['send_wait_s']} |")
    print(f"\nresult: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
