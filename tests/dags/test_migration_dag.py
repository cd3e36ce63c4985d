"""`dag.test()` of the tenant migration DAG for real: Airflow -> spark-submit (local[*]) -> both local clusters.

Each run costs 20-40 s (a Spark driver per step), so the cases are few and each checks a lot.
"""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest
from airflow.models.dagrun import DagRun
from localdev.demo_tenant import build_rich_tenant
from localdev.pulsar_local import LocalCluster
from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.dag_support import run_dir, token_env_name

from tests.conftest import unique
from tests.dags.conftest import AirflowTestDb
from tests.dags.dag_runs import rendered_fields, run_dag, xcom
from tests.integration.lookup_helpers import TOKEN as LOOKUP_TOKEN
from tests.integration.lookup_helpers import LookupProcess
from tests.integration.tenant_builders import snapshot

log = logging.getLogger(__name__)

DAG_ID = "pulsar_tenant_migration"
PUBLISH = "publish_sync_metadata_report"
REPLICATE, PUBLISH_REPLICATE = "replicate_topics", "publish_replicate_topics_report"
PROGRESS, PUBLISH_PROGRESS = "sync_progress", "publish_sync_progress_report"
SWITCH, PUBLISH_SWITCH = "switch_lookup", "publish_switch_lookup_report"
CLEANUP, PUBLISH_CLEANUP = "cleanup_source", "publish_cleanup_source_report"
REPORT = "write_migration_report"


def run_migration(conf: dict[str, Any]) -> tuple[DagRun, dict[str, str | None]]:
    return run_dag(DAG_ID, run_conf=conf)


def run_dir_of(airflow_db: AirflowTestDb, dag_run: DagRun) -> Path:
    return Path(run_dir(str(airflow_db.runs_dir), DAG_ID, dag_run.run_id))


def test_migrates_a_rich_tenant_with_a_token_only_in_the_environment(
    airflow_db: AirflowTestDb, cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin,
    admin_b: PulsarAdmin, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str],
    lookup_service: LookupProcess,
) -> None:
    tenant = unique("dag-mig")
    built = build_rich_tenant(admin_a, tenant, [cluster_a.name])
    # The target through a connection the trigger names, holding a token (the local brokers ignore it):
    # the step only starts if the token reached it as PULSAR_TOKEN_<CONN_ID> (its spec names that variable).
    token = f"dag-test-token-{uuid.uuid4().hex}"
    monkeypatch.setenv("AIRFLOW_CONN_PM_TEST_TARGET", json.dumps({
        "conn_type": "pulsar", "host": "127.0.0.1", "port": cluster_b.web_port, "schema": "http", "password": token,
        "extra": {"cluster_name": cluster_b.name, "service_url": cluster_b.service_url, "tls": None},
    }))

    source = snapshot(admin_a, tenant)  # the source is deleted at the end (confirmed cleanup)
    try:
        dag_run, states = run_migration({"tenant": tenant, "target_conn": "pm_test_target", "confirm_cleanup": True,
                                         "delete_tenant": True})

        assert dag_run.state == "success", states
        assert states == {"render_spec": "success", "sync_metadata": "success", PUBLISH: "success",
                          REPLICATE: "success", PUBLISH_REPLICATE: "success", PROGRESS: "success",
                          PUBLISH_PROGRESS: "success", SWITCH: "success", PUBLISH_SWITCH: "success",
                          CLEANUP: "success", PUBLISH_CLEANUP: "success", REPORT: "success"}
        switched = xcom(dag_run, PUBLISH_SWITCH)
        assert switched["verdict"] == "ok" and switched["dry_run"] is False
        assert lookup_service.api("GET", f"/routes/{tenant}").json()["cluster"] == cluster_b.name
        cleaned = xcom(dag_run, PUBLISH_CLEANUP)  # confirmed: verified, then the source's copy deleted
        assert cleaned["verdict"] == "ok" and cleaned["dry_run"] is False
        assert cleaned["counts"]["partitions"] > 0 and cleaned["counts"]["topics_deleted"] > 0
        assert snapshot(admin_a, tenant) == {"tenant": None}
        target = snapshot(admin_b, tenant)
        # replicate_topics turns deduplication on for the target's namespaces (exactly-once copies and
        # client re-sends); everything else is as on the source
        for ns in target["namespaces"]:
            assert target["namespaces"][ns]["policies"].pop("deduplicationEnabled") is True
            source["namespaces"][ns]["policies"].pop("deduplicationEnabled")
        assert target == source
        assert sorted(target["namespaces"]) == built["namespaces"]
        replicated = xcom(dag_run, PUBLISH_REPLICATE)
        assert replicated["verdict"] == "ok" and replicated["counts"]["partitions_failed"] == 0
        progressed = xcom(dag_run, PUBLISH_PROGRESS)
        assert progressed["verdict"] == "ok" and progressed["counts"]["subscriptions"] > 0
        assert progressed["counts"]["lost"] == 0 == progressed["counts"]["duplicated"]

        rdir = run_dir_of(airflow_db, dag_run)
        assert xcom(dag_run, "render_spec") == {"spec_path": str(rdir / "spec.json"), "run_dir": str(rdir)}
        spec_text = (rdir / "spec.json").read_text()
        spec = json.loads(spec_text)
        assert (spec["tenant"], spec["source"], spec["target"]) == (tenant, cluster_a.name, cluster_b.name)
        assert spec["clusters"][cluster_b.name]["token_env"] == token_env_name("pm_test_target")
        assert spec["clusters"][cluster_a.name]["token_env"] is None  # its connection has no password
        report_text = (rdir / "sync_metadata.json").read_text()
        report = json.loads(report_text)
        assert report["verdict"] == "ok" and report["tenant"] == tenant

        published = xcom(dag_run, PUBLISH)
        assert published["verdict"] == "ok" and published["dry_run"] is False
        assert (published["step"], published["tenant"], published["source"], published["target"]) == (
            "sync_metadata", tenant, cluster_a.name, cluster_b.name)
        assert published["counts"] == report["counts"] and published["counts"]["apply_failed"] == 0
        assert published["hashes"]["desired"] == published["hashes"]["target_actual"]
        assert published["report"] == str(rdir / "sync_metadata.json")
        assert published["plan"] == str(rdir / "sync_metadata_plan") and Path(published["plan"]).is_dir()
        assert (published["conflict_count"], published["conflicts"]) == (0, [])
        assert xcom(dag_run, "sync_metadata") == {"report": str(rdir / "sync_metadata.json")}

        rendered = rendered_fields(dag_run, "sync_metadata")
        # Variables named after the trigger's connections; the arguments name the spec, not the token.
        assert set(rendered["env_vars"]) == {token_env_name("pulsar_cluster_a"), token_env_name("pm_test_target"),
                                             token_env_name("pulsar_lookup")}
        assert rendered["application_args"] == ["--spec", str(rdir / "spec.json"), "--run-dir", str(rdir)]
        assert rendered_fields(dag_run, CLEANUP)["application_args"][-1] == "--delete-tenant"
        assert token_env_name("pulsar_lookup") in rendered_fields(dag_run, SWITCH)["env_vars"]

        # The report for people: every step ok, every partition's hashes equal, lost = duplicated = 0.
        written = xcom(dag_run, REPORT)
        assert written["verdict"] == "ok" and written["html"] == str(rdir / "report.html")
        assert (written["lost"], written["duplicated"]) == (0, 0)
        summary = json.loads((rdir / "report.json").read_text())
        assert [(s["step"], s["verdict"]) for s in summary["steps"]] == [
            ("sync_metadata", "ok"), ("replicate_topics", "ok"), ("sync_progress", "ok"), ("switch_lookup", "ok"),
            ("cleanup_source", "ok")]
        assert len(summary["partitions"]) == replicated["counts"]["partitions"]
        assert all(p["hashes_equal"] and p["status"] == "ok" for p in summary["partitions"])
        assert sum(p["source_messages"] for p in summary["partitions"]) == replicated["counts"]["source_messages"]
        assert len(summary["subscriptions"]) == progressed["counts"]["subscriptions"]
        assert summary["cutover"]["route_after"] == cluster_b.name and summary["cutover"]["hold_s"] > 0
        page = (rdir / "report.html").read_text()
        assert tenant in page and "verdict ok" in page and "lost 0, duplicated 0" in page

        out, err = capfd.readouterr()
        leaks = {"spec": spec_text, "report": report_text, "xcom": json.dumps(published),
                 "rendered fields": json.dumps(rendered, default=str), "output": out + err}
        # Copy mode registers each cluster in the other without credentials: the token must not end up
        # in either cluster's configuration store (readable by any admin of that cluster).
        for admin, other in ((admin_a, cluster_b), (admin_b, cluster_a)):
            registration = admin.get(f"/clusters/{other.name}", expect_json=False).decode()
            leaks[f"registration of {other.name} on {admin.name}"] = registration
        for name in (f"{SWITCH}.json", f"{CLEANUP}.json", "report.json", "report.md", "report.html"):
            leaks[name] = (rdir / name).read_text()
        for where, text in leaks.items():
            assert token not in text, f"token leaked into the {where}"
            assert LOOKUP_TOKEN not in text, f"lookup service token leaked into the {where}"
    finally:
        # Whatever the run wrote, leave both clusters registered in each other without auth, as
        # localdev.pulsar_local sets them up (POST replaces the whole registration).
        for admin, other in ((admin_a, cluster_b), (admin_b, cluster_a)):
            admin.post(f"/clusters/{other.name}", {"serviceUrl": other.admin_url,
                                                     "brokerServiceUrl": other.service_url})


def test_dry_run_plans_and_changes_nothing(
    airflow_db: AirflowTestDb, cluster_a: LocalCluster, admin_a: PulsarAdmin, admin_b: PulsarAdmin,
    lookup_service: LookupProcess,
) -> None:
    tenant = unique("dag-dry")
    build_rich_tenant(admin_a, tenant, [cluster_a.name])
    before = (snapshot(admin_a, tenant), admin_a.get(f"/tenants/{tenant}"), snapshot(admin_b, tenant))
    assert before[2] == {"tenant": None}

    dag_run, states = run_migration({"tenant": tenant, "dry_run": True, "namespaces": ["orders", "billing"],
                                     "topics_exclude": ["dlq$"]})

    assert dag_run.state == "success", states
    assert (snapshot(admin_a, tenant), admin_a.get(f"/tenants/{tenant}"), snapshot(admin_b, tenant)) == before
    rdir = run_dir_of(airflow_db, dag_run)
    spec = json.loads((rdir / "spec.json").read_text())
    assert spec["namespaces"] == ["orders", "billing"] and spec["topics"] == {"include": [".*"], "exclude": ["dlq$"]}
    assert json.loads((rdir / "sync_metadata.json").read_text())["verdict"] == "planned"
    published = xcom(dag_run, PUBLISH)
    assert published["verdict"] == "planned" and published["dry_run"] is True
    assert published["counts"]["CREATE"] > 0 and Path(published["plan"]).is_dir()
    replicated = xcom(dag_run, PUBLISH_REPLICATE)  # planned against a target that has no topics yet
    assert replicated["verdict"] == "planned" and replicated["counts"]["partitions"] > 0
    progressed = xcom(dag_run, PUBLISH_PROGRESS)  # no position map yet: nothing to translate, nothing written
    assert progressed["verdict"] == "planned" and progressed["counts"]["partitions"] > 0
    assert xcom(dag_run, PUBLISH_SWITCH)["verdict"] == "planned"
    assert lookup_service.api("GET", f"/routes/{tenant}").json()["held"] is False
    assert xcom(dag_run, PUBLISH_CLEANUP)["verdict"] == "planned"
    assert xcom(dag_run, REPORT)["verdict"] == "planned" and (rdir / "report.md").is_file()


def test_unknown_tenant_fails_the_step_the_publish_task_and_the_run(
    airflow_db: AirflowTestDb, admin_b: PulsarAdmin, cluster_a: LocalCluster,
) -> None:
    tenant = unique("dag-missing")

    dag_run, states = run_migration({"tenant": tenant})

    assert dag_run.state == "failed"
    assert states == {"render_spec": "success", "sync_metadata": "failed", PUBLISH: "failed",
                      REPLICATE: "upstream_failed", PUBLISH_REPLICATE: "failed",
                      PROGRESS: "upstream_failed", PUBLISH_PROGRESS: "failed", SWITCH: "upstream_failed",
                      PUBLISH_SWITCH: "failed", CLEANUP: "upstream_failed", PUBLISH_CLEANUP: "failed",
                      REPORT: "failed"}
    assert snapshot(admin_b, tenant) == {"tenant": None}
    report = json.loads((run_dir_of(airflow_db, dag_run) / "sync_metadata.json").read_text())
    assert report["verdict"] == "failed"
    assert f"tenant '{tenant}' does not exist on cluster {cluster_a.name}" in report["error"]
    assert xcom(dag_run, PUBLISH) is None and xcom(dag_run, "sync_metadata") is None
    # The failed run still has its report (written before the report task failed), showing where it stopped.
    summary = json.loads((run_dir_of(airflow_db, dag_run) / "report.json").read_text())
    assert summary["verdict"] == "failed" and summary["steps"][0]["verdict"] == "failed"
    assert [s["verdict"] for s in summary["steps"][1:]] == ["not run"] * 4


def test_same_cluster_on_both_sides_fails_render_spec_before_spark(airflow_db: AirflowTestDb) -> None:
    dag_run, states = run_migration({"tenant": unique("dag-same"), "target_conn": "pulsar_cluster_a"})

    assert dag_run.state == "failed"
    assert states == {"render_spec": "failed", "sync_metadata": "upstream_failed", PUBLISH: "failed",
                      REPLICATE: "upstream_failed", PUBLISH_REPLICATE: "failed",
                      PROGRESS: "upstream_failed", PUBLISH_PROGRESS: "failed", SWITCH: "upstream_failed",
                      PUBLISH_SWITCH: "failed", CLEANUP: "upstream_failed", PUBLISH_CLEANUP: "failed",
                      REPORT: "failed"}
    assert not (run_dir_of(airflow_db, dag_run) / "spec.json").exists()
