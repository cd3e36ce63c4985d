"""`make demo`: a tenant migration on the embedded default, driven through Airflow like a user would.

Starts the two local Pulsar clusters and Airflow standalone (each only if not running), seeds a
realistic tenant on cluster-a, then triggers the `pulsar_tenant_migration` DAG through Airflow's REST
API: first a dry run, then the real run with live producers and consumers on the tenant's `live` namespace
running through the lookup service the whole time. It waits for each DAG run, prints the step reports, the
report's path, the run's wall time and each task's time, compares the tenant on both clusters, counts what
the live clients lost, got twice and how long their sends stalled, writes it all to
`var/demo/demo-<UTC time>.json`, and leaves everything running so the UI can be explored.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from datetime import UTC, datetime
from typing import Any

import requests
from pulsar_migration.admin import AdminError, PulsarAdmin

from localdev import airflow_local, lookup_local, pulsar_local
from localdev.demo_tenant import build_rich_tenant
from localdev.live_clients import LiveClients
from localdev.paths import var_dir

log = logging.getLogger(__name__)

DAG_ID = "pulsar_tenant_migration"
PUBLISH_TASK = "publish_sync_metadata_report"
DEFAULT_TENANT = "acme"
LOOKUP_CONN = "pulsar_lookup"
REPORT_TASK = "write_migration_report"
RUN_TIMEOUT_S = 600.0
LIVE_NAMESPACE = "live"
LIVE_TOPICS = 4
LIVE_RATE = 50.0  # messages/s over all live topics


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

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        return self.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]

    def failure_summary(self, dag_id: str, run_id: str, lines: int = 12) -> str:
        """The run's task states, and the last lines of each failed task's log: what a failed run's one error
        line should carry when nobody can open the UI (a CI log)."""
        tis = self.task_instances(dag_id, run_id)
        parts = [", ".join(f"{ti['task_id']}={ti['state']}" for ti in tis)]
        for ti in tis:
            if ti["state"] != "failed":
                continue
            try:
                content = self.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{ti['task_id']}/logs/"
                                    f"{max(ti.get('try_number') or 1, 1)}", params={"full_content": "true"},
                                    headers={"Accept": "application/json"})["content"]
            except (DemoError, requests.RequestException, KeyError) as exc:
                parts.append(f"{ti['task_id']}: log unreadable ({exc})")
                continue
            entries = content if isinstance(content, list) else str(content).splitlines()
            tail = [e.get("event", str(e)) if isinstance(e, dict) else str(e) for e in entries][-lines:]
            parts.append(f"{ti['task_id']} log tail:\n  " + "\n  ".join(tail))
        return "\n".join(parts)

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


def seed_live_namespace(admin: PulsarAdmin, tenant: str) -> list[str]:
    """The namespace the live clients use: retention keeps acknowledged messages for the copy, deduplication
    lets a producer's re-sends after the switch land once."""
    namespace = f"{tenant}/{LIVE_NAMESPACE}"
    if namespace not in admin.get(f"/namespaces/{tenant}"):
        admin.put(f"/namespaces/{namespace}")
    admin.post(f"/namespaces/{namespace}/retention", {"retentionTimeInMinutes": 120, "retentionSizeInMB": 512})
    admin.post(f"/namespaces/{namespace}/deduplication", True)
    topics = [f"persistent://{namespace}/t{i}" for i in range(LIVE_TOPICS)]
    existing = admin.get(f"/persistent/{namespace}")
    for topic in topics:
        if topic not in existing:
            admin.put(admin.topic_path(topic))
    return topics


def write_task_times(api: AirflowApi, run: dict[str, Any]) -> dict[str, Any]:
    """The run's wall time and each task's duration, printed and returned."""
    tis = api.task_instances(DAG_ID, run["dag_run_id"])
    started, ended = (datetime.fromisoformat(run[k]) for k in ("start_date", "end_date"))
    times = {"wall_s": round((ended - started).total_seconds(), 1),
             "tasks_s": {ti["task_id"]: round(ti["duration"] or 0.0, 1) for ti in tis}}
    sys.stdout.write(f"   wall time {times['wall_s']} s\n")
    for ti in tis:
        sys.stdout.write(f"   {ti['task_id']:<32} {ti['state']:<10} {times['tasks_s'][ti['task_id']]:>6} s\n")
    return times


def delete_tenant(admin: PulsarAdmin, tenant: str, timeout_s: float = 120) -> None:
    """Force-deletes `tenant` with everything in it, again while the broker answers that topics are still going
    (HTTP 409/412 right after their deletion)."""
    deadline = time.monotonic() + timeout_s
    while tenant in admin.get("/tenants"):
        try:
            admin.delete(f"/tenants/{tenant}", params={"force": "true"})
        except AdminError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def run_demo(tenant: str) -> int:
    clusters = pulsar_local.start()
    source, target = clusters[0], clusters[1]
    airflow_local.start()
    lookup_url = lookup_local.start()
    admin_a, admin_b = source.admin(timeout_s=30), target.admin(timeout_s=30)
    if tenant in admin_b.get("/tenants"):
        # An earlier demo moved it: its clients then wrote on the target, which this run's copy rightly refuses to
        # copy over. The demo's tenant is the demo's own: it starts again on both clusters.
        log.info("tenant %s already moved to %s by an earlier demo: deleting it on both clusters to start again",
                 tenant, target.name)
        for admin in (admin_b, admin_a):
            delete_tenant(admin, tenant)
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
    live_topics = seed_live_namespace(admin_a, tenant)

    url = f"http://localhost:{airflow_local.api_port()}"
    api = AirflowApi(url, airflow_local.ADMIN_USER, airflow_local.admin_password())
    # The DAG's pulsar_lookup connection gets the service's generated admin token as its password (the
    # settings file holds no secrets).
    api.call("PATCH", f"/connections/{LOOKUP_CONN}", params={"update_mask": "password"},
             json={"connection_id": LOOKUP_CONN, "conn_type": "http", "password": lookup_local.admin_token()})
    api.wait_for_dag(DAG_ID)
    api.call("PATCH", f"/dags/{DAG_ID}", json={"is_paused": False})
    conf = {"source_conn": "pulsar_cluster_a", "target_conn": "pulsar_cluster_b", "tenant": tenant}

    results: dict[str, Any] = {"tenant": tenant, "started": datetime.now(UTC).isoformat(timespec="seconds")}
    live: LiveClients | None = None
    try:
        for label, dry_run in (("dry run", True), ("migration", False)):
            if not dry_run:
                # The tenant's own clients, through the lookup service, for the whole real run.
                live = LiveClients(lookup_url, live_topics, LIVE_RATE).start()
                time.sleep(3)
            live_from = time.monotonic()
            run = api.trigger_and_wait(DAG_ID, {**conf, "dry_run": dry_run})
            live_until = time.monotonic()
            report = api.return_value(DAG_ID, run["dag_run_id"], PUBLISH_TASK) if run["state"] == "success" else None
            sys.stdout.write(f"\n== {label}: DAG run {run['dag_run_id']} {run['state']}\n")
            results[label] = {"run_id": run["dag_run_id"], "state": run["state"], **write_task_times(api, run)}
            if report:
                counts = report.get("counts", {})
                sys.stdout.write("   plan: " + ", ".join(f"{a}={counts.get(a, 0)}" for a in
                                                            ("CREATE", "UPDATE", "CONFLICT", "NOOP")) + "\n")
                results[label]["metadata_hashes"] = report.get("hashes", {})
            written = api.return_value(DAG_ID, run["dag_run_id"], REPORT_TASK) if run["state"] == "success" else None
            if written:
                results[label]["report"] = written["html"]
                sys.stdout.write(f"   report: {written['html']} (verdict {written['verdict']}: "
                                 f"{written.get('meaning', '')})\n")
            if run["state"] != "success":
                log.error("the %s DAG run failed: %s", label, api.failure_summary(DAG_ID, run["dag_run_id"]))
                raise DemoError(f"the {label} DAG run failed; see the task logs at {url}/dags/{DAG_ID}")
            if live is not None:
                time.sleep(5)  # the clients settle on the target
                results["live_clients"] = live.window(live_from, live_until)
                live.close()
                results["live_clients"].update(live.check(target.service_url))
                live = None
    finally:
        if live is not None:
            live.close()

    figures = results["live_clients"]
    sys.stdout.write(f"\n== live clients on {tenant}/{LIVE_NAMESPACE} ({LIVE_TOPICS} topics, {LIVE_RATE:.0f} msg/s, "
                     "through the lookup service)\n"
                     f"   acknowledged sends {figures['acknowledged_sends']}, failed {figures['failed_sends']}, "
                     f"lost on the target {figures['lost_on_target']}, "
                     f"stored twice {figures['stored_twice_on_target']}, "
                     f"never received {figures['never_received']}, received twice {figures['received_twice']}\n"
                     f"   send stall during the migration: p50 {figures['stall_p50_s']} s, p99 "
                     f"{figures['stall_p99_s']} s, max {figures['stall_max_s']} s\n")
    a_summary, b_summary = tenant_summary(admin_a, tenant), tenant_summary(admin_b, tenant)
    sys.stdout.write(f"\n== tenant {tenant}\n   {source.name}: {a_summary}\n   {target.name}: {b_summary}\n")
    hashes = results["migration"].get("metadata_hashes", {})
    if a_summary != b_summary or not hashes or hashes.get("desired") != hashes.get("target_actual"):
        raise DemoError(f"tenant {tenant} differs between the clusters after the migration")
    sys.stdout.write(f"   verified: desired hash == target hash ({hashes['desired'][:16]})\n")
    routed = requests.get(f"{lookup_url}/api/v1/routes/{tenant}", timeout=30,
                          headers={"Authorization": f"Bearer {lookup_local.admin_token()}"}).json()
    if routed.get("cluster") != target.name:
        raise DemoError(f"the lookup service still routes {tenant} to {routed.get('cluster')} after the switch")
    sys.stdout.write(f"\nLookup service: {lookup_url} (clients' service URL; {tenant} -> {target.name} after the "
                     f"switch; admin token in {lookup_local.home() / 'admin_token'}). The source's copy was only "
                     "verified: run pulsar_source_cleanup with this run's id and confirm_cleanup to delete it.\n")
    out = var_dir() / "demo" / f"demo-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    sys.stdout.write(f"\nFigures written to {out}\n")
    if figures["lost_on_target"] or figures["stored_twice_on_target"] or figures["failed_sends"]:
        raise DemoError(f"the live clients lost or duplicated messages: {figures}")
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
