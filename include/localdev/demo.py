"""`make demo`: a tenant migration on the embedded default, driven through Airflow like a user would.

Starts the two local Pulsar clusters and Airflow standalone (each only if not running), seeds a
realistic tenant on cluster-a, then triggers the `pulsar_tenant_migration` DAG through Airflow's REST
API: first a dry run, then the real run. It waits for each DAG run, prints the step reports, compares
the tenant on both clusters, and leaves everything running so the UI can be explored.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any

import requests
from pulsar_migration.admin import PulsarAdmin

from localdev import airflow_local, lookup_local, pulsar_local
from localdev.demo_tenant import build_rich_tenant

log = logging.getLogger(__name__)

DAG_ID = "pulsar_tenant_migration"
PUBLISH_TASK = "publish_sync_metadata_report"
DEFAULT_TENANT = "acme"
LOOKUP_CONN = "pulsar_lookup"
RUN_TIMEOUT_S = 600.0


class DemoError(RuntimeError):
    """The demo could not complete (message: one line)."""


class AirflowApi:
    """The few Airflow 3 REST calls the demo needs, authenticated as the local admin."""

    def __init__(self, base_url: str, user: str, password: str) -> None:
        self.base_url = base_url.rstrip("/")
        token = requests.post(f"{self.base_url}/auth/token", json={"username": user, "password": password},
                              timeout=30)
        if token.status_code >= 300:
            raise DemoError(f"Airflow refused the admin login at {self.base_url}: HTTP {token.status_code}")
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token.json()['access_token']}"

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        resp = self.session.request(method, f"{self.base_url}/api/v2{path}", timeout=30, **kwargs)
        if resp.status_code >= 300:
            raise DemoError(f"{method} {path} failed with HTTP {resp.status_code}: {resp.text[:300]}")
        return resp.json() if resp.content else None

    def wait_for_dag(self, dag_id: str, timeout_s: float = 120.0) -> None:
        """The DAG processor parses new files asynchronously: wait until the DAG is known."""
        deadline = time.monotonic() + timeout_s
        while True:
            resp = self.session.get(f"{self.base_url}/api/v2/dags/{dag_id}", timeout=30)
            if resp.status_code == 200:
                return
            if time.monotonic() > deadline:
                raise DemoError(f"DAG {dag_id} did not appear in Airflow within {timeout_s:.0f}s")
            time.sleep(2.0)

    def trigger_and_wait(self, dag_id: str, conf: dict[str, Any], timeout_s: float = RUN_TIMEOUT_S) -> dict[str, Any]:
        run = self.call("POST", f"/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf})
        run_id = run["dag_run_id"]
        log.info("triggered %s run %s", dag_id, run_id)
        deadline = time.monotonic() + timeout_s
        while run["state"] not in ("success", "failed"):
            if time.monotonic() > deadline:
                raise DemoError(f"DAG run {run_id} still {run['state']} after {timeout_s:.0f}s")
            time.sleep(3.0)
            run = self.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}")
        return run

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str]:
        items = self.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
        return {ti["task_id"]: ti["state"] for ti in items}

    def return_value(self, dag_id: str, run_id: str, task_id: str) -> Any:
        entry = self.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/return_value",
                          params={"deserialize": "true"})
        return entry.get("value")


def tenant_summary(admin: PulsarAdmin, tenant: str) -> dict[str, int]:
    """Counts a person can compare at a glance (namespaces, topics, subscriptions)."""
    namespaces = admin.get(f"/namespaces/{tenant}")
    topics = subscriptions = 0
    for full in namespaces:
        partitioned = admin.get(f"/persistent/{full}/partitioned")
        plain = [t for t in admin.get(f"/persistent/{full}") if "-partition-" not in t]
        for topic in partitioned + plain:
            topics += 1
            subscriptions += len(admin.get(f"/persistent/{topic.split('://', 1)[1]}/subscriptions"))
    return {"namespaces": len(namespaces), "topics": topics, "subscriptions": subscriptions}


def run_demo(tenant: str) -> int:
    clusters = pulsar_local.start()
    source, target = clusters[0], clusters[1]
    airflow_local.start()
    lookup_url = lookup_local.start()
    admin_a, admin_b = source.admin(timeout_s=30), target.admin(timeout_s=30)
    if tenant in admin_a.get("/tenants"):
        log.info("tenant %s already on %s: migrating it as it is", tenant, source.name)
    else:
        build_rich_tenant(admin_a, tenant, [source.name])
        log.info("seeded tenant %s on %s", tenant, source.name)

    # The tenant's clients use the lookup service as their service URL: it routes the tenant to the source
    # until switch_lookup flips it.
    route = requests.put(f"{lookup_url}/api/v1/routes/{tenant}", timeout=30,
                         headers={"Authorization": f"Bearer {lookup_local.admin_token()}"},
                         json={"cluster": source.name, "reason": "demo: the tenant lives on the source",
                               "actor": "make demo"})
    if route.status_code >= 300:
        raise DemoError(f"the lookup service refused the route for {tenant}: HTTP {route.status_code}")

    url = f"http://localhost:{airflow_local.api_port()}"
    api = AirflowApi(url, airflow_local.ADMIN_USER, airflow_local.admin_password())
    # The DAG's pulsar_lookup connection gets the service's generated admin token as its password (the
    # settings file holds no secrets).
    api.call("PATCH", f"/connections/{LOOKUP_CONN}", params={"update_mask": "password"},
             json={"connection_id": LOOKUP_CONN, "conn_type": "http", "password": lookup_local.admin_token()})
    api.wait_for_dag(DAG_ID)
    api.call("PATCH", f"/dags/{DAG_ID}", json={"is_paused": False})
    conf = {"source_conn": "pulsar_cluster_a", "target_conn": "pulsar_cluster_b", "tenant": tenant}

    results = {}
    for label, dry_run in (("dry run", True), ("migration", False)):
        run = api.trigger_and_wait(DAG_ID, {**conf, "dry_run": dry_run})
        states = api.task_states(DAG_ID, run["dag_run_id"])
        report = api.return_value(DAG_ID, run["dag_run_id"], PUBLISH_TASK) if run["state"] == "success" else None
        results[label] = report
        sys.stdout.write(f"\n== {label}: DAG run {run['dag_run_id']} {run['state']}\n")
        for task_id, state in states.items():
            sys.stdout.write(f"   {task_id:<32} {state}\n")
        if report:
            counts = report.get("counts", {})
            sys.stdout.write("   plan: " + ", ".join(f"{a}={counts.get(a, 0)}" for a in
                                                        ("CREATE", "UPDATE", "CONFLICT", "NOOP")) + "\n")
        if run["state"] != "success":
            raise DemoError(f"the {label} DAG run failed; see the task logs at {url}/dags/{DAG_ID}")

    a_summary, b_summary = tenant_summary(admin_a, tenant), tenant_summary(admin_b, tenant)
    sys.stdout.write(f"\n== tenant {tenant}\n   {source.name}: {a_summary}\n   {target.name}: {b_summary}\n")
    hashes = (results["migration"] or {}).get("hashes", {})
    if a_summary != b_summary or not hashes or hashes.get("desired") != hashes.get("target_actual"):
        raise DemoError(f"tenant {tenant} differs between the clusters after the migration")
    sys.stdout.write(f"   verified: desired hash == target hash ({hashes['desired'][:16]})\n")
    routed = requests.get(f"{lookup_url}/api/v1/routes/{tenant}", timeout=30,
                          headers={"Authorization": f"Bearer {lookup_local.admin_token()}"}).json()
    if routed.get("cluster") != target.name:
        raise DemoError(f"the lookup service still routes {tenant} to {routed.get('cluster')} after the switch")
    sys.stdout.write(f"\nLookup service: {lookup_url} (clients' service URL; {tenant} -> {target.name} after the "
                     f"switch; admin token in {lookup_local.home() / 'admin_token'}). The source's copy was only "
                     "verified: trigger again with confirm_cleanup to delete it.\n")
    credentials = f"user {airflow_local.ADMIN_USER}, password {airflow_local.admin_password()}"
    sys.stdout.write(f"\nAirflow UI: {url}  ({credentials})\nStop everything with: make clean\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localdev.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tenant", default=DEFAULT_TENANT, help="tenant to seed on cluster-a and migrate")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        return run_demo(args.tenant)
    except (DemoError, pulsar_local.LocalClusterError, airflow_local.AirflowLocalError,
            lookup_local.LookupLocalError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
