"""The Airflow UI in a real browser (Debian's chromium driven by Playwright), against a real Airflow standalone
that `python -m localdev.airflow_local` starts (idempotently, credentials shown once, settings applied before
start-up) and stops (nothing of its home left running):

1. the connection form offers the **Pulsar** type with its own fields; a connection made there is saved with
   them in extra, and its *Test* button reaches cluster-a through PulsarHook.test_connection;
2. the trigger form of pulsar_tenant_migration, filled with that connection as the source, a tenant and *Dry
   run*, starts the one DAG run of this test, which succeeds;
3. the run's "Migration report" tab and the "Pulsar migrations" view (Browse menu) show its report, verdict
   planned.

Around it, over plain HTTP: the plugin refuses requests without Airflow's login and crafted paths. Airflow runs
with its own home, ports and run dirs under tmp_path (beside a developer's `make airflow`), with its own lookup
service. Screenshots land in tmp_path/screenshots, named by step (`failure.png` when a step fails).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from localdev.demo import AirflowApi
from localdev.pulsar_local import LocalCluster
from playwright.sync_api import FrameLocator, Page, sync_playwright
from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.dag_support import run_dir

from tests.conftest import unique
from tests.integration.airflow_helpers import free_port_block, listening, marked
from tests.integration.lookup_helpers import TOKEN, start_service
from tests.integration.tenant_builders import drop_tenant, snapshot

log = logging.getLogger(__name__)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

DAG_ID = "pulsar_tenant_migration"
PASSWORD = "ui-test-admin-pw"
CHROMIUM = "/usr/bin/chromium"
UI_CONN = "pulsar_ui_source"
# A dry run is five spark-submits (about 90 s alone); the other xdist worker shares the two cores.
RUN_TIMEOUT_S = 1200.0
STEP_TIMEOUT_MS = 90_000


def airflow_env(home: Path, lookup_port: int) -> tuple[str, dict[str, str]]:
    """URL and environment of an Airflow standalone with its own var dir, port and run dirs under `home`."""
    port = free_port_block()
    # Nothing of the pytest process's own Airflow settings (tests/dags/conftest.py) leaks into this one.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env |= {"PM_VAR_DIR": str(home / "var"), "PM_AIRFLOW_PORT": str(port), "PM_AIRFLOW_ADMIN_PASSWORD": PASSWORD,
            "AIRFLOW_VAR_PULSAR_MIGRATION_RUN_DIR_BASE": str(home / "runs"),
            # Each DAG file parsed once, at start-up: re-parsing all five every 30 s (the default) was the DAG
            # processor's forks, about a sixth of this test's CPU; no DAG file changes while it runs.
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "3600",
            "AIRFLOW_CONN_PULSAR_LOOKUP": json.dumps({"conn_type": "http", "host": "127.0.0.1", "port": lookup_port,
                                                      "schema": "http", "password": TOKEN})}
    return f"http://127.0.0.1:{port}", env


def airflow_cli(env: dict[str, str], command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "localdev.airflow_local", command], env=env, capture_output=True,
                          text=True, timeout=600, check=False)


@pytest.fixture
def tenant(admin_a: PulsarAdmin, cluster_a: LocalCluster) -> Iterator[str]:
    name = unique("ui-dry")
    admin_a.put(f"/tenants/{name}", {"adminRoles": [], "allowedClusters": [cluster_a.name]})
    admin_a.put(f"/namespaces/{name}/ns")
    admin_a.put(f"/persistent/{name}/ns/orders/partitions", 2)
    yield name
    drop_tenant(name, admin_a)


def login(page: Page, url: str) -> None:
    page.goto(f"{url}/")
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", PASSWORD)
    page.click("button:has-text('Sign in')")
    page.wait_for_url(f"{url}/")


def add_pulsar_connection(page: Page, url: str, cluster: LocalCluster, shots: Path) -> dict[str, Any]:
    """Admin -> Connections -> Add: type Pulsar, its fields filled for `cluster`, saved, then tested from the
    list. Returns the answer of the test the browser asked for."""
    page.goto(f"{url}/connections")
    page.get_by_role("button", name="Add Connection").click()
    dialog = page.get_by_role("dialog")
    dialog.locator("input[name=connection_id]").fill(UI_CONN)
    dialog.get_by_role("combobox").fill("Puls")
    page.get_by_role("option", name="Pulsar", exact=True).click()
    # The provider's ui-field-behaviour: relabelled standard fields, no login.
    for label in ("Admin host", "Admin port", "Admin scheme (http/https)", "Token"):
        assert dialog.get_by_label(label, exact=True).is_visible(), label
    assert dialog.locator("input[name=login]").count() == 0
    dialog.get_by_label("Admin host", exact=True).fill("127.0.0.1")
    dialog.get_by_label("Admin port", exact=True).fill(str(cluster.web_port))
    dialog.get_by_label("Admin scheme (http/https)", exact=True).fill("http")
    # Its conn-fields, stored in extra.
    dialog.get_by_role("button", name="Extra Fields", exact=True).click()
    for label in ("Cluster name", "Service URL", "TLS"):
        assert dialog.locator("label", has_text=label).first.is_visible(), label
    dialog.locator("#element_cluster_name").fill(cluster.name)
    dialog.locator("#element_service_url").fill(cluster.service_url)
    page.screenshot(path=str(shots / "1-pulsar-connection-form.png"), full_page=True)
    dialog.get_by_role("button", name="Save").click()
    row = page.get_by_role("row").filter(has_text=UI_CONN)
    with page.expect_response(lambda r: r.url.endswith("/api/v2/connections/test")) as tested:
        row.get_by_role("button", name="Test Connection").click()
    page.screenshot(path=str(shots / "2-connection-tested.png"))
    return tested.value.json()


def trigger_dry_run(page: Page, url: str, tenant: str, shots: Path) -> str:
    """The DAG's trigger form: the UI-made connection as source, the tenant, Dry run ticked; trigger. Returns the
    id of the run the form's POST created."""
    page.goto(f"{url}/dags/{DAG_ID}")
    page.get_by_role("button", name="Trigger").first.click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_role("button", name="Clusters").click()
    dialog.locator("#element_source_conn").fill(UI_CONN)
    dialog.get_by_role("button", name="What to take").click()
    dialog.locator("#element_tenant").fill(tenant)
    dialog.get_by_role("button", name="Behaviour").click()
    dialog.locator("label:has(input[name=element_dry_run])").click()
    assert dialog.locator("input[name=element_dry_run]").is_checked()
    page.screenshot(path=str(shots / "3-trigger-form.png"))
    with page.expect_response(lambda r: r.url.endswith(f"/api/v2/dags/{DAG_ID}/dagRuns")
                              and r.request.method == "POST") as triggered:
        dialog.get_by_role("button", name="Trigger").last.click()
    assert triggered.value.status < 300, triggered.value.text()
    page.screenshot(path=str(shots / "4-triggered.png"))
    return str(triggered.value.json()["dag_run_id"])


def wait_for_run(api: AirflowApi, run_id: str) -> dict[str, Any]:
    """The run once finished, asked for by its id every 3 s (one run read, not the DAG's run list)."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    run: dict[str, Any] = {}
    while True:
        try:
            run = api.call("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}")
        except requests.Timeout:  # a busy machine can keep the API server from answering one poll
            pass
        if run.get("state") in ("success", "failed"):
            return run
        assert time.monotonic() < deadline, f"run {run_id} not finished after {RUN_TIMEOUT_S:.0f}s: {run}"
        time.sleep(3)


def assert_every_step_planned(rdir: Path) -> None:
    """The dry run's reports: each step planned from what exists now (the target has no topics yet, so
    replicate_topics plans against nothing and sync_progress has no position map to translate)."""
    def report(step: str) -> dict[str, Any]:
        return json.loads((rdir / f"{step}.json").read_text())

    metadata = report("sync_metadata")
    assert metadata["verdict"] == "planned" and metadata["dry_run"] is True and metadata["counts"]["CREATE"] > 0
    for step in ("replicate_topics", "sync_progress"):
        planned = report(step)
        assert planned["verdict"] == "planned" and planned["counts"]["partitions"] == 2, (step, planned["counts"])
    for step in ("switch_lookup", "cleanup_source"):
        assert report(step)["verdict"] == "planned", step
    assert json.loads((rdir / "report.json").read_text())["verdict"] == "planned" and (rdir / "report.md").is_file()


def plugin_frame(page: Page) -> FrameLocator:
    frame = page.frame_locator("iframe").first
    frame.locator("body h1").wait_for()
    return frame


def report_tab(page: Page, url: str, run_id: str, shots: Path) -> str:
    """The run's page -> its "Migration report" tab: the report's verdict line."""
    page.goto(f"{url}/dags/{DAG_ID}/runs/{run_id}")
    page.get_by_text("Migration report", exact=True).click()
    page.wait_for_url("**/plugin/pulsar-migration-report")
    verdict = plugin_frame(page).locator("p.verdict").inner_text()
    page.screenshot(path=str(shots / "5-report-tab.png"), full_page=True)
    return verdict


def migrations_view(page: Page, run_id: str, shots: Path) -> tuple[str, str]:
    """Browse -> Pulsar migrations: the list's text, then the verdict line of the run's report opened from it."""
    page.get_by_role("button", name="Browse").click()
    page.get_by_role("menuitem", name="Pulsar migrations").click()
    frame = plugin_frame(page)
    listing = frame.locator("table").inner_text()
    page.screenshot(path=str(shots / "6-migrations-view.png"), full_page=True)
    frame.get_by_role("link", name=run_id).click()
    verdict = frame.locator("p.verdict").inner_text()
    page.screenshot(path=str(shots / "7-report-from-view.png"), full_page=True)
    return listing, verdict


def check_started_once(url: str, env: dict[str, str], home: Path) -> None:
    """The standalone is healthy with the fixed credentials (a wrong password is refused), the settings file
    was applied before start-up, and a second start changes nothing and shows no credentials."""
    assert "healthy at" in airflow_cli(env, "status").stdout
    token_url = f"{url}/auth/token"
    assert requests.post(token_url, json={"username": "admin", "password": "nope"}, timeout=30).status_code == 401
    token = requests.post(token_url, json={"username": "admin", "password": PASSWORD}, timeout=30).json()
    conn = requests.get(f"{url}/api/v2/connections/spark_default", timeout=30,
                        headers={"Authorization": f"Bearer {token['access_token']}"})
    assert conn.ok and conn.json()["host"] == "local[*]"
    again = airflow_cli(env, "start")
    assert again.returncode == 0 and "password" not in again.stdout, again.stdout
    assert "already running" in again.stderr
    assert marked(home / "var" / "airflow")


def check_plugin_http(url: str, api: AirflowApi) -> None:
    """Without Airflow's login the plugin answers 401; with it, crafted paths and runs without a report are
    refused."""
    for path in ("/pulsar-migrations/", f"/pulsar-migrations/runs/{DAG_ID}/x"):
        assert requests.get(f"{url}{path}", timeout=30).status_code == 401, path
    assert requests.get(f"{url}/pulsar-migrations/", headers={"Authorization": "Bearer forged"},
                        timeout=30).status_code == 403
    traversal = api.session.get(f"{url}/pulsar-migrations/runs/{DAG_ID}/..", timeout=30)
    assert traversal.status_code in (400, 404), traversal.text
    missing = api.session.get(f"{url}/pulsar-migrations/runs/{DAG_ID}/never", timeout=30)
    assert missing.status_code == 404 and "has no migration report" in missing.text, missing.text


def test_a_dry_run_triggered_in_the_browser_shows_its_report_in_the_plugin(
    tmp_path: Path, cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin, admin_b: PulsarAdmin,
    tenant: str,
) -> None:
    """Also the DAG's dry run itself (the one dry run of the suite): every step plans, nothing changes."""
    assert Path(CHROMIUM).is_file(), f"{CHROMIUM} is missing: apt-get install -y chromium (scripts/setup_venv.sh)"
    shots = tmp_path / "screenshots"
    shots.mkdir()
    (tmp_path / "lookup").mkdir()
    lookup = start_service(tmp_path / "lookup", [cluster_a, cluster_b], cluster_a)
    url, env = airflow_env(tmp_path, lookup.port)
    try:
        started = airflow_cli(env, "start")
        assert started.returncode == 0, started.stderr[-3000:]
        assert f"user: admin  password: {PASSWORD}" in started.stdout
        check_started_once(url, env, tmp_path)
        api = AirflowApi(url, "admin", PASSWORD)
        api.wait_for_dag(DAG_ID)
        api.call("PATCH", f"/dags/{DAG_ID}", json={"is_paused": False})
        check_plugin_http(url, api)

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(STEP_TIMEOUT_MS)
            try:
                login(page, url)
                tested = add_pulsar_connection(page, url, cluster_a, shots)
                assert tested["status"] is True and "cluster-a answers" in tested["message"], tested
                saved = api.call("GET", f"/connections/{UI_CONN}")
                assert (saved["conn_type"], saved["host"], saved["port"]) == ("pulsar", "127.0.0.1", cluster_a.web_port)
                assert json.loads(saved["extra"]) == {"cluster_name": "cluster-a", "service_url": cluster_a.service_url,
                                                      "listener_name": None, "token_file": None, "oauth2": None,
                                                      "tls": None}

                before = (snapshot(admin_a, tenant), admin_a.get(f"/tenants/{tenant}"), snapshot(admin_b, tenant))
                assert before[2] == {"tenant": None}
                run_id = trigger_dry_run(page, url, tenant, shots)
                page.goto("about:blank")  # the DAG page re-renders as the run goes: half a core taken from Spark
                run = wait_for_run(api, run_id)
                assert run["state"] == "success", api.failure_summary(DAG_ID, run_id)
                assert run["conf"]["tenant"] == tenant
                assert run["conf"]["dry_run"] is True and run["conf"]["source_conn"] == UI_CONN
                assert (snapshot(admin_a, tenant), admin_a.get(f"/tenants/{tenant}"),
                        snapshot(admin_b, tenant)) == before
                assert_every_step_planned(Path(run_dir(str(tmp_path / "runs"), DAG_ID, run["dag_run_id"])))
                assert lookup.api("GET", f"/routes/{tenant}").json()["held"] is False

                headline = f"Tenant {tenant}: cluster-a -> cluster-b (copy mode): verdict planned"
                assert headline in report_tab(page, url, run["dag_run_id"], shots)
                listing, verdict = migrations_view(page, run["dag_run_id"], shots)
                assert headline in verdict
                (row,) = [line for line in listing.splitlines() if line.startswith(run["dag_run_id"])]
                assert row.split("\t")[1:5] == [tenant, "cluster-a", "cluster-b", "planned"], row
            except Exception:
                page.screenshot(path=str(shots / "failure.png"), full_page=True)
                raise
            finally:
                browser.close()
        log.info("screenshots in %s", shots)
    finally:
        stopped = airflow_cli(env, "stop")
        lookup.stop()
    assert stopped.returncode == 0, stopped.stderr
    assert marked(tmp_path / "var" / "airflow") == []
    assert not listening(int(url.rsplit(":", 1)[1]))
    assert "stopped" in airflow_cli(env, "status").stdout
