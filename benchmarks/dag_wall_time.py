"""Wall time of the whole migration DAG for the demo tenant, against the fixed cost of a bare spark-submit.

    .venv/bin/python -m benchmarks.dag_wall_time [--submits 3]

In one run: (1) the anchor, `spark-submit` of a job that only builds a local session, counts one row and
stops, `--submits` times (the fixed overhead every Spark task pays: JVM, Python, session start); (2) `make
demo`'s flow (`localdev.demo`) with a fresh tenant, through Airflow standalone and its REST API: a dry run,
then the real migration with live clients; its JSON gives the run's wall time and every task's time.
Writes `benchmarks/results/dag_wall_time-<UTC time>.json` and prints a markdown row: wall time, the Spark
tasks' summed time, the anchor, and how much of the Spark time is that fixed overhead.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from localdev.airflow_local import venv_bin

from benchmarks.metadata_scale import git_revision, machine

RESULTS_DIR = Path(__file__).resolve().parent / "results"
SPARK_TASKS = ("sync_metadata", "replicate_topics", "sync_progress", "switch_lookup", "cleanup_source")
NOOP_JOB = """
from pyspark.sql import SparkSession
spark = SparkSession.builder.appName("noop").getOrCreate()
assert spark.range(1).count() == 1
spark.stop()
"""
log = logging.getLogger(__name__)


def bare_submit_s(runs: int) -> list[float]:
    """Seconds per `spark-submit --master local[*]` of the no-op job."""
    job = Path(tempfile.mkdtemp(prefix="noop-")) / "noop.py"
    job.write_text(NOOP_JOB)
    env = {**os.environ, "PATH": os.pathsep.join([str(venv_bin()), os.environ.get("PATH", "")])}
    times = []
    for _ in range(runs):
        started = time.monotonic()
        subprocess.run([str(venv_bin() / "spark-submit"), "--master", "local[*]", "--conf", "spark.ui.enabled=false",
                        str(job)], env=env, check=True, capture_output=True)
        times.append(round(time.monotonic() - started, 2))
    return times


def demo_figures(tenant: str) -> dict[str, Any]:
    proc = subprocess.run([str(venv_bin() / "python"), "-m", "localdev.demo", "--tenant", tenant],
                          capture_output=True, text=True, check=False)
    written = re.search(r"Figures written to (\S+)", proc.stdout)
    if proc.returncode != 0 or not written:
        raise RuntimeError(f"the demo failed (exit {proc.returncode}): {(proc.stdout + proc.stderr)[-2000:]}")
    return json.loads(Path(written.group(1)).read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dag_wall_time", description=__doc__.split("\n")[0])
    parser.add_argument("--submits", type=int, default=3)
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    result: dict[str, Any] = {"benchmark": "dag_wall_time", "started": datetime.now(UTC).isoformat(timespec="seconds"),
                              "machine": machine(), "git": git_revision(), "loadavg_start": os.getloadavg()}
    result["bare_submit_s"] = bare_submit_s(args.submits)
    anchor = statistics.median(result["bare_submit_s"])
    log.info("bare spark-submit: %s s", result["bare_submit_s"])
    demo = demo_figures(f"bench-dag-{uuid.uuid4().hex[:6]}")
    result["demo"] = demo
    runs = {}
    for label in ("dry run", "migration"):
        tasks = demo[label]["tasks_s"]
        spark_s = sum(tasks[t] for t in SPARK_TASKS)
        runs[label] = {"wall_s": demo[label]["wall_s"], "spark_tasks_s": round(spark_s, 1),
                       "fixed_overhead_share": round(anchor * len(SPARK_TASKS) / spark_s, 2)}
    result["runs"] = runs
    result["loadavg_end"] = os.getloadavg()
    live = demo["live_clients"]
    m, d = runs["migration"], runs["dry run"]
    row = (f"| {m['wall_s']} | {d['wall_s']} | {m['spark_tasks_s']} | {anchor:.1f} | {m['fixed_overhead_share']:.0%} | "
           f"{live['lost_on_target']} / {live['stored_twice_on_target']} / {live['stall_max_s']} |")
    result["row"] = row
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / f"dag_wall_time-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    out.write_text(json.dumps(result, indent=2))
    sys.stdout.write(f"{row}\nwritten {out}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
