"""Session fixtures: the real local Pulsar pair (started here only if not already running), a local Spark."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from localdev import pulsar_local
from localdev.pulsar_local import LocalCluster
from pulsar_migration.admin import PulsarAdmin

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

# The project's Spark settings (conf/spark) for in-process sessions and spark-submits, also under a bare pytest.
os.environ.setdefault("SPARK_CONF_DIR", str(Path(__file__).resolve().parents[1] / "conf" / "spark"))


# Each module's time in a clean-clone `make test` (the run of c3dce1a, 2026-11-29, three workers; setup and
# teardown included; test_copy_engine with 45 s added for its two new tests). The workers take whole modules
# (--dist loadfile) in collection order, so the longest go first: xdist's own order (by number of tests) handed out
# the one-test live modules of two to three minutes last, while the other workers sat idle (about a minute of tail
# in a simulation of that run). A module not listed counts a second per test.
MODULE_SECONDS = {
    "tests/integration/test_cluster_c.py": 433, "tests/integration/test_copy_chunked_engine.py": 316,
    "tests/dags/test_authenticated_migration.py": 294, "tests/integration/test_switch_live.py": 273,
    "tests/integration/test_copy_engine.py": 268, "tests/integration/test_sync_progress.py": 266,
    "tests/dags/test_rollback_dag.py": 266, "tests/integration/test_rollback_live.py": 205,
    "tests/integration/test_tls.py": 173, "tests/integration/test_two_brokers.py": 170,
    "tests/integration/test_sync_metadata.py": 162, "tests/dags/test_backfill_dag.py": 158,
    "tests/integration/test_airflow_ui.py": 145, "tests/integration/test_replicate_topics.py": 122,
    "tests/integration/test_source_ttl.py": 109, "tests/dags/test_spark_standalone_dag.py": 70,
    "tests/integration/test_progress_chunked.py": 68, "tests/integration/test_replicate_geo.py": 64,
    "tests/integration/test_backfill_window.py": 49, "tests/integration/test_odd_topic_names.py": 47,
    "tests/integration/test_copy_rate_cap.py": 46, "tests/integration/test_switch_kills.py": 46,
    "tests/integration/test_airflow_settings_loader.py": 45, "tests/integration/test_benchmark_smoke.py": 43,
    "tests/unit/test_copy_engine.py": 40, "tests/integration/test_cleanup_source.py": 38,
    "tests/integration/test_partial_chunk_resume.py": 37, "tests/integration/test_lookup_service.py": 33,
    "tests/dags/test_migration_dag.py": 32, "tests/integration/test_replicate_many_topics.py": 31,
    "tests/dags/test_smoke_dag.py": 27, "tests/integration/test_replicate_compacted.py": 21,
    "tests/integration/test_trim_risk.py": 21, "tests/integration/test_engine_heap.py": 19,
    "tests/unit/test_positions_properties.py": 9,
}


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config.option, "loadscopereorder"):  # xdist: keep the order below
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules longest first (MODULE_SECONDS), each module's tests together and in their own order."""
    def module(item: pytest.Item) -> str:
        return item.nodeid.split("::", 1)[0]

    tests_in: dict[str, int] = {}
    for item in items:
        tests_in[module(item)] = tests_in.get(module(item), 0) + 1
    items.sort(key=lambda item: (-MODULE_SECONDS.get(module(item), tests_in[module(item)]), module(item)))


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One local[1] SparkSession for the whole test session (starting one costs seconds)."""
    from pyspark.sql import SparkSession

    # Python workers must run this interpreter (the venv with the library), not whatever python3 is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[1]")
        .appName("pulsar-migration-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.sql.session.timeZone", "UTC")
        # Adaptive execution re-plans each stage: on the tests' tiny frames only its cost shows (this JVM's CPU over
        # the metadata and progress modules 108 -> 90 s; whole-stage codegen off changed nothing, the full JIT
        # cost more, 138 s).
        .config("spark.sql.adaptive.enabled", "false")
        .getOrCreate()
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def pulsar_clusters() -> Iterator[list[LocalCluster]]:
    """Both local clusters, healthy and registered in each other; stops only what this session started."""
    clusters = pulsar_local.local_clusters(2)
    already_up = [c for c in clusters if c.admin().healthy()]
    pulsar_local.start(2)
    try:
        yield clusters
    finally:
        started_here = [c for c in clusters if c not in already_up]
        if started_here:
            pulsar_local.stop_clusters(started_here)


@pytest.fixture(scope="session")
def cluster_a(pulsar_clusters: list[LocalCluster]) -> LocalCluster:
    return pulsar_clusters[0]


@pytest.fixture(scope="session")
def cluster_b(pulsar_clusters: list[LocalCluster]) -> LocalCluster:
    return pulsar_clusters[1]


@pytest.fixture
def admin_a(cluster_a: LocalCluster) -> Iterator[PulsarAdmin]:
    admin = PulsarAdmin(cluster_a.admin_url, name=cluster_a.name)
    yield admin
    admin.close()


@pytest.fixture
def admin_b(cluster_b: LocalCluster) -> Iterator[PulsarAdmin]:
    admin = PulsarAdmin(cluster_b.admin_url, name=cluster_b.name)
    yield admin
    admin.close()


def unique(prefix: str) -> str:
    """A name no earlier test run used (clusters keep their data across sessions)."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def spark_submit(step: str, spec: Path, run_dir: Path, master: str = "local[2]", env: dict[str, str] | None = None,
                 **popen: object) -> subprocess.Popen[str]:
    """`spark-submit spark_jobs/<step>.py` on `master` in its own process group (so a test can SIGKILL the
    driver and its Python workers together), `env` added to the environment (PM_FAULT, ...); `popen` goes to
    subprocess.Popen (stdout, ...)."""
    job = Path(__file__).resolve().parents[1] / "spark_jobs" / f"{step}.py"
    return subprocess.Popen(  # type: ignore[call-overload]
        [str(Path(sys.executable).with_name("spark-submit")), "--master", master, "--conf",
         "spark.ui.enabled=false", str(job), "--spec", str(spec), "--run-dir", str(run_dir)],
        env={**os.environ, "PYSPARK_PYTHON": sys.executable, **(env or {})}, start_new_session=True, text=True,
        **popen)


def kill_at_fault_point(step: str, spec: Path, run_dir: Path, point: str, n: int, marks: Path,
                        settle_s: float = 0.0, timeout_s: float = 300.0) -> None:
    """Runs `step` as its own spark-submit, parked by PM_FAULT at `point`'s `n`-th pass, waits for the point's
    marker file in `marks`, then `settle_s`, and SIGKILLs the whole process group there. The job's output goes
    to `marks/<point>.log` (a pipe nobody reads could fill and stall the job before the point)."""
    marks.mkdir(parents=True, exist_ok=True)
    output = marks / f"{point}.log"
    with output.open("w") as out:
        proc = spark_submit(step, spec, run_dir, env={"PM_FAULT": f"{point}@{n}=600", "PM_FAULT_MARK_DIR": str(marks)},
                            stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout_s
        while not (marks / point).exists():
            assert proc.poll() is None, f"{step} ended before {point}: {output.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"{step} never reached {point}"
            time.sleep(0.1)
        time.sleep(settle_s)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)

