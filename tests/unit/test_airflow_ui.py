"""The Pulsar connection type's provider info (validated against Airflow's own schema, and found by Airflow
through the installed entry point) and the UI plugin's run listing and path safety."""

from __future__ import annotations

import json
import os
from importlib.metadata import entry_points
from importlib.util import find_spec
from pathlib import Path

import jsonschema
import pytest
from packaging.utils import canonicalize_name
from pulsar_migration import dag_support, migration_report
from pulsar_migration.airflow import ui
from pulsar_migration.airflow.provider import get_provider_info


def test_provider_info_is_valid_for_airflow_and_installed_as_an_entry_point() -> None:
    # Airflow's runtime schema, read without importing Airflow (which would settle its AIRFLOW_HOME here).
    (schema_file,) = [Path(d) / "provider_info.schema.json" for d in find_spec("airflow").submodule_search_locations
                      if (Path(d) / "provider_info.schema.json").is_file()]
    schema = json.loads(schema_file.read_text())
    info = get_provider_info()
    jsonschema.validate(info, schema)
    (found,) = [ep for ep in entry_points(group="apache_airflow_provider") if ep.value.startswith("pulsar_migration")]
    # Airflow refuses the provider unless package-name is the distribution's canonical name.
    assert canonicalize_name(found.dist.metadata["Name"]) == info["package-name"] == found.load()()["package-name"]
    (conn_type,) = info["connection-types"]
    assert conn_type["connection-type"] == "pulsar" and set(conn_type["conn-fields"]) == {
        "cluster_name", "service_url", "listener_name", "token_file", "oauth2", "tls"}


def write_report(base: Path, run_id: str, verdict: str) -> Path:
    directory = Path(dag_support.run_dir(str(base), dag_support.MIGRATION_DAG_ID, run_id))
    directory.mkdir(parents=True)
    summary = {"dag_id": dag_support.MIGRATION_DAG_ID, "run_id": run_id, "verdict": verdict, "tenant": "acme",
               "source": "a", "target": "b", "lost": 0, "duplicated": 0, "meaning": f"<i>{verdict}</i> in words"}
    (directory / migration_report.SUMMARY_FILE).write_text(json.dumps(summary))
    (directory / migration_report.HTML_FILE).write_text(f"<p>{run_id} {verdict}</p>")
    return directory


def test_runs_are_listed_with_verdicts_and_their_reports_served(tmp_path: Path) -> None:
    older = write_report(tmp_path, "manual__2026-11-23T08:00:00+00:00", "planned")
    os.utime(older / migration_report.SUMMARY_FILE, (1_000_000, 1_000_000))
    write_report(tmp_path, "manual__<b>", "failed")
    (write_report(tmp_path, "manual__torn", "ok") / migration_report.SUMMARY_FILE).write_text('{"verdict": ')
    runs = ui.list_runs(str(tmp_path))
    # Newest first; a report that cannot be read is left out.
    assert [(r["run_id"], r["verdict"]) for r in runs] == [
        ("manual__<b>", "failed"), ("manual__2026-11-23T08:00:00+00:00", "planned")]
    page = ui.runs_page(runs)
    assert "manual__&lt;b&gt;" in page and "<b>" not in page.replace("<body>", "")  # escaped
    assert 'href="runs/pulsar_tenant_migration/manual__2026-11-23T08%3A00%3A00%2B00%3A00"' in page
    assert '<td title="&lt;i&gt;planned&lt;/i&gt; in words">planned</td>' in page  # the verdict's words, escaped
    assert ui.report_page(str(tmp_path), dag_support.MIGRATION_DAG_ID,
                          "manual__2026-11-23T08:00:00+00:00") == "<p>manual__2026-11-23T08:00:00+00:00 planned</p>"
    assert ui.report_page(str(tmp_path), dag_support.MIGRATION_DAG_ID, "manual__never") is None
    assert "<p>run &lt;x&gt; has none</p>" in ui.message_page("Migration report", "run <x> has none")
    assert "No migration has written a report yet." in ui.runs_page([])


@pytest.mark.parametrize(("dag_id", "run_id"), [("..", "x"), (dag_support.MIGRATION_DAG_ID, ".."),
                                                 ("..", ".."), (".", "x")])
def test_ids_that_leave_the_run_dirs_are_refused(tmp_path: Path, dag_id: str, run_id: str) -> None:
    (tmp_path / "secret.html").write_text("no")
    with pytest.raises(ui.UnsafeRunPath):
        ui.report_page(str(tmp_path / "runs"), dag_id, run_id)
