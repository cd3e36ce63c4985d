"""Running a project DAG with `dag.test()` and reading back what its tasks stored (XCom, rendered fields)."""

from __future__ import annotations

import logging
import time
from typing import Any

from airflow.dag_processing.dagbag import DagBag
from airflow.models.dagrun import DagRun
from airflow.models.renderedtifields import RenderedTaskInstanceFields
from airflow.models.xcom import XComModel
from airflow.utils.session import create_session
from sqlalchemy import select

from tests.dags.conftest import DAGS_DIR

log = logging.getLogger(__name__)


def run_dag(dag_id: str, **test_kwargs: Any) -> tuple[DagRun, dict[str, str | None]]:
    """One `dag.test(**test_kwargs)` on a freshly parsed DAG; returns the run and its task states."""
    dag = DagBag(dag_folder=str(DAGS_DIR / f"{dag_id}.py")).dags[dag_id]
    started = time.monotonic()
    dag_run = dag.test(**test_kwargs)
    log.info("%s dag.test(%s) took %.1fs", dag_id, test_kwargs, time.monotonic() - started)
    return dag_run, {ti.task_id: ti.state for ti in dag_run.get_task_instances()}


def xcom(dag_run: DagRun, task_id: str) -> Any:
    """The task's return value as stored in the metadata DB (None when it pushed none)."""
    with create_session() as session:
        row = session.scalars(XComModel.get_many(run_id=dag_run.run_id, dag_ids=dag_run.dag_id, task_ids=task_id,
                                                 key="return_value")).first()
        return None if row is None else XComModel.deserialize_value(row)


def rendered_fields(dag_run: DagRun, task_id: str) -> dict[str, Any]:
    """The task's rendered template fields as stored for the UI's "Rendered Template" view."""
    rtif = RenderedTaskInstanceFields
    with create_session() as session:
        return session.scalars(select(rtif.rendered_fields).where(
            rtif.dag_id == dag_run.dag_id, rtif.run_id == dag_run.run_id, rtif.task_id == task_id)).one()
