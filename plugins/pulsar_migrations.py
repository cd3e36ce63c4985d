"""The "Pulsar migrations" Airflow UI plugin: a nav entry listing the migration runs with their verdicts, and a
tab on each DAG run showing its migration report (RUN_DIR/report.html). Served by the API server as a FastAPI
app behind Airflow's own login (the UI's session cookie or a bearer token; DAG-run read permission checked);
the logic is in pulsar_migration.airflow.ui."""

from __future__ import annotations

from pathlib import Path

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.core_api.security import requires_access_dag
from airflow.models import Variable
from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI, HTTPException
from fastapi.responses import HTMLResponse
from pulsar_migration import dag_support
from pulsar_migration.airflow import ui

PROJECT_ROOT = Path(__file__).resolve().parents[1]
PREFIX = "/pulsar-migrations"

app = FastAPI(title="Pulsar migrations", description="Migration runs and their reports.")


def _base() -> str:
    return str(Variable.get(dag_support.RUN_DIR_BASE_VARIABLE, default_var=dag_support.DEFAULT_RUN_DIR_BASE))


@app.get("/", response_class=HTMLResponse,
         dependencies=[Depends(requires_access_dag("GET", DagAccessEntity.RUN,
                                                   param_dag_id=dag_support.MIGRATION_DAG_ID))])
def runs() -> str:
    return ui.runs_page(ui.list_runs(_base(), PROJECT_ROOT))


@app.get("/runs/{dag_id}/{run_id}", response_class=HTMLResponse,
         dependencies=[Depends(requires_access_dag("GET", DagAccessEntity.RUN))])
def report(dag_id: str, run_id: str) -> HTMLResponse:
    try:
        page = ui.report_page(_base(), dag_id, run_id, PROJECT_ROOT)
    except ui.UnsafeRunPath as exc:
        raise HTTPException(status_code=400, detail=str(exc)) from None
    if page is None:  # every DAG run has the tab: say so on the page rather than in JSON
        return HTMLResponse(ui.message_page("Migration report", f"Run {run_id} of {dag_id} has no migration "
                                            "report (yet): it is written by the last task of "
                                            f"{dag_support.MIGRATION_DAG_ID}."), status_code=404)
    return HTMLResponse(page)


class PulsarMigrationsPlugin(AirflowPlugin):
    name = "pulsar_migrations"
    fastapi_apps = [{"app": app, "url_prefix": PREFIX, "name": "Pulsar migrations"}]
    external_views = [
        {"name": "Pulsar migrations", "href": f"{PREFIX}/", "destination": "nav", "url_route": "pulsar-migrations",
         "category": "browse"},
        {"name": "Migration report", "href": f"{PREFIX}/runs/{{DAG_ID}}/{{RUN_ID}}", "destination": "dag_run",
         "url_route": "pulsar-migration-report"},
    ]
