"""The migration DAG's pure half: trigger params -> spec document, and a step's report -> outcome."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pulsar_migration import dag_support
from pulsar_migration.dag_support import StepOutcomeError, spec_document, step_outcome
from pulsar_migration.report import StepReport
from pulsar_migration.spec import MigrationSpec, SpecError


@dataclass
class Conn:
    """The attributes of an Airflow connection that dag_support reads (it never imports Airflow)."""

    conn_id: str
    host: str | None = "127.0.0.1"
    port: int | None = 8081
    schema: str | None = "http"
    password: str | None = None
    extra_dejson: dict[str, Any] = field(default_factory=dict)


A = Conn("pulsar_cluster_a", extra_dejson={"cluster_name": "cluster-a", "service_url": "pulsar://127.0.0.1:6651"})
B = Conn("pulsar_cluster_b", port=8082, password="s3cret-token",
         extra_dejson={"cluster_name": "cluster-b", "service_url": "pulsar://127.0.0.1:6652",
                       "tls": {"allow_insecure": True}})
PARAMS: dict[str, Any] = {
    "source_conn": A.conn_id, "target_conn": B.conn_id, "tenant": "acme", "namespaces": ["orders"],
    "topics_include": ["^orders/"], "topics_exclude": ["dlq$"], "dry_run": True, "proceed_on_conflict": True,
}


def test_spec_document_maps_params_and_connections() -> None:
    doc = spec_document(PARAMS, A, B)
    assert MigrationSpec.from_dict(doc).to_dict() == doc
    assert (doc["tenant"], doc["source"], doc["target"], doc["namespaces"]) == ("acme", "cluster-a", "cluster-b",
                                                                              ["orders"])
    assert doc["topics"] == {"include": ["^orders/"], "exclude": ["dlq$"]}
    assert doc["options"] == {"proceed_on_conflict": True}  # dry_run is an argument, not part of the spec
    assert doc["clusters"]["cluster-a"] == {"admin_url": "http://127.0.0.1:8081",
                                            "service_url": "pulsar://127.0.0.1:6651", "token_env": None, "tls": None}
    assert doc["clusters"]["cluster-b"]["token_env"] == "PULSAR_TOKEN_PULSAR_CLUSTER_B"
    assert doc["clusters"]["cluster-b"]["tls"]["allow_insecure"] is True
    assert "s3cret-token" not in json.dumps(doc)


def test_the_rate_cap_reaches_the_spec_in_bytes() -> None:
    doc = spec_document({**PARAMS, "copy_max_mb_per_s": 12.5}, A, B)
    assert doc["options"]["copy_max_mb_per_s"] == 12.5
    assert MigrationSpec.from_dict(doc).copy_max_bytes_per_s == 12_500_000
    capped = MigrationSpec.from_dict(spec_document({**PARAMS, "copy_max_msgs_per_s": 800}, A, B))
    assert (capped.copy_caps.bytes_per_s, capped.copy_caps.msgs_per_s) == (None, 800)
    assert MigrationSpec.from_dict(spec_document({**PARAMS, "copy_max_mb_per_s": None}, A, B)).copy_max_bytes_per_s \
        is None


def test_a_connection_may_name_the_broker_listener() -> None:
    behind_nat = Conn("pulsar_cluster_b", port=8082, extra_dejson={
        "cluster_name": "cluster-b", "service_url": "pulsar://gw.example.com:16652", "listener_name": "external"})
    doc = spec_document(PARAMS, A, behind_nat)
    assert doc["clusters"]["cluster-b"]["listener_name"] == "external"
    assert MigrationSpec.from_dict(doc).target_cluster.listener_name == "external"


def test_spec_document_defaults_for_absent_optional_params() -> None:
    doc = spec_document({"tenant": "acme"}, A, B)
    assert doc["namespaces"] is None and doc["topics"] == {"include": [".*"], "exclude": []}


def test_spec_document_takes_the_lookup_service_from_its_connection_without_the_token() -> None:
    lookup = Conn("pulsar_lookup", port=8090, password="lookup-s3cret")
    doc = spec_document({"tenant": "acme"}, A, B, lookup_conn=lookup)
    assert doc["lookup"] == {"url": "http://127.0.0.1:8090", "token_env": "PULSAR_TOKEN_PULSAR_LOOKUP"}
    assert "lookup-s3cret" not in json.dumps(doc)
    assert spec_document({"tenant": "acme"}, A, B, lookup_conn=Conn("open", port=None))["lookup"] == {
        "url": "http://127.0.0.1", "token_env": None}
    with pytest.raises(SpecError, match="connection nohost: host"):
        spec_document({"tenant": "acme"}, A, B, lookup_conn=Conn("nohost", host=None))
    private = Conn("tls_lookup", port=8443, schema="https", extra_dejson={"trust_certs_file": __file__})
    assert spec_document({"tenant": "acme"}, A, B, lookup_conn=private)["lookup"] == {
        "url": "https://127.0.0.1:8443", "token_env": None, "trust_certs_file": __file__}


@pytest.mark.parametrize(("params", "conns", "message"), [
    ({"tenant": "acme"}, (A, A), "spec: source and target are both 'cluster-a'; they must differ"),
    ({"tenant": "acme", "topics_exclude": ["("]}, (A, B), "spec: topics.exclude[0] is not a valid regex"),
    ({"tenant": "acme/x"}, (A, B), "spec: tenant 'acme/x' is not a valid Pulsar name"),
    ({"tenant": "acme"}, (A, Conn("bare", extra_dejson={})), "extra.service_url"),
    ({"tenant": "acme", "replication_mode": "geo", "copy_max_mb_per_s": 20}, (A, B),
     "spec: options.copy_max_mb_per_s caps copy mode only"),
])
def test_spec_document_rejects_bad_combinations_in_one_line(params: dict[str, Any], conns: tuple[Conn, Conn],
                                                            message: str) -> None:
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace("[", r"\[")) as caught:
        spec_document(params, *conns)
    assert "\n" not in str(caught.value)


def write_report(run_dir: Path, verdict: str, dry_run: bool = False, **details: Any) -> StepReport:
    spec = MigrationSpec.from_dict(spec_document({"tenant": "acme"}, A, B))
    report = StepReport.start("sync_metadata", spec, dry_run=dry_run)
    report.counts.update({"CREATE": 3, "CONFLICT": 1})
    report.hashes["desired"] = "ab" * 32
    report.details.update(details)
    report.finish(verdict, "boom" if verdict == "failed" else None)  # type: ignore[arg-type]
    report.write(str(run_dir))
    return report


def test_step_outcome_summarises_a_good_report(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    conflicts = [{"kind": "topic", "key": f"ns/t{i}", "reason": "r"} for i in range(30)]
    write_report(tmp_path, "ok", plan=str(tmp_path / "sync_metadata_plan"), conflicts=conflicts)
    with caplog.at_level(logging.INFO):
        out = step_outcome(str(tmp_path), "sync_metadata", step_succeeded=True, dry_run=False)
    assert (out["verdict"], out["dry_run"], out["tenant"], out["counts"]) == ("ok", False, "acme",
                                                                               {"CREATE": 3, "CONFLICT": 1})
    assert out["report"] == str(tmp_path / "sync_metadata.json")
    assert out["plan"] == str(tmp_path / "sync_metadata_plan")
    assert out["conflict_count"] == 1 and len(out["conflicts"]) == dag_support.CONFLICTS_IN_SUMMARY
    assert json.loads(json.dumps(out)) == out  # XCom-safe
    assert "sync_metadata: ok" in caplog.text and "counts: CONFLICT=1, CREATE=3" in caplog.text


@pytest.mark.parametrize(("verdict", "dry_run", "succeeded", "message"), [
    (None, False, False, "no report at"),
    ("failed", False, False, "sync_metadata failed: boom"),
    ("ok", False, False, "did not complete in this attempt"),  # a stale report from an earlier try
    ("planned", False, True, "verdict 'planned', expected 'ok'"),
    ("ok", True, True, "verdict 'ok', expected 'planned'"),
])
def test_step_outcome_fails_unless_the_step_did_its_job(tmp_path: Path, verdict: str | None, dry_run: bool,
                                                        succeeded: bool, message: str) -> None:
    if verdict:
        write_report(tmp_path, verdict, dry_run=verdict == "planned")
    with pytest.raises(StepOutcomeError, match=message):
        step_outcome(str(tmp_path), "sync_metadata", step_succeeded=succeeded, dry_run=dry_run)


def test_write_spec_round_trips(tmp_path: Path) -> None:
    doc = spec_document(PARAMS, A, B)
    location = dag_support.write_spec(str(tmp_path / "run"), doc)
    assert location == str(tmp_path / "run" / "spec.json")
    assert MigrationSpec.load(location).to_dict() == doc


def test_run_dir_spark_is_none_locally_and_reuses_an_active_session(spark: Any) -> None:
    with dag_support.run_dir_spark("/tmp/runs/x") as none:
        assert none is None
    with dag_support.run_dir_spark("s3a://bucket/runs/x") as session:
        assert session is spark
    assert not spark.sparkContext._jsc.sc().isStopped()  # not ours to stop


def test_switched_run_target_finds_the_migration_run_and_checks_its_connections(tmp_path: Path) -> None:
    run_id = "manual__2026-11-23T08:00:00+00:00"
    doc = spec_document(PARAMS, A, B)  # B's token travels in PULSAR_TOKEN_PULSAR_CLUSTER_B
    directory = dag_support.run_dir(str(tmp_path), dag_support.MIGRATION_DAG_ID, run_id)
    dag_support.write_spec(directory, doc)
    params = {"source_conn": A.conn_id, "target_conn": B.conn_id, "lookup_conn": "pulsar_lookup"}
    assert dag_support.switched_run_target(str(tmp_path), run_id, params) == {
        "spec_path": f"{directory}/spec.json", "run_dir": directory}
    with pytest.raises(ValueError, match=r"^no run 'manual__nope' of pulsar_tenant_migration with a spec at "):
        dag_support.switched_run_target(str(tmp_path), "manual__nope", params)
    with pytest.raises(ValueError, match="PULSAR_TOKEN_PULSAR_CLUSTER_B, not through connection other_b"):
        dag_support.switched_run_target(str(tmp_path), run_id, {**params, "target_conn": "other_b"})


def test_switched_run_target_checks_a_token_file_against_the_triggers_connection(tmp_path: Path) -> None:
    run_id = "manual__2026-11-28T08:00:00+00:00"
    renewed = Conn("pulsar_cluster_b", port=8082, extra_dejson={
        "cluster_name": "cluster-b", "service_url": "pulsar://127.0.0.1:6652", "token_file": "/run/secrets/b.token"})
    directory = dag_support.run_dir(str(tmp_path), dag_support.MIGRATION_DAG_ID, run_id)
    dag_support.write_spec(directory, spec_document(PARAMS, A, renewed))
    params = {"source_conn": A.conn_id, "target_conn": renewed.conn_id, "lookup_conn": "pulsar_lookup"}
    same = {A.conn_id: A, renewed.conn_id: renewed}
    assert dag_support.switched_run_target(str(tmp_path), run_id, params, connections=same)["run_dir"] == directory
    moved = Conn("pulsar_cluster_b", port=8082, extra_dejson={**renewed.extra_dejson, "token_file": "/other.token"})
    with pytest.raises(ValueError) as refused:
        dag_support.switched_run_target(str(tmp_path), run_id, params, connections={**same, moved.conn_id: moved})
    assert str(refused.value) == (f"run {run_id} reached its target cluster-b with the token in file "
                                  "/run/secrets/b.token, not through connection pulsar_cluster_b: trigger with that "
                                  "run's connections")


def test_a_connection_may_hold_a_token_file_instead_of_a_token() -> None:
    renewed = Conn("pulsar_cluster_b", port=8082, extra_dejson={
        "cluster_name": "cluster-b", "service_url": "pulsar://127.0.0.1:6652", "token_file": "/run/secrets/b.token"})
    doc = spec_document(PARAMS, A, renewed)
    assert doc["clusters"]["cluster-b"]["token_file"] == "/run/secrets/b.token"
    assert doc["clusters"]["cluster-b"]["token_env"] is None
    both = Conn("pulsar_cluster_b", port=8082, password="s3cret-token", extra_dejson=renewed.extra_dejson)
    with pytest.raises(ValueError) as refused:
        spec_document(PARAMS, A, both)
    assert str(refused.value) == ("spec: connection pulsar_cluster_b: holds more than one of a token (password), "
                                  "extra.token_file and extra.oauth2; give one")
    oauth = {"issuer_url": "https://auth.example.com/", "credentials_file": "/etc/pulsar/b.json"}
    with_oauth = Conn("pulsar_cluster_b", port=8082, extra_dejson={
        "cluster_name": "cluster-b", "service_url": "pulsar://127.0.0.1:6652", "oauth2": oauth})
    doc = spec_document(PARAMS, A, with_oauth)
    assert MigrationSpec.from_dict(doc).target_cluster.oauth2.credentials_file == "/etc/pulsar/b.json"


def test_a_window_needs_both_edges_or_neither() -> None:
    from pulsar_migration.dag_support import check_window

    check_window({"window_start": None, "window_end": None}, "2026-11-22T10:00:00+00:00")
    check_window({"window_start": "2026-11-22T10:00:00Z", "window_end": "2026-11-22T11:00:00Z"})
    check_window({"tenant": "acme"})  # a DAG without a window
    with pytest.raises(ValueError, match="window_start is set but window_end is not"):
        check_window({"window_start": "2026-11-22T10:00:00Z", "window_end": None})
    with pytest.raises(ValueError, match="window_end is set but window_start is not"):
        check_window({"window_start": "", "window_end": "2026-11-22T11:00:00Z"})


def test_a_run_without_a_data_interval_needs_a_window() -> None:
    """A run triggered with no logical date has no data interval: its window task failed to render (and was retried)
    where render_spec now refuses it in one line."""
    from pulsar_migration.dag_support import check_window

    interval_start = "2026-11-22T10:00:00+00:00"
    check_window({"window_start": None, "window_end": None}, interval_start)
    check_window({"window_start": "2026-11-22T10:00:00Z", "window_end": "2026-11-22T11:00:00Z"}, None)
    check_window({"tenant": "acme"}, None)  # a DAG without a window: the migration's
    with pytest.raises(ValueError, match=r"no data interval .* set window_start and window_end"):
        check_window({"window_start": None, "window_end": None}, None)


def test_topics_to_exclude_emptied_in_the_form_is_nothing_excluded() -> None:
    """The form sets an emptied list field to null: the param took only an array, so the run could not be triggered."""
    from pulsar_migration.dag_params import selection_params

    assert selection_params()["topics_exclude"].resolve(None) is None
    assert spec_document({**PARAMS, "topics_exclude": None}, A, B)["topics"]["exclude"] == []
