"""sync_metadata against the real local cluster pair: full sync, no-op re-run, conflicts, dry run, bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from localdev.demo_tenant import AVRO_ORDER, AVRO_ORDER_V2, build_rich_tenant
from localdev.pulsar_local import LocalCluster
from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.metadata.step import PLAN_DATASET, STEP, run
from pulsar_migration.stepjob import run_step
from pyspark.sql import SparkSession

from tests.conftest import spark_submit, unique
from tests.integration.tenant_builders import drop_tenant, snapshot, write_spec


def sync(spec: Path, run_dir: Path, *extra: str) -> int:
    return run_step(STEP, run, ["--spec", str(spec), "--run-dir", str(run_dir), *extra])


def report(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / f"{STEP}.json").read_text())


def plan_rows(spark: SparkSession, run_dir: Path) -> dict[tuple[str, str], tuple[str, str]]:
    rows = spark.read.parquet(str(run_dir / PLAN_DATASET)).filter("side = 'target'").collect()
    return {(row.kind, row.key): (row.action, row.reason) for row in rows}


def error_line(capsys: pytest.CaptureFixture[str]) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines, "no error line on stderr"
    return lines[-1]


def test_full_sync_makes_target_equal_and_second_run_is_noop(
    spark: SparkSession, cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin,
    admin_b: PulsarAdmin, tmp_path: Path,
) -> None:
    tenant = unique("it-sync")
    built = build_rich_tenant(admin_a, tenant, [cluster_a.name])
    spec = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b)

    assert sync(spec, tmp_path / "run1") == 0
    source, target = snapshot(admin_a, tenant), snapshot(admin_b, tenant)
    assert target == source
    assert sorted(target["namespaces"]) == built["namespaces"]
    topics = {f"{ns}/{t}": v["partitions"] for ns, s in target["namespaces"].items() for t, v in s["topics"].items()}
    assert topics == built["topics"]
    assert target["namespaces"]["orders"]["topics"]["created"]["subscriptions"] == {
        "settlement": {"owner": "payments"}, "analytics": {}}
    created_schemas = target["namespaces"]["orders"]["topics"]["created"]["schemas"]
    assert [(v[0], v[1]) for v in created_schemas] == [(0, "AVRO"), (1, "AVRO")]  # same history, same numbers
    assert [v[1] for v in target["namespaces"]["audit"]["topics"]["trail"]["schemas"]] == ["JSON"]
    assert target["namespaces"]["orders"]["topics"]["dlq"]["messageTTL"] == 120
    assert target["namespaces"]["orders"]["topics"]["created"]["subscription_dispatch_rates"]["settlement"][
        "dispatchThrottlingRateInMsg"] == 2000
    dlq = target["namespaces"]["orders"]["topics"]["dlq"]
    assert (dlq["deduplicationSnapshotInterval"], dlq["dispatcherPauseOnAckStatePersistent"]) == (30, True)
    assert target["namespaces"]["audit"]["policies"]["dispatcherPauseOnAckStatePersistentEnabled"] is True
    assert target["namespaces"]["audit"]["policies"]["replicatorDispatchRate"] == {"<own>": {
        "dispatchThrottlingRateInMsg": 500, "dispatchThrottlingRateInByte": -1, "ratePeriodInSecond": 1,
        "relativeToPublishRate": False}}
    assert target["namespaces"]["orders"]["topics"]["created"]["properties"] == {"owner": "payments", "pii": "no"}
    assert target["namespaces"]["orders"]["topics"]["dlq"]["properties"] == {"replay-with": "replayer"}
    invoices = target["namespaces"]["billing"]["topics"]["invoices"]
    assert (invoices["maxProducers"], invoices["global_maxSubscriptionsPerTopic"]) == (4, 50)  # local and global
    # Both sides now allow both clusters (the source first: Pulsar requires it before replication).
    for admin in (admin_a, admin_b):
        assert set(admin.get(f"/tenants/{tenant}")["allowedClusters"]) == {cluster_a.name, cluster_b.name}
    first = report(tmp_path / "run1")
    assert first["verdict"] == "ok"
    # 1 tenant + 3 namespaces + 3 namespace grants + 1 subscription grant + 6 topics + 1 partitioned
    # non-persistent topic + 3 topic grants (one on the non-persistent topic) + 3 topic-policy sets (one holding only
    # a subscription's dispatch rate) + 2 schemas + 5 subscriptions + 2 topics' properties + 1 topic's global
    # policies; the source tenant gains cluster-b (UPDATE).
    assert (first["counts"]["CREATE"], first["counts"]["UPDATE"]) == (31, 1)
    assert first["counts"]["topic_properties.CREATE"] == 2 and first["counts"]["topic_policies.CREATE"] == 3
    assert first["counts"]["topic_global_policies.CREATE"] == 1
    assert first["counts"]["applied"] == 32 and first["counts"]["apply_failed"] == 0
    assert target["namespaces"]["audit"]["non_persistent_partitions"] == {"live-metrics": 2}
    assert admin_b.get(f"/namespaces/{tenant}/audit")["auth_policies"]["destination_auth"][
        f"non-persistent://{tenant}/audit/live-metrics"] == {"dashboards": ["consume"]}
    assert first["hashes"]["desired"] == first["hashes"]["target_actual"]

    assert first["counts"]["set_only_on_target"] == 0

    # Removed on the source after the first sync (a TTL), and set on the target alone (a topic's producer limit):
    # left as they are (the sync cannot tell the two apart), each named in the report.
    admin_a.delete(f"/namespaces/{tenant}/orders/messageTTL")
    admin_b.post(f"/persistent/{tenant}/audit/trail/maxProducers", 2)
    assert sync(spec, tmp_path / "run2") == 0
    second = report(tmp_path / "run2")
    assert (second["counts"]["CREATE"], second["counts"]["UPDATE"], second["counts"]["applied"]) == (0, 0, 0)
    assert second["details"]["set_only_on_target"] == [
        {"kind": "namespace", "key": "orders", "settings": ["message_ttl_in_seconds"]},
        {"kind": "topic_policies", "key": "audit/trail", "settings": ["maxProducers"]}]
    assert snapshot(admin_b, tenant) == {**target, "namespaces": {**target["namespaces"], "audit": {
        **target["namespaces"]["audit"], "topics": {**target["namespaces"]["audit"]["topics"], "trail": {
            **target["namespaces"]["audit"]["topics"]["trail"], "maxProducers": 2}}}}}


def test_conflicts_follow_pip370_table_and_nothing_is_destroyed(
    spark: SparkSession, cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin,
    admin_b: PulsarAdmin, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    tenant = unique("it-conflict")
    both = [cluster_a.name, cluster_b.name]
    for admin, layout in ((admin_a, {"fewer": 4, "more": 2, "typed": 2, "plain": 0}),
                          (admin_b, {"fewer": 2, "more": 5, "typed": 0, "plain": 3})):
        admin.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": both})
        admin.put(f"/namespaces/{tenant}/ns")
        for topic, partitions in layout.items():
            path = f"/persistent/{tenant}/ns/{topic}"
            admin.put(f"{path}/partitions", partitions) if partitions else admin.put(path)
    admin_a.put(f"/persistent/{tenant}/ns/more/subscription/late", {"ledgerId": -1, "entryId": -1})
    # The same subscription on a topic non-partitioned on one side and partitioned on the other, both ways round
    # (the plan's UDF failed on the first with a KeyError: the step failed on every run without naming a conflict).
    for admin in (admin_a, admin_b):
        for topic in ("plain", "typed"):
            admin.put(f"/persistent/{tenant}/ns/{topic}/subscription/svc", {"ledgerId": -1, "entryId": -1})
    for admin, grow, shrink in ((admin_a, 4, 2), (admin_b, 2, 4)):  # non-persistent: grow one, never shrink one
        admin.put(f"/non-persistent/{tenant}/ns/np-fewer/partitions", grow)
        admin.put(f"/non-persistent/{tenant}/ns/np-more/partitions", shrink)
    for admin, schema in ((admin_a, AVRO_ORDER), (admin_b, AVRO_ORDER_V2)):  # histories diverge at version 0
        admin.put(f"/persistent/{tenant}/ns/schemad")
        admin.post(f"/schemas/{tenant}/ns/schemad/schema", {"type": "AVRO", "schema": schema, "properties": {}})
    spec = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b)
    before = snapshot(admin_b, tenant)

    assert sync(spec, tmp_path / "run1") == 2  # bad input: a retry cannot help
    # 3 topics + 2 subscriptions under them + 1 schema history + 1 non-persistent topic
    assert "7 conflict(s)" in error_line(capsys)
    plan = plan_rows(spark, tmp_path / "run1")
    assert plan[("topic", "ns/fewer")][0] == "UPDATE"
    assert plan[("topic", "ns/more")] == ("CONFLICT", "target has more partitions (5) than the source (2); "
                                                      "never shrunk")
    assert plan[("topic", "ns/typed")][0] == "CONFLICT" and "non-partitioned on the target" in plan[
        ("topic", "ns/typed")][1]
    assert plan[("topic", "ns/plain")][0] == "CONFLICT"
    assert plan[("non_persistent_topic", "ns/np-fewer")] == ("UPDATE", "grow partitions 2 -> 4")
    assert plan[("non_persistent_topic", "ns/np-more")][0] == "CONFLICT"
    assert plan[("subscription", "ns/more|late")][0] == "CONFLICT"
    assert plan[("subscription", "ns/typed|svc")][0] == "CONFLICT"
    assert plan[("subscription", "ns/plain|svc")] == ("NOOP", "present")  # nothing to change under the conflict
    assert plan[("schema", "ns/schemad")] == ("CONFLICT", "schema version 0 differs (1 version(s) on the source, "
                                                          "1 on the target)")
    assert snapshot(admin_b, tenant) == before, "conflicts must stop the step before any write"

    proceed = write_spec(tmp_path / "spec2.json", tenant, cluster_a, cluster_b,
                         options={"proceed_on_conflict": True})
    assert sync(proceed, tmp_path / "run2") == 0
    after = snapshot(admin_b, tenant)["namespaces"]["ns"]["topics"]
    assert {t: v["partitions"] for t, v in after.items()} == {"fewer": 4, "more": 5, "typed": 0, "plain": 3,
                                                               "schemad": 0}
    assert after["more"]["subscriptions"] == {}
    assert after["plain"]["subscriptions"] == after["typed"]["subscriptions"] == {"svc": {}}  # the target's own
    assert after["schemad"]["schemas"] == before["namespaces"]["ns"]["topics"]["schemad"]["schemas"]
    assert snapshot(admin_b, tenant)["namespaces"]["ns"]["non_persistent_partitions"] == {"np-fewer": 4,
                                                                                          "np-more": 4}


def test_dry_run_writes_a_plan_and_changes_nothing(
    spark: SparkSession, cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin,
    admin_b: PulsarAdmin, tmp_path: Path,
) -> None:
    tenant = unique("it-dry")
    build_rich_tenant(admin_a, tenant, [cluster_a.name])
    spec = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b)
    before = (snapshot(admin_a, tenant), admin_a.get(f"/tenants/{tenant}"), snapshot(admin_b, tenant))

    assert sync(spec, tmp_path / "run", "--dry-run") == 0
    assert (snapshot(admin_a, tenant), admin_a.get(f"/tenants/{tenant}"), snapshot(admin_b, tenant)) == before
    assert before[2] == {"tenant": None}
    result = report(tmp_path / "run")
    assert result["verdict"] == "planned" and result["dry_run"] is True
    plan = plan_rows(spark, tmp_path / "run")
    assert plan[("tenant", tenant)][0] == "CREATE"
    assert plan[("topic", "billing/invoices")][0] == "CREATE"
    assert result["counts"]["CREATE"] == sum(1 for action, _ in plan.values() if action == "CREATE")


@pytest.mark.parametrize("case", ["unknown-tenant", "unreachable-target", "missing-field", "unknown-field",
                                  "bad-regex", "missing-token-env"])
def test_bad_input_fails_with_one_line_and_writes_nothing(
    case: str, cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin, admin_b: PulsarAdmin,
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, spark: SparkSession,
) -> None:
    tenant = unique("it-bad")
    admin_a.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": [cluster_a.name]})
    admin_a.put(f"/namespaces/{tenant}/ns")
    spec_path = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b)
    spec = json.loads(spec_path.read_text())
    expected_code, expected_text = 2, ""
    if case == "unknown-tenant":
        spec["tenant"] = "no-such-tenant-" + tenant
        expected_code, expected_text = 2, f"tenant 'no-such-tenant-{tenant}' does not exist on cluster cluster-a"
    elif case == "unreachable-target":
        spec["clusters"][cluster_b.name]["admin_url"] = "http://127.0.0.1:9"
        expected_code, expected_text = 1, "cluster-b is unreachable at http://127.0.0.1:9"
    elif case == "missing-field":
        del spec["source"]
        expected_text = "missing field 'source'"
    elif case == "unknown-field":
        spec["tenantt"] = tenant
        expected_text = "unknown field 'tenantt'"
    elif case == "bad-regex":
        spec["topics"] = {"include": ["orders-(["], "exclude": []}
        expected_text = "topics.include[0] is not a valid regex"
    elif case == "missing-token-env":
        spec["clusters"][cluster_b.name]["token_env"] = "PM_TEST_TOKEN_THAT_IS_NOT_SET"
        monkeypatch.delenv("PM_TEST_TOKEN_THAT_IS_NOT_SET", raising=False)
        expected_text = "PM_TEST_TOKEN_THAT_IS_NOT_SET"
    spec_path.write_text(json.dumps(spec))
    tenant_before = admin_a.get(f"/tenants/{tenant}")

    assert sync(spec_path, tmp_path / "run") == expected_code
    line = error_line(capsys)
    assert line.startswith("error: ") and expected_text in line, line
    assert admin_a.get(f"/tenants/{tenant}") == tenant_before
    assert tenant not in admin_b.get("/tenants")


# 1,000 topics and more: benchmarks/metadata_scale.py (README figures); CI checks correctness at 500.
SCALE_TOPICS = 500


@pytest.mark.slow
def test_scale_500_topics(spark: SparkSession, cluster_a: LocalCluster, cluster_b: LocalCluster,
                          admin_a: PulsarAdmin, admin_b: PulsarAdmin, tmp_path: Path) -> None:
    from benchmarks.metadata_scale import create_source_tenant  # shared with the benchmark

    tenant = unique("it-scale")
    layout = create_source_tenant(admin_a, tenant, [cluster_a.name], topics=SCALE_TOPICS)
    spec = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b, options={"admin_concurrency": 16})
    try:
        assert sync(spec, tmp_path / "run") == 0
        synced = report(tmp_path / "run")
        assert synced["counts"]["topic.CREATE"] == SCALE_TOPICS
        target_topics = 0
        for ns in layout:
            target_topics += len(admin_b.get(f"/persistent/{tenant}/{ns}/partitioned"))
            target_topics += sum(1 for t in admin_b.get(f"/persistent/{tenant}/{ns}") if "-partition-" not in t)
        assert target_topics == SCALE_TOPICS
        assert sync(spec, tmp_path / "run2") == 0
        assert report(tmp_path / "run2")["counts"]["topic.NOOP"] == SCALE_TOPICS
    finally:  # so many topics per run would pile up on a developer's long-lived clusters
        drop_tenant(tenant, admin_a, admin_b)


def test_verification_detects_a_target_that_drifted(
    spark: SparkSession, cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin,
    admin_b: PulsarAdmin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pulsar_migration.metadata import step
    from pulsar_migration.metadata.inventory import read_layout
    from pulsar_migration.metadata.state import Clusters, desired_state
    from pulsar_migration.report import StepReport
    from pulsar_migration.spec import MigrationSpec
    from pulsar_migration.stepjob import StepContext, StepFailed

    tenant = unique("it-drift")
    build_rich_tenant(admin_a, tenant, [cluster_a.name])
    spec_path = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b)
    assert sync(spec_path, tmp_path / "run") == 0
    # Drift after a verified sync: a subscription disappears, a namespace policy changes, a topic property too.
    admin_b.delete(f"/persistent/{tenant}/orders/dlq/subscription/replayer")
    admin_b.post(f"/namespaces/{tenant}/billing/messageTTL", 1)
    admin_b.put(f"/persistent/{tenant}/orders/created/properties", {"pii": "yes"})

    spec = MigrationSpec.load(str(spec_path))
    ctx = StepContext(STEP, spec, str(tmp_path / "verify"), False, None, StepReport.start(STEP, spec))
    monkeypatch.setattr(step, "VERIFY_RETRY_DELAY_S", 0.0)
    clusters = Clusters.open(spec)
    try:
        desired = desired_state(spark, spec, read_layout(clusters.source, spec, must_exist=True), 4)
        topics = {row.key for row in desired.filter("kind = 'topic'").collect()}
        with pytest.raises(StepFailed, match=r"verification failed: 3 resource\(s\) differ .*3 change\(s\) still"):
            step._verify(ctx, clusters, desired, topics, set(), 4)
    finally:
        clusters.close()
    assert ctx.report.hashes["desired"] != ctx.report.hashes["target_actual"]
    assert ctx.report.counts["verify_attempts"] == step.VERIFY_ATTEMPTS


def test_namespace_and_topic_filters_limit_what_is_synced(
    spark: SparkSession, cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin,
    admin_b: PulsarAdmin, tmp_path: Path,
) -> None:
    tenant = unique("it-filter")
    build_rich_tenant(admin_a, tenant, [cluster_a.name])
    spec = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b, namespaces=["orders", "audit"],
                      topics={"include": ["^orders/", "^audit/"], "exclude": ["dlq$"]})

    assert sync(spec, tmp_path / "run") == 0
    target = snapshot(admin_b, tenant)["namespaces"]
    assert sorted(target) == ["audit", "orders"]  # billing not selected
    assert sorted(target["orders"]["topics"]) == ["created", "settled"]  # dlq excluded
    assert sorted(target["audit"]["topics"]) == ["trail"]
    source = snapshot(admin_a, tenant)["namespaces"]
    assert target["orders"]["topics"]["created"] == source["orders"]["topics"]["created"]
    assert target["orders"]["topic_auth"] == source["orders"]["topic_auth"]  # grant on a selected topic


def test_a_subscription_on_some_partitions_is_created_on_those_only(
    spark: SparkSession, cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin,
    admin_b: PulsarAdmin, tmp_path: Path,
) -> None:
    """`one` lives on partition 2 of the source only (a client consumed that partition by name): it was created on
    every partition of the target at the earliest position, so a client subscribing there after the switch got
    partitions 0 and 1 from the start, where the source would have created them afresh. `all`, left on partition 1
    of the target by a kill while the broker created it partition by partition, is completed on 0 and 2."""
    tenant = unique("it-partial-sub")
    try:
        for admin, clusters in ((admin_a, [cluster_a.name]), (admin_b, [cluster_b.name])):
            admin.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": clusters})
            admin.put(f"/namespaces/{tenant}/ns")
            admin.put(f"/persistent/{tenant}/ns/feed/partitions", 3)
        earliest = {"ledgerId": -1, "entryId": -1}
        admin_a.put(f"/persistent/{tenant}/ns/feed/subscription/all", earliest)
        admin_a.put(f"/persistent/{tenant}/ns/feed-partition-2/subscription/one", {**earliest, "properties": {
            "owner": "stream-job"}})
        admin_b.put(f"/persistent/{tenant}/ns/feed-partition-1/subscription/all", earliest)
        spec = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b)

        assert sync(spec, tmp_path / "run") == 0
        plan = plan_rows(spark, tmp_path / "run")
        assert plan[("subscription", "ns/feed|all")] == ("UPDATE", "missing on partition(s) 0, 2")
        assert plan[("subscription", "ns/feed|one")][0] == "CREATE"
        held = {i: sorted(admin_b.get(f"/persistent/{tenant}/ns/feed-partition-{i}/stats")["subscriptions"])
                for i in range(3)}
        assert held == {0: ["all"], 1: ["all"], 2: ["all", "one"]}
        assert admin_b.get(f"/persistent/{tenant}/ns/feed-partition-2/stats")["subscriptions"]["one"][
            "subscriptionProperties"] == {"owner": "stream-job"}
        assert report(tmp_path / "run")["verdict"] == "ok"
        assert sync(spec, tmp_path / "again") == 0
        assert report(tmp_path / "again")["counts"]["applied"] == 0

        # New properties on the source; a run killed after setting them on the target's partition 0 only: partition
        # 0's map stood for all partitions (the re-run saw it right and left 1 and 2 with the old ones).
        admin_a.put(f"/persistent/{tenant}/ns/feed/subscription/all/properties", {"v": "2"})
        admin_b.put(f"/persistent/{tenant}/ns/feed-partition-0/subscription/all/properties", {"v": "2"})
        admin_b.put(f"/persistent/{tenant}/ns/feed-partition-1/subscription/all/properties", {"mine": "kept"})
        assert sync(spec, tmp_path / "after-kill") == 0
        assert plan_rows(spark, tmp_path / "after-kill")[("subscription", "ns/feed|all")] == (
            "UPDATE", "properties differ on partition(s) 1, 2")
        assert [admin_b.get(f"/persistent/{tenant}/ns/feed-partition-{i}/stats")["subscriptions"]["all"][
            "subscriptionProperties"] for i in range(3)] == [{"v": "2"}, {"v": "2", "mine": "kept"}, {"v": "2"}]
    finally:
        drop_tenant(tenant, admin_a, admin_b)


@pytest.mark.slow
def test_rerun_after_a_kill_during_apply_finishes_the_job_exactly(
    spark: SparkSession, cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin,
    admin_b: PulsarAdmin, tmp_path: Path,
) -> None:
    """SIGKILL to spark-submit's whole process group once apply is creating topics; the re-run completes."""
    import os
    import signal
    import subprocess
    import time

    from benchmarks.metadata_scale import create_source_tenant

    tenant = unique("it-kill")
    layout = create_source_tenant(admin_a, tenant, [cluster_a.name], topics=200)
    spec = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b, options={"admin_concurrency": 2})
    proc = spark_submit(STEP, spec, tmp_path / "killed", stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    killed_during_apply = False
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # the driver's log reaches spark-submit's stdout
            if "apply phase namespace:" in line:  # the topic phase starts now
                break
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            created = sum(len(admin_b.get(f"/persistent/{tenant}/{ns}")) for ns in layout)
            if created >= 40:  # inside the topic phase: some topics exist, most do not
                os.killpg(proc.pid, signal.SIGKILL)
                killed_during_apply = True
                break
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    try:
        assert killed_during_apply, "the step finished before it could be killed mid-apply"
        def persistent_names(admin: PulsarAdmin) -> int:  # topics and partitions
            return sum(len(admin.get(f"/persistent/{full}")) for full in admin.get(f"/namespaces/{tenant}"))

        partial, complete = persistent_names(admin_b), persistent_names(admin_a)
        assert partial < complete, f"the kill came after apply had created everything ({partial}/{complete})"

        assert sync(spec, tmp_path / "rerun") == 0
        rerun = report(tmp_path / "rerun")
        assert rerun["counts"]["apply_failed"] == 0
        assert 0 < rerun["counts"]["topic.NOOP"] < 400  # the killed run had created some topics
        assert rerun["hashes"]["desired"] == rerun["hashes"]["target_actual"]
        assert snapshot(admin_b, tenant) == snapshot(admin_a, tenant)
        assert sync(spec, tmp_path / "third") == 0
        assert report(tmp_path / "third")["counts"]["applied"] == 0
    finally:
        drop_tenant(tenant, admin_a, admin_b)
