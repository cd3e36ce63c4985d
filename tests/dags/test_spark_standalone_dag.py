"""The migration DAG with `spark_default` pointing at a real Spark standalone cluster (master + worker started from
the installed pyspark), not `local[*]`: the library reaches the executors only through spark-submit's --py-files,
and the executors, in the worker's own JVMs, read and write the run dir.

Its two data-moving steps run (sync_metadata, replicate_topics: the operator every step uses, executors
creating topics and copying with the Pulsar client); the later steps are marked success without running
(`mark_success_pattern`), since each costs another application on the worker and they run whole in the
authenticated DAG test.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pulsar
import pytest
from localdev.pulsar_local import LocalCluster
from localdev.spark_standalone import standalone_cluster
from pulsar_migration.admin import PulsarAdmin

from tests.conftest import unique
from tests.dags.conftest import AirflowTestDb
from tests.dags.dag_runs import failures, rendered_fields, run_dag, xcom
from tests.integration.lookup_helpers import LookupProcess
from tests.integration.replication_helpers import client, drain
from tests.integration.tenant_builders import drop_tenant

DAG_ID = "pulsar_tenant_migration"
MESSAGES = 40


@pytest.fixture
def spark_master(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    """A standalone cluster, and `spark_default` pointing at it (the environment beats the settings' DB row)."""
    work = tmp_path / "spark"
    with standalone_cluster(work) as url:
        host, port = url.rsplit(":", 1)
        monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": host,
                                                                     "port": int(port)}))
        yield url, work


def seed(admin: PulsarAdmin, cluster: LocalCluster, tenant: str) -> None:
    """A partitioned and a plain topic with messages; a subscription that acknowledged part of one."""
    admin.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": [cluster.name]})
    admin.put(f"/namespaces/{tenant}/ns")
    admin.put(f"/persistent/{tenant}/ns/orders/partitions", 2)
    admin.put(f"/persistent/{tenant}/ns/audit")
    c = client(cluster)
    try:
        consumer = c.subscribe(f"persistent://{tenant}/ns/audit", "svc",
                               initial_position=pulsar.InitialPosition.Earliest)
        for topic in ("orders", "audit"):
            producer = c.create_producer(f"persistent://{tenant}/ns/{topic}")
            for i in range(MESSAGES):
                producer.send(f"{topic}-{i}".encode(), partition_key=f"k{i % 5}")
        for _ in range(MESSAGES // 4):
            consumer.acknowledge(consumer.receive(10_000))
        consumer.close()
    finally:
        c.close()


def test_the_migration_runs_on_a_spark_standalone_cluster(
    airflow_db: AirflowTestDb, cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin,
    admin_b: PulsarAdmin, lookup_service: LookupProcess, spark_master: tuple[str, Path],
) -> None:
    master, work = spark_master
    tenant = unique("dag-standalone")
    seed(admin_a, cluster_a, tenant)
    try:
        check_the_copy_on_standalone(cluster_a, cluster_b, tenant, master, work)
    finally:
        drop_tenant(tenant, admin_a, admin_b)


def check_the_copy_on_standalone(cluster_a: LocalCluster, cluster_b: LocalCluster, tenant: str, master: str,
                                 work: Path) -> None:
    later = "sync_progress|switch_lookup|cleanup_source"
    dag_run, states = run_dag(DAG_ID, run_conf={"tenant": tenant},
                              mark_success_pattern=rf"^({later}|publish_({later})_report|write_migration_report)$")

    assert dag_run.state == "success", failures(dag_run, states)
    assert xcom(dag_run, "publish_sync_metadata_report")["verdict"] == "ok"
    replicated = xcom(dag_run, "publish_replicate_topics_report")
    assert replicated["verdict"] == "ok" and replicated["counts"]["copied_messages"] == 2 * MESSAGES
    # Both steps ran their application on the standalone master ...
    registered = (work / "master.log").read_text()
    for step in ("sync_metadata", "replicate_topics"):
        assert f"Registering app pulsar-migration-{step}" in registered, f"{step} never reached {master}"
        assert rendered_fields(dag_run, step)["py_files"].endswith(".zip")
    apps = sorted((work / "worker").glob("app-*"))
    assert len(apps) == 2, f"expected an application per step on the worker, found {apps}"
    # ... whose executors got the library through --py-files (a copy in each executor's work dir) and ran tasks.
    for app in apps:
        assert list(app.glob("*/pulsar_migration-*.zip")), f"no library shipped to {app}"
    assert any("Finished task" in err.read_text(errors="replace") for err in (work / "worker").glob("app-*/*/stderr"))
    # The copy engine ran in the executors, built from the zip's own Java source: until 2026-11-26 the zip held
    # none, and every partition quietly took the Python path under spark-submit.
    run_dir = Path(xcom(dag_run, "render_spec")["run_dir"])
    parts = json.loads((run_dir / "replicate_topics.json").read_text())["details"]["partitions"]
    copied = [(p["topic"], p["copy_engine"]) for p in parts if p["copied_messages"]]  # an empty one takes neither
    assert len(copied) >= 2 and {engine for _, engine in copied} == {"java"}, copied
    assert json.loads((run_dir / "replicate_topics.json").read_text())["details"]["copy_engines_ran"] == {
        "java": len(copied)}
    # The target holds every message, in order, as the source does.
    for topic in ("orders-partition-0", "orders-partition-1", "audit"):
        name = f"persistent://{tenant}/ns/{topic}"
        assert [m["data"] for m in drain(cluster_b, name)] == [m["data"] for m in drain(cluster_a, name)], topic
    assert sorted(m["data"] for m in drain(cluster_b, f"persistent://{tenant}/ns/audit")) == sorted(
        f"audit-{i}".encode() for i in range(MESSAGES))
