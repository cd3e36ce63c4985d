"""Every DAG file imports cleanly and carries what the UI and reviewers need."""

from __future__ import annotations

import pytest
from airflow.dag_processing.dagbag import DagBag
from localdev.airflow_settings import load_settings

from tests.dags.conftest import DAGS_DIR


@pytest.fixture(scope="module")
def dagbag() -> DagBag:
    return DagBag(dag_folder=str(DAGS_DIR))


def test_no_import_errors(dagbag: DagBag) -> None:
    assert not dagbag.import_errors, "\n".join(f"{f}: {e}" for f, e in dagbag.import_errors.items())
    assert dagbag.dags, f"no DAGs found in {DAGS_DIR}"


def test_every_dag_has_tags_and_doc(dagbag: DagBag) -> None:
    for dag_id, dag in dagbag.dags.items():
        assert dag.tags, f"{dag_id} has no tags"
        assert dag.doc_md and dag.doc_md.strip(), f"{dag_id} has no doc_md"


def test_pools_and_spark_connections_are_in_airflow_settings(dagbag: DagBag) -> None:
    """A task on a pool or connection the local environment lacks would queue forever or fall back to yarn."""
    settings = load_settings()
    pools = {p.name for p in settings.pools} | {"default_pool"}
    conns = {c.conn_id for c in settings.connections}
    for dag_id, dag in dagbag.dags.items():
        for task in dag.tasks:
            assert task.pool in pools, f"{dag_id}.{task.task_id}: pool {task.pool!r} is not in airflow_settings.yaml"
            if task.task_type == "SparkSubmitOperator":
                conn_id = getattr(task, "_conn_id", None)
                assert conn_id in conns, f"{dag_id}.{task.task_id}: connection {conn_id!r} not in airflow_settings.yaml"
