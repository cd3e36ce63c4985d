"""
### Pulsar smoke test

Proves the whole chain works before a migration is attempted: Airflow renders the Pulsar cluster
connections into arguments, `spark-submit` runs `spark_jobs/smoke_admin.py` on the `spark_default`
connection, the library reaches the executors as a `--py-files` zip, and one Spark task per cluster
calls that cluster's admin API (health and cluster list).

Succeeds only when every cluster answers healthy and lists the other ones (each is registered in the
other, as geo-replication and migration need). The result JSON lands in
`<pulsar_migration_run_dir_base>/pulsar_smoke/<run id>/smoke_admin.json`.

Connections: `pulsar_cluster_a`, `pulsar_cluster_b` (admin URL from schema/host/port; token, if any,
in the password, handed to Spark as an environment variable, never as an argument).
"""

from __future__ import annotations

from pathlib import Path

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG, Param
from pulsar_migration import dag_support

PROJECT_ROOT = Path(__file__).resolve().parents[1]
CLUSTER_CONN_IDS = ("pulsar_cluster_a", "pulsar_cluster_b")
_CONNS = "[" + ", ".join(f"conn['{c}']" for c in CLUSTER_CONN_IDS) + "]"
_RUN_DIR = (
    "{{ pulsar_run_dir(var.value.get('pulsar_migration_run_dir_base', 'var/runs'), dag.dag_id, run_id) }}"
)

with DAG(
    dag_id="pulsar_smoke",
    schedule=None,
    catchup=False,
    doc_md=__doc__,
    tags=["pulsar", "smoke"],
    params={
        "admin_timeout_s": Param(10, type="integer", minimum=1, maximum=300,
                                 title="Admin call timeout (s)", description="Per admin API request."),
    },
    user_defined_macros=dag_support.macros(PROJECT_ROOT),
    max_active_runs=1,
):
    SparkSubmitOperator(
        task_id="check_clusters",
        conn_id="spark_default",
        application=str(PROJECT_ROOT / "spark_jobs" / "smoke_admin.py"),
        name="pulsar-smoke-admin",
        # Built in the worker at render time; spark-submit ships it to wherever the executors run.
        py_files="{{ pulsar_library_zip() }}",
        application_args=[
            "--clusters", "{{ pulsar_clusters_json(" + _CONNS + ") }}",
            "--output", _RUN_DIR + "/smoke_admin.json",
            "--timeout", "{{ params.admin_timeout_s }}",
        ],
        env_vars=dag_support.token_env_vars(CLUSTER_CONN_IDS),
        conf={"spark.ui.enabled": "false"},
        pool="pulsar_admin",
        retries=0,
    )
