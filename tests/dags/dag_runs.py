"""Running a project DAG with `dag.test()` and reading back what its tasks stored (XCom, rendered fields)."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from airflow.dag_processing.dagbag import DagBag
from airflow.models.dagrun import DagRun
from airflow.models.renderedtifields import RenderedTaskInstanceFields
from airflow.models.xcom import XComModel
from airflow.utils.session import create_session
from sqlalchemy import select

from tests.dags.conftest import DAGS_DIR, RUNS_DIR

log = logging.getLogger(__name__)


def run_dag(dag_id: str, **test_kwargs: Any) -> tuple[DagRun, dict[str, str | None]]:
    """One `dag.test(**test_kwargs)` on a freshly parsed DAG; returns the run and its task states."""
    dag = DagBag(dag_folder=str(DAGS_DIR / f"{dag_id}.py")).dags[dag_id]
    started = time.monotonic()
    dag_run = dag.test(**test_kwargs)
    log.info("%s dag.test(%s) took %.1fs", dag_id, test_kwargs, time.monotonic() - started)
    return dag_run, {ti.task_id: ti.state for ti in dag_run.get_task_instances()}


def failures(dag_run: DagRun, states: dict[str, str | None]) -> str:
    """Why a run failed, for an assertion message: each failed step report's error first (CI shows the start of
    the message only), then the task states."""
    from pulsar_migration.dag_support import run_dir

    errors = []
    rdir = Path(run_dir(str(RUNS_DIR), dag_run.dag_id, dag_run.run_id))
    for path in sorted(rdir.glob("*.json")) if rdir.is_dir() else []:
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(report, dict) and report.get("error"):
            errors.append(f"{path.stem}: {report['error']}")
    failed = sorted(task for task, state in states.items() if state == "failed")
    return f"{'; '.join(errors) or 'no step report names an error'} | failed tasks {failed} | {states}"


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
