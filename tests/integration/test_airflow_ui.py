"""The Airflow UI in a real browser (Debian's chromium driven by Playwright): log in, fill the trigger form of
pulsar_tenant_migration, trigger a dry run, and read the run's report in the plugin's tab and in the "Pulsar
migrations" view. Around it, over HTTP: the plugin refuses requests without Airflow's login and crafted paths,
and the connection form offers the Pulsar connection type with its fields.

Runs its own Airflow standalone (own var dir and ports, beside a developer's `make airflow`) and its own
lookup service. Screenshots land in the test's tmp_path (`screenshots/`), named by step.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import requests
from localdev.demo import AirflowApi
from localdev.pulsar_local import LocalCluster
from playwright.sync_api import Page, sync_playwright
from pulsar_migration.admin import PulsarAdmin

from tests.conftest import unique
from tests.integration.lookup_helpers import TOKEN, start_service
from tests.integration.test_airflow_local import free_port_block

log = logging.getLogger(__name__)

DAG_ID = "pulsar_tenant_migration"
PASSWORD = "ui-test-admin-pw"
CHROMIUM = "/usr/bin/chromium"
RUN_TIMEOUT_S = 600.0


def login(page: Page, url: str) -> None:
    page.goto(f"{url}/")
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", PASSWORD)
    page.click("button:has-text('Sign in')")
    page.wait_for_url(f"{url}/", timeout=60_000)


def trigger_dry_run(page: Page, url: str, tenant: str, shots: Path) -> None:
    """The DAG's trigger form: open it, fill the tenant, tick Dry run, trigger."""
    page.goto(f"{url}/dags/{DAG_ID}")
    page.get_by_role("button", name="Trigger").first.click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_role("button", name="What to take").click()
    dialog.locator("#element_tenant").fill(tenant)
    dialog.get_by_role("button", name="Behaviour").click()
    dialog.locator("label:has(input[name=element_dry_run])").click()
    assert dialog.locator("input[name=element_dry_run]").is_checked()
    page.screenshot(path=str(shots / "1-trigger-form.png"))
    dialog.get_by_role("button", name="Trigger").last.click()
    page.wait_for_timeout(2000)
    page.screenshot(path=str(shots / "2-triggered.png"))


def wait_for_run(api: AirflowApi, tenant: str) -> dict[str, Any]:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while True:
        runs = [r for r in api.call("GET", f"/dags/{DAG_ID}/dagRuns")["dag_runs"] if (r.get("conf") or {})
                .get("tenant") == tenant]
        if runs and runs[0]["state"] in ("success", "failed"):
            return runs[0]
        assert time.monotonic() < deadline, f"no finished run for {tenant} after {RUN_TIMEOUT_S:.0f}s: {runs}"
        time.sleep(3)


def test_a_dry_run_triggered_in_the_browser_shows_its_report_in_the_plugin(
    tmp_path: Path, cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin,
) -> None:
    tenant = unique("ui-dry")
    admin_a.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": [cluster_a.name]})
    admin_a.put(f"/namespaces/{tenant}/ns")
    admin_a.put(f"/persistent/{tenant}/ns/orders/partitions", 2)
    shots = tmp_path / "screenshots"
    shots.mkdir()
    (tmp_path / "lookup").mkdir()
    lookup = start_service(tmp_path / "lookup", [cluster_a, cluster_b], cluster_a)
    port = free_port_block()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PM_VAR_DIR": str(tmp_path / "var"), "PM_AIRFLOW_PORT": str(port),
           "PM_AIRFLOW_ADMIN_PASSWORD": PASSWORD,
           "AIRFLOW_VAR_PULSAR_MIGRATION_RUN_DIR_BASE": str(tmp_path / "runs"),
           "AIRFLOW_CONN_PULSAR_LOOKUP": f'{{"conn_type": "http", "host": "127.0.0.1", "port": {lookup.port}, '
                                         f'"schema": "http", "password": "{TOKEN}"}}'}

    def airflow(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "localdev.airflow_local", *args], env=env, capture_output=True,
                              text=True, timeout=400, check=False)

    try:
        started = airflow("start")
        assert started.returncode == 0, started.stderr[-3000:]
        api = AirflowApi(url, "admin", PASSWORD)
        api.wait_for_dag(DAG_ID)
        api.call("PATCH", f"/dags/{DAG_ID}", json={"is_paused": False})

        # The plugin is behind Airflow's login, and crafted paths do not leave the run dirs.
        assert requests.get(f"{url}/pulsar-migrations/", timeout=30).status_code == 401
        assert requests.get(f"{url}/pulsar-migrations/runs/{DAG_ID}/x", timeout=30).status_code == 401
        traversal = api.session.get(f"{url}/pulsar-migrations/runs/{DAG_ID}/..", timeout=30)
        assert traversal.status_code in (400, 404), traversal.text
        assert api.session.get(f"{url}/pulsar-migrations/runs/{DAG_ID}/never", timeout=30).status_code == 404
        # The connection form offers the Pulsar type with its own fields (the form is built from this).
        hooks = {h["connection_type"]: h for h in api.session.get(f"{url}/ui/connections/hook_meta", timeout=30).json()}
        pulsar_type = hooks["pulsar"]
        assert pulsar_type["hook_name"] == "Pulsar" and set(pulsar_type["extra_fields"]) == {"cluster_name",
                                                                                              "service_url"}
        assert pulsar_type["standard_fields"]["password"]["title"] == "Token"

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 900})
                login(page, url)
                trigger_dry_run(page, url, tenant, shots)
                run = wait_for_run(api, tenant)
                assert run["state"] == "success", run
                assert run["conf"]["dry_run"] is True

                # The run's "Migration report" tab shows the plugin's page with this run's report.
                page.goto(f"{url}/dags/{DAG_ID}/runs/{run['dag_run_id']}")
                page.get_by_text("Migration report", exact=True).click()
                page.wait_for_url("**/plugin/pulsar-migration-report", timeout=60_000)
                frame = page.frame_locator("iframe").first
                frame.locator("body").wait_for(timeout=60_000)
                body = frame.locator("body").inner_text(timeout=60_000)
                page.screenshot(path=str(shots / "3-report-tab.png"), full_page=True)
                assert tenant in body and "planned" in body, body[:2000]
                # The nav view lists the run with its verdict.
                page.goto(f"{url}/pulsar-migrations/")
                listing = page.locator("body").inner_text()
                page.screenshot(path=str(shots / "4-migrations-view.png"), full_page=True)
                assert run["dag_run_id"] in listing and tenant in listing and "planned" in listing
            finally:
                browser.close()
        log.info("screenshots in %s", shots)
    finally:
        airflow("stop")
        lookup.stop()
        admin_a.delete(f"/tenants/{tenant}", params={"force": "true"})
