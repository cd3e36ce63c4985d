"""The Pulsar connection type's provider info (validated against Airflow's own schema, and found by Airflow
through the installed entry point) and the UI plugin's run listing and path safety."""

from __future__ import annotations

import json
from importlib.metadata import entry_points
from pathlib import Path

import jsonschema
import pytest
from pulsar_migration import dag_support, migration_report
from pulsar_migration.airflow import ui
from pulsar_migration.airflow.provider import get_provider_info


def test_provider_info_is_valid_for_airflow_and_installed_as_an_entry_point() -> None:
    import airflow

    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    jsonschema.validate(get_provider_info(), schema)
    found = [ep for ep in entry_points(group="apache_airflow_provider") if ep.value.startswith("pulsar_migration")]
    assert [ep.load()()["package-name"] for ep in found] == ["pulsar-migration"]
    (conn_type,) = get_provider_info()["connection-types"]
    assert conn_type["connection-type"] == "pulsar" and set(conn_type["conn-fields"]) == {"cluster_name",
                                                                                            "service_url"}


def write_report(base: Path, run_id: str, verdict: str) -> Path:
    directory = Path(dag_support.run_dir(str(base), dag_support.MIGRATION_DAG_ID, run_id))
    directory.mkdir(parents=True)
    summary = {"dag_id": dag_support.MIGRATION_DAG_ID, "run_id": run_id, "verdict": verdict, "tenant": "acme",
               "source": "a", "target": "b", "lost": 0, "duplicated": 0}
    (directory / migration_report.SUMMARY_FILE).write_text(json.dumps(summary))
    (directory / migration_report.HTML_FILE).write_text(f"<p>{run_id} {verdict}</p>")
    return directory


def test_runs_are_listed_with_verdicts_and_their_reports_served(tmp_path: Path) -> None:
    write_report(tmp_path, "manual__2026-11-23T08:00:00+00:00", "planned")
    write_report(tmp_path, "manual__<b>", "failed")
    runs = ui.list_runs(str(tmp_path))
    assert sorted((r["run_id"], r["verdict"]) for r in runs) == [
        ("manual__2026-11-23T08:00:00+00:00", "planned"), ("manual__<b>", "failed")]
    page = ui.runs_page(runs, "/pulsar-migrations")
    assert "manual__&lt;b&gt;" in page and "<b>" not in page.replace("<body>", "")  # escaped
    assert "/pulsar-migrations/runs/pulsar_tenant_migration/manual__2026-11-23T08%3A00%3A00%2B00%3A00" in page
    assert ui.report_page(str(tmp_path), dag_support.MIGRATION_DAG_ID,
                          "manual__2026-11-23T08:00:00+00:00") == "<p>manual__2026-11-23T08:00:00+00:00 planned</p>"
    assert ui.report_page(str(tmp_path), dag_support.MIGRATION_DAG_ID, "manual__never") is None


@pytest.mark.parametrize(("dag_id", "run_id"), [("..", "x"), (dag_support.MIGRATION_DAG_ID, ".."),
                                                 ("..", ".."), (".", "x")])
def test_ids_that_leave_the_run_dirs_are_refused(tmp_path: Path, dag_id: str, run_id: str) -> None:
    (tmp_path / "secret.html").write_text("no")
    with pytest.raises(ui.UnsafeRunPath):
        ui.report_page(str(tmp_path / "runs"), dag_id, run_id)
