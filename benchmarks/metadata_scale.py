"""Metadata-sync scale benchmark: sync_metadata on an N-topic tenant vs. the bare admin calls it must make.

    .venv/bin/python -m benchmarks.metadata_scale [--topics 1000] [--repeat 1]

Against the local cluster pair (cluster-a -> cluster-b), each repeat:

1. builds a source tenant with N topics on cluster-a (`create_source_tenant`);
2. times the bare baseline: the same resources created directly on cluster-b under another tenant name,
   with the same thread-pool concurrency -- the least time any tool must spend writing them;
3. times sync_metadata in-process (`run_step` on a warm `local[2]` SparkSession), then its no-op re-run;
4. times `spark-submit spark_jobs/sync_metadata.py` (a fresh JVM and Python workers) on a second source
   tenant, then its no-op re-run;
5. times the sync of a 1-topic tenant both ways: the fixed cost of the step (Spark jobs, JVM start).

It prints markdown table rows, writes `benchmarks/results/metadata_scale-<date>.json`, and force-deletes
every tenant it created (and only those).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pulsar_migration.admin import NotFound, PulsarAdmin, seg

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"
SYNC_JOB = ROOT / "spark_jobs" / "sync_metadata.py"
STEP = "sync_metadata"

CONCURRENCY = 16
PARTITIONED_SHARE = 0.10
SUBSCRIBED_SHARE = 0.20
MIN_PARTITIONS, MAX_PARTITIONS = 2, 4
SUBSCRIPTION = "bench-sub"
LAYOUT_SEED = 20240917  # the same mix every run


# -- building a tenant ------------------------------------------------------------------------------

@dataclass(frozen=True)
class TopicPlan:
    namespace: str
    name: str
    partitions: int  # 0: non-partitioned
    subscribed: bool


def plan_topics(topics: int, namespaces: int) -> list[TopicPlan]:
    """Exactly `topics` topics round-robin over `namespaces` namespaces: ~10% partitioned (2-4 partitions),
    the rest non-partitioned; ~20% (drawn independently) carry one durable subscription. Deterministic."""
    if topics < 0 or namespaces < 1:
        raise ValueError(f"need topics >= 0 and namespaces >= 1, got {topics} and {namespaces}")
    rng = random.Random(LAYOUT_SEED)
    partitioned = set(rng.sample(range(topics), round(topics * PARTITIONED_SHARE)))
    subscribed = set(rng.sample(range(topics), round(topics * SUBSCRIBED_SHARE)))
    return [
        TopicPlan(
            namespace=namespace_name(i % namespaces),
            name=f"topic-{i:05d}",
            partitions=rng.randint(MIN_PARTITIONS, MAX_PARTITIONS) if i in partitioned else 0,
            subscribed=i in subscribed,
        )
        for i in range(topics)
    ]


def namespace_name(index: int) -> str:
    return f"ns{index:02d}"


def create_source_tenant(admin: PulsarAdmin, tenant: str, allowed_clusters: list[str], topics: int = 1000,
                         namespaces: int = 5, concurrency: int = 16) -> dict[str, int]:
    """Creates `tenant` with `namespaces` namespaces and exactly `topics` topics spread over them.

    ~10% of the topics are partitioned (2-4 partitions), the rest non-partitioned; ~20% get a durable
    subscription (created at the earliest position). Namespaces, then topics (each with its subscription)
    are created by at most `concurrency` threads. For a fresh tenant name only: existing resources fail
    with `Conflict`. Returns {namespace: topic count}.
    """
    plans = plan_topics(topics, namespaces)
    ns_names = [namespace_name(i) for i in range(namespaces)]
    started = time.monotonic()
    admin.put(f"/tenants/{seg(tenant)}", {"adminRoles": [], "allowedClusters": list(allowed_clusters)})
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        list(pool.map(lambda ns: admin.put(f"/namespaces/{seg(tenant)}/{seg(ns)}"), ns_names))
        list(pool.map(lambda plan: _create_topic(admin, tenant, plan), plans))
    layout = dict.fromkeys(ns_names, 0)
    for plan in plans:
        layout[plan.namespace] += 1
    log.info("created tenant %s on %s: %d namespaces, %d topics (%d partitioned, %d subscribed) in %.1fs",
             tenant, admin.name, namespaces, topics, sum(1 for p in plans if p.partitions),
             sum(1 for p in plans if p.subscribed), time.monotonic() - started)
    return layout


def _create_topic(admin: PulsarAdmin, tenant: str, plan: TopicPlan) -> None:
    path = f"/persistent/{seg(tenant)}/{seg(plan.namespace)}/{seg(plan.name)}"
    if plan.partitions:
        admin.put(f"{path}/partitions", plan.partitions)
    else:
        admin.put(path)
    if plan.subscribed:
        admin.put(f"{path}/subscription/{seg(SUBSCRIPTION)}", {"ledgerId": -1, "entryId": -1})


def delete_tenant(admin: PulsarAdmin, tenant: str) -> bool:
    """Force-deletes `tenant` with everything in it; False when it did not exist."""
    try:
        admin.delete(f"/tenants/{seg(tenant)}", params={"force": "true"}, expect_json=False)
    except NotFound:
        return False
    return True


# -- timing the step --------------------------------------------------------------------------------

@dataclass
class Cluster:
    name: str
    admin_url: str
    service_url: str

    def admin(self) -> PulsarAdmin:
        return PulsarAdmin(self.admin_url, name=self.name, timeout_s=120.0)


def write_spec(path: Path, tenant: str, source: Cluster, target: Cluster, concurrency: int) -> Path:
    spec = {
        "tenant": tenant, "source": source.name, "target": target.name,
        "clusters": {c.name: {"admin_url": c.admin_url, "service_url": c.service_url, "token_env": None,
                              "tls": None} for c in (source, target)},
        "options": {"admin_concurrency": concurrency},
    }
    path.write_text(json.dumps(spec))
    return path


def step_report(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / f"{STEP}.json").read_text())


def _phases(report: dict[str, Any], total_s: float) -> dict[str, Any]:
    details, counts = report.get("details", {}), report.get("counts", {})
    phases = {k: details.get(k) for k in ("inventory_s", "plan_s", "apply_s", "verify_s")}
    known = sum(v for v in phases.values() if v is not None)
    return {
        "total_s": round(total_s, 3), **phases, "other_s": round(total_s - known, 3),
        "verdict": report.get("verdict"), "create": counts.get("CREATE"), "update": counts.get("UPDATE"),
        "noop": counts.get("NOOP"), "applied": counts.get("applied"),
    }


def sync_in_process(spec: Path, run_dir: Path) -> dict[str, Any]:
    from pulsar_migration.metadata.step import run
    from pulsar_migration.stepjob import run_step

    started = time.monotonic()
    code = run_step(STEP, run, ["--spec", str(spec), "--run-dir", str(run_dir)])
    elapsed = time.monotonic() - started
    if code != 0:
        raise RuntimeError(f"in-process sync_metadata exited {code} (run dir {run_dir})")
    return _phases(step_report(run_dir), elapsed)


def sync_spark_submit(spec: Path, run_dir: Path, master: str) -> dict[str, Any]:
    spark_submit = shutil.which("spark-submit", path=str(Path(sys.executable).parent)) or "spark-submit"
    cmd = [spark_submit, "--master", master, "--conf", "spark.ui.enabled=false",
           "--conf", "spark.ui.showConsoleProgress=false", str(SYNC_JOB),
           "--spec", str(spec), "--run-dir", str(run_dir)]
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy(), check=False)
    elapsed = time.monotonic() - started
    (run_dir.parent / f"{run_dir.name}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        raise RuntimeError(f"spark-submit sync_metadata exited {proc.returncode}: {tail}")
    return _phases(step_report(run_dir), elapsed)


EMPTY_JOB = """from pyspark.sql import SparkSession
spark = SparkSession.builder.appName("metadata-scale-empty").getOrCreate()
spark.sparkContext.parallelize(range(4), 2).map(lambda x: x).collect()
spark.stop()
"""


def empty_spark_submit(work: Path, master: str) -> float:
    """Wall time of a spark-submit whose job only starts a session and one Python worker job."""
    script = work / "empty_job.py"
    script.write_text(EMPTY_JOB)
    spark_submit = shutil.which("spark-submit", path=str(Path(sys.executable).parent)) or "spark-submit"
    started = time.monotonic()
    subprocess.run([spark_submit, "--master", master, "--conf", "spark.ui.enabled=false", str(script)],
                   capture_output=True, check=True, env=os.environ.copy())
    return round(time.monotonic() - started, 3)


def all_healthy(*clusters: Cluster) -> bool:
    """Whether every cluster answers healthy; prints one error line for the first that does not."""
    with admins(*clusters) as opened:
        for admin in opened:
            if not admin.healthy():
                print(f"error: cluster {admin.name} at {admin.admin_url} is not healthy", file=sys.stderr)
                return False
    return True


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    started = time.monotonic()
    result = fn()
    return round(time.monotonic() - started, 3), result


def start_spark(master: str) -> tuple[SparkSession, float]:
    # Python workers must run this interpreter (the venv with the library).
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    started = time.monotonic()
    spark = (SparkSession.builder.master(master).appName("metadata-scale-benchmark")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    # The first job starts the Python workers: part of the fixed cost too.
    spark.sparkContext.parallelize(range(4), 2).map(lambda x: x).collect()
    return spark, round(time.monotonic() - started, 3)


# -- one benchmark run ------------------------------------------------------------------------------

class TenantLedger:
    """The tenants this run created, per cluster, so cleanup deletes those and nothing else."""

    def __init__(self) -> None:
        self.created: list[tuple[Cluster, str]] = []

    def add(self, cluster: Cluster, tenant: str) -> str:
        self.created.append((cluster, tenant))
        return tenant

    def cleanup(self) -> float:
        started = time.monotonic()
        for cluster, tenant in reversed(self.created):
            admin = cluster.admin()
            try:
                delete_tenant(admin, tenant)
            except Exception as exc:  # keep deleting the rest
                log.warning("could not delete tenant %s on %s: %s", tenant, cluster.name, exc)
            finally:
                admin.close()
        self.created.clear()
        return round(time.monotonic() - started, 3)


@contextmanager
def admins(*clusters: Cluster) -> Iterator[list[PulsarAdmin]]:
    opened = [c.admin() for c in clusters]
    try:
        yield opened
    finally:
        for admin in opened:
            admin.close()


def one_repeat(index: int, topics: int, namespaces: int, source: Cluster, target: Cluster, master: str,
               work: Path, ledger: TenantLedger) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    both = [source.name, target.name]
    result: dict[str, Any] = {"repeat": index}
    with admins(source, target) as (admin_a, admin_b):
        # The synced tenants end up on both clusters; cleanup must cover both.
        src = f"bench-sync-{tag}"
        result["source_build_s"], _ = timed(lambda: create_source_tenant(
            admin_a, ledger.add(source, src), [source.name], topics, namespaces, CONCURRENCY))
        ledger.add(target, src)
        src2 = f"bench-submit-{tag}"
        timed(lambda: create_source_tenant(admin_a, ledger.add(source, src2), [source.name], topics, namespaces,
                                           CONCURRENCY))
        ledger.add(target, src2)
        bare = f"bench-bare-{tag}"
        result["bare_s"], _ = timed(lambda: create_source_tenant(
            admin_b, ledger.add(target, bare), both, topics, namespaces, CONCURRENCY))

    spec = write_spec(work / f"spec-{tag}.json", src, source, target, CONCURRENCY)
    result["in_process"] = sync_in_process(spec, work / f"run-{tag}-1")
    result["in_process_noop"] = sync_in_process(spec, work / f"run-{tag}-2")
    spec2 = write_spec(work / f"spec-{tag}-submit.json", src2, source, target, CONCURRENCY)
    result["spark_submit"] = sync_spark_submit(spec2, work / f"run-{tag}-submit-1", master)
    result["spark_submit_noop"] = sync_spark_submit(spec2, work / f"run-{tag}-submit-2", master)
    for key in ("in_process", "in_process_noop", "spark_submit", "spark_submit_noop"):
        if result[key]["verdict"] != "ok":
            raise RuntimeError(f"{key}: verdict {result[key]['verdict']}")
    return result


def fixed_overhead(namespaces: int, source: Cluster, target: Cluster, master: str, work: Path,
                   ledger: TenantLedger) -> dict[str, Any]:
    """Sync of 1-topic tenants: what the step costs whatever the tenant's size."""
    tag = uuid.uuid4().hex[:8]
    out: dict[str, Any] = {"empty_spark_submit_s": empty_spark_submit(work, master)}
    with admins(source) as (admin_a,):
        for mode in ("in_process", "spark_submit"):
            tenant = ledger.add(source, f"bench-one-{mode.replace('_', '')}-{tag}")
            create_source_tenant(admin_a, tenant, [source.name], 1, 1, CONCURRENCY)
            ledger.add(target, tenant)
            spec = write_spec(work / f"spec-one-{mode}-{tag}.json", tenant, source, target, CONCURRENCY)
            run_dir = work / f"run-one-{mode}-{tag}"
            out[mode] = (sync_in_process(spec, run_dir) if mode == "in_process"
                         else sync_spark_submit(spec, run_dir, master))
    return out


# -- output -----------------------------------------------------------------------------------------

def _ratio(a: float, b: float) -> str:
    return f"{a / b:.1f}x" if b else "n/a"


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _split(timing: dict[str, Any]) -> str:
    return " / ".join(_secs(timing.get(k)) for k in ("inventory_s", "plan_s", "apply_s", "verify_s", "other_s"))


def table(result: dict[str, Any]) -> list[str]:
    """Markdown rows: one per repeat, plus the 1-topic (fixed cost) row when measured."""
    lines = [
        "| run | topics | bare admin calls (s) | sync in-process (s) | ratio | inventory / plan / apply / verify / "
        "other (s) | no-op re-run (s) | spark-submit sync (s) | ratio | spark-submit no-op (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for rep in result["repeats"]:
        ip, sub = rep["in_process"], rep["spark_submit"]
        lines.append(
            f"| {rep['repeat']} | {result['topics']} | {rep['bare_s']:.1f} | {ip['total_s']:.1f} "
            f"| {_ratio(ip['total_s'], rep['bare_s'])} | {_split(ip)} "
            f"| {rep['in_process_noop']['total_s']:.1f} | {sub['total_s']:.1f} "
            f"| {_ratio(sub['total_s'], rep['bare_s'])} | {rep['spark_submit_noop']['total_s']:.1f} |"
        )
    fixed = result.get("fixed_overhead")
    if fixed:
        ip, sub = fixed["in_process"], fixed["spark_submit"]
        lines.append(f"| 1-topic | 1 | - | {ip['total_s']:.1f} | - | {_split(ip)} | - | {sub['total_s']:.1f} | - | - |")
    empty = f"; spark-submit of an empty job: {fixed['empty_spark_submit_s']:.1f}s" if fixed else ""
    lines.append(f"\nIn-process Spark session start + first Python worker job ({result['master']}): "
                 f"{result['spark_start_s']:.1f}s{empty}; load average at start/end: "
                 f"{result['loadavg_start'][0]:.1f} / {result['loadavg_end'][0]:.1f}")
    return lines


def git_revision() -> str | None:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "include/pulsar_migration", "spark_jobs"],
                               cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return f"{head}+dirty" if dirty else head


def machine() -> dict[str, Any]:
    mem_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "mem_gib": mem_gib, "platform": platform.platform(),
            "python": platform.python_version()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.metadata_scale", description=__doc__.split("\n")[0])
    parser.add_argument("--topics", type=int, default=1000, help="topics in the source tenant (default 1000)")
    parser.add_argument("--namespaces", type=int, default=5, help="namespaces in the source tenant (default 5)")
    parser.add_argument("--repeat", type=int, default=1, help="benchmark repeats (default 1)")
    parser.add_argument("--master", default="local[2]", help="Spark master for both modes (default local[2])")
    parser.add_argument("--no-fixed-overhead", action="store_true", help="skip the 1-topic syncs")
    parser.add_argument("--keep", action="store_true", help="do not delete the benchmark tenants")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for chatty in ("py4j", "urllib3"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    os.environ["PYSPARK_PYTHON"] = sys.executable  # before any Spark starts, in-process or spark-submit

    source = Cluster("cluster-a", "http://127.0.0.1:8081", "pulsar://127.0.0.1:6651")
    target = Cluster("cluster-b", "http://127.0.0.1:8082", "pulsar://127.0.0.1:6652")
    if not all_healthy(source, target):
        return 1

    result: dict[str, Any] = {
        "benchmark": "metadata_scale", "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "topics": args.topics, "namespaces": args.namespaces, "concurrency": CONCURRENCY,
        "master": args.master, "cores_used": args.master.removeprefix("local[").rstrip("]"),
        "machine": machine(), "git": git_revision(),
        "library": str(Path(sys.modules["pulsar_migration.admin"].__file__).parent),
        "loadavg_start": os.getloadavg(), "repeats": [],
    }
    ledger = TenantLedger()
    spark = None
    work = Path(tempfile.mkdtemp(prefix="metadata-scale-"))
    try:
        spark, result["spark_start_s"] = start_spark(args.master)
        for i in range(1, args.repeat + 1):
            result["repeats"].append(one_repeat(i, args.topics, args.namespaces, source, target, args.master,
                                                work, ledger))
        if not args.no_fixed_overhead:
            result["fixed_overhead"] = fixed_overhead(args.namespaces, source, target, args.master, work, ledger)
    finally:
        if spark is not None:
            spark.stop()
        if not args.keep:
            result["cleanup_s"] = ledger.cleanup()
        log.info("run dirs and spark-submit logs kept in %s", work)

    result["loadavg_end"] = os.getloadavg()
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / f"metadata_scale-{datetime.now(UTC).strftime('%Y-%m-%dT%H%M%SZ')}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print("\n".join(table(result)))
    print(f"\nresult: {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
