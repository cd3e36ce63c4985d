"""The migration report from step reports: verdict rules, the numbers it gathers, escaping in the HTML."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pulsar_migration import migration_report

HASH_A, HASH_B = "a" * 64, "b" * 64


def step_report(step: str, verdict: str = "ok", **extra: Any) -> dict[str, Any]:
    return {"step": step, "verdict": verdict, "dry_run": verdict == "planned", "duration_s": 1.5, "error": None,
            "counts": {}, "hashes": {}, "details": {}, **extra}


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    (tmp_path / "spec.json").write_text(json.dumps({"tenant": "acme<b>", "source": "a", "target": "b",
                                                    "replication": {"mode": "copy"}}))
    reports = {
        "sync_metadata": step_report("sync_metadata", counts={"CREATE": 3, "topic.CREATE": 2,
                                                              "set_only_on_target": 1}),
        "replicate_topics": step_report("replicate_topics", details={"partitions": [
            {"topic": "persistent://acme/ns/t", "status": "ok", "source_messages": 5, "copied_messages": 5,
             "target_messages": 5, "source_hash": HASH_A, "target_hash": HASH_A},
            {"topic": "persistent://acme/ns/u", "status": "ok", "source_messages": 2, "copied_messages": 2,
             "target_messages": 2, "source_hash": HASH_A, "target_hash": HASH_B}],
            "mb_per_s": 12.5, "copy_engine": "java",
            "throttle": {"max_mb_per_s": 20.0, "max_msgs_per_s": 5000, "held_back_s": 3.25},
            "trim_risk": {"count": 1, "topics": ["persistent://acme/ns/u"],
                          "warning": "1 topic(s) keep no retention"},
            "follows_run_dir": "/runs/pulsar_tenant_migration/manual__1", "map_rows_seeded": 1200}),
        "sync_progress": step_report("sync_progress", details={"subscriptions": [
            {"topic": "persistent://acme/ns/t", "subscription": "s", "lost": 0, "duplicated": 1}]}),
        "switch_lookup": step_report("switch_lookup", details={
            "hold_s": 1.25, "phases_s": {"fence": 0.5}, "route_before": "a", "route_after": "b",
            "catch_up": [{"counts": {"copied_messages": 4}}], "final_replicate": {"counts": {"copied_messages": 1}},
            "final_progress": {"counts": {"lost": 2, "duplicated": 0}}}),
        "cleanup_source": step_report("cleanup_source", "planned", counts={"partitions": 2}),
    }
    for step, report in reports.items():
        (tmp_path / f"{step}.json").write_text(json.dumps(report))
    return tmp_path


def test_gathers_counts_hashes_subscriptions_and_the_cutover(run_dir: Path) -> None:
    summary = migration_report.build(str(run_dir), dag_id="d", run_id="r")

    assert summary["verdict"] == "planned"  # the cleanup was not confirmed
    assert [p["hashes_equal"] for p in summary["partitions"]] == [True, False]
    # sync_progress's verification and the switch's final one both count
    assert (summary["lost"], summary["duplicated"]) == (2, 1)
    assert summary["cutover"]["copied_messages"] == 5 and summary["cutover"]["hold_s"] == 1.25
    assert summary["total_step_s"] == 7.5
    written = migration_report.write(str(run_dir), summary)
    assert json.loads(Path(written["json"]).read_text())["partitions"][1]["target_hash"] == HASH_B
    markdown = Path(written["markdown"]).read_text()
    assert "warning: 1 namespace(s) or topic(s) hold policies the source does not" in markdown
    assert "| persistent://acme/ns/u | ok | 2 | 2 | 2 | aaaaaaaaaaaaaaaa | bbbbbbbbbbbbbbbb | NO |" in markdown
    assert ("continues the run in /runs/pulsar_tenant_migration/manual__1 (1200 map rows taken from it); "
            "copied at 12.5 MB/s through the java path; rate cap 20 MB/s and 5000 msgs/s, copies held back 3.25 s "
            "in all; warning: 1 topic(s) keep no retention") in markdown
    page = Path(written["html"]).read_text()
    assert "acme&lt;b&gt;" in page and "acme<b>" not in page  # names are escaped, never markup


@pytest.mark.parametrize(("verdicts", "expected"), [
    (["ok"] * 5, "ok"),
    (["planned"] * 5, "planned"),
    (["ok"] * 4 + ["planned"], "planned"),
    (["ok", "failed", "not run", "not run", "not run"], "failed"),
    (["ok"] * 4 + ["not run"], "failed"),
])
def test_verdict(verdicts: list[str], expected: str) -> None:
    assert migration_report.verdict([{"verdict": v} for v in verdicts]) == expected


STEPS = migration_report.STEPS


@pytest.mark.parametrize(("verdicts", "says"), [
    (["ok"] * 5, "every step did its work and verified it"),
    (["planned"] * 5, "a dry run: every step planned, nothing was written to either cluster"),
    (["ok"] * 4 + ["planned"], "the tenant is moved and verified; the source still holds its copy (cleanup_source "
                               "only planned: run pulsar_source_cleanup with this run's id and confirm_cleanup to "
                               "delete it)"),
    (["ok", "ok", "planned", "planned", "planned"], "sync_metadata, replicate_topics done; sync_progress, "
                                                    "switch_lookup, cleanup_source only planned"),
    (["ok", "failed", "not run", "not run", "not run"], "replicate_topics failed: boom; the steps are idempotent: "
                                                        "fix the cause and trigger the DAG again with the same "
                                                        "parameters"),
])
def test_the_verdict_in_words(verdicts: list[str], says: str) -> None:
    steps = [{"step": step, "verdict": v, "error": "boom" if v == "failed" else None}
             for step, v in zip(STEPS, verdicts, strict=True)]
    assert migration_report.meaning(steps) == says


def test_the_report_says_what_planned_means(run_dir: Path) -> None:
    summary = migration_report.build(str(run_dir), dag_id="d", run_id="r")
    written = migration_report.write(str(run_dir), summary)
    sentence = "The tenant is moved and verified; the source still holds its copy"
    assert summary["meaning"].startswith(sentence[:1].lower() + sentence[1:])
    assert sentence in Path(written["markdown"]).read_text() and sentence in Path(written["html"]).read_text()


def test_missing_step_reports_are_not_run(tmp_path: Path) -> None:
    (tmp_path / "sync_metadata.json").write_text(json.dumps(step_report("sync_metadata", "failed", error="boom")))

    summary = migration_report.build(str(tmp_path))

    assert summary["verdict"] == "failed" and summary["tenant"] is None
    assert [s["verdict"] for s in summary["steps"]] == ["failed"] + ["not run"] * 4
    assert "boom" in migration_report.to_markdown(summary)


def test_a_rolled_back_run_says_so_and_a_failed_rollback_is_told(run_dir: Path) -> None:
    """pulsar_tenant_rollback writes its report and note into the migration's run dir: the run's page and the
    plugin's list said "the tenant is moved and verified" after the clients were switched back (until 2026-11-29)."""
    switched = json.loads((run_dir / "switch_lookup.json").read_text())
    (run_dir / "switch_lookup.json").write_text(json.dumps({**switched, "finished_at": "2026-11-29T10:00:00Z",
                                                            "tenant": "acme", "source": "a", "target": "b",
                                                            "spec_hash": "h"}))
    ids = {"tenant": "acme", "source": "a", "target": "b", "spec_hash": "h"}  # what StepReport.read needs
    refused = step_report("rollback_lookup", "failed", error="cleanup_source started deleting at ...", **ids)
    (run_dir / "rollback_lookup.json").write_text(json.dumps(refused))
    summary = migration_report.build(str(run_dir))
    assert summary["verdict"] == "planned" and summary["rolled_back_at"] is None
    assert summary["meaning"].endswith("; pulsar_tenant_rollback failed: cleanup_source started deleting at ...")
    assert [s["step"] for s in summary["steps"]][-1] == "rollback_lookup"
    back = step_report("rollback_lookup", finished_at="2026-11-29T11:00:00Z", details={"route_after": "a"}, **ids)
    (run_dir / "rollback_lookup.json").write_text(json.dumps(back))
    summary = migration_report.build(str(run_dir))
    assert summary["verdict"] == "rolled_back" and summary["rolled_back_at"] == "2026-11-29T11:00:00Z"
    assert summary["meaning"].startswith("rolled back: the tenant's clients were switched back to a at")
    assert "Rolled back" in Path(migration_report.write(str(run_dir), summary)["html"]).read_text()


def test_a_failure_after_the_flip_is_cleared_not_triggered_again() -> None:
    """A new DAG run starts from sync_metadata, over a target the clients may use already."""
    steps = [{"step": s, "verdict": v, "error": "probe failed" if v == "failed" else None}
             for s, v in zip(STEPS, ["ok", "ok", "ok", "failed", "not run"], strict=True)]
    said = migration_report.meaning(steps)
    assert "clear the failed task in this run" in said and "trigger the DAG again" not in said
    steps[3] = {"step": "switch_lookup", "verdict": "not run", "error": None}
    steps[2] = {"step": "sync_progress", "verdict": "failed", "error": "lost 1"}
    assert "trigger the DAG again with the same parameters" in migration_report.meaning(steps)


def test_a_rollback_after_a_failed_switch_is_rolled_back_and_tells_the_failure(run_dir: Path) -> None:
    ids = {"tenant": "acme", "source": "a", "target": "b", "spec_hash": "h"}
    failed = step_report("switch_lookup", "failed", error="probe failed", finished_at="2026-11-29T10:00:00Z",
                         details={"route_after": "b"}, **ids)
    (run_dir / "switch_lookup.json").write_text(json.dumps(failed))
    back = step_report("rollback_lookup", finished_at="2026-11-29T11:00:00Z", details={"route_after": "a"}, **ids)
    (run_dir / "rollback_lookup.json").write_text(json.dumps(back))
    summary = migration_report.build(str(run_dir))
    assert summary["verdict"] == "rolled_back", summary["meaning"]
    assert summary["meaning"].endswith("set to this run; before it, switch_lookup failed: probe failed")
