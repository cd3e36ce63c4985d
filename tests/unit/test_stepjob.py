"""run_step: the step contract's exit codes, reports, and its single error line on stderr."""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pulsar_migration.report import StepReport
from pulsar_migration.stepjob import BAD_INPUT_EXIT, BadInput, StepContext, StepFailed, run_step

STEP = "sync_metadata"


@pytest.fixture
def argv(spec_dict: dict[str, Any], write_spec: Callable[..., str], tmp_path: Path,
         monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setenv("CLUSTER_B_TOKEN", "not-a-real-token")
    return ["--spec", write_spec(spec_dict), "--run-dir", str(tmp_path / "run")]


def _error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


def _report(argv: list[str]) -> StepReport:
    return StepReport.read(argv[argv.index("--run-dir") + 1], STEP)


def test_success_writes_an_ok_report(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[StepContext] = []

    def body(ctx: StepContext) -> None:
        seen.append(ctx)
        ctx.report.count("namespaces", 2)

    assert run_step(STEP, body, argv) == 0
    assert _error_lines(capsys.readouterr().err) == []
    ctx = seen[0]
    assert (ctx.step, ctx.spec.tenant, ctx.dry_run, ctx.run_dir) == (STEP, "acme", False, argv[3])
    report = _report(argv)
    assert report.verdict == "ok" and report.error is None and report.counts == {"namespaces": 2}
    assert report.spec_hash == ctx.spec.spec_hash() and report.duration_s is not None


def test_dry_run_is_planned_unless_the_body_says_otherwise(argv: list[str]) -> None:
    assert run_step(STEP, lambda ctx: None, [*argv, "--dry-run"]) == 0
    report = _report(argv)
    assert report.verdict == "planned" and report.dry_run is True

    def body(ctx: StepContext) -> None:
        ctx.report.verdict = "ok"  # e.g. nothing to do, already in sync

    assert run_step(STEP, body, [*argv, "--dry-run"]) == 0
    assert _report(argv).verdict == "ok"


def test_step_failed_exits_1_with_one_error_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    def body(ctx: StepContext) -> None:
        ctx.report.counts["topics"] = 3
        raise StepFailed("target has 2 topics,\nsource has 3")

    assert run_step(STEP, body, argv) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == f"error: {STEP}: target has 2 topics, source has 3"
    assert len(_error_lines(err)) == 1
    report = _report(argv)
    assert report.verdict == "failed" and report.error == "target has 2 topics, source has 3"
    assert report.counts == {"topics": 3}


def test_a_failure_after_a_token_expired_names_the_token_first(argv: list[str], monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    from tests.unit.test_tokens import jwt

    def body(ctx: StepContext) -> None:
        monkeypatch.setenv("CLUSTER_B_TOKEN", jwt({"sub": "pm-admin", "exp": 1767323045}))  # gone while it ran
        raise StepFailed("reading persistent://acme/ns/t-partition-0 stalled for 60s")

    assert run_step(STEP, body, argv) == 1
    assert _error_lines(capsys.readouterr().err) == [
        f"error: {STEP}: the token in CLUSTER_B_TOKEN (cluster cluster-b) expired at 2026-01-02T03:04:05Z during "
        "the run (a re-run with a fresh token resumes): reading persistent://acme/ns/t-partition-0 stalled for 60s"]
    monkeypatch.setenv("CLUSTER_B_TOKEN", jwt({"sub": "pm-admin", "exp": 4102444800}))  # 2100: not the cause
    assert run_step(STEP, lambda ctx: (_ for _ in ()).throw(StepFailed("stalled")), argv) == 1
    assert _error_lines(capsys.readouterr().err) == [f"error: {STEP}: stalled"]


def test_bad_input_exits_2_so_the_dag_does_not_retry(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    def body(ctx: StepContext) -> None:
        raise BadInput("tenant 'x' does not exist on cluster cluster-a")

    assert run_step(STEP, body, argv) == BAD_INPUT_EXIT == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"error: {STEP}: tenant 'x' does not exist on cluster cluster-a"
    assert _report(argv).verdict == "failed"


def test_a_failed_verdict_without_raising_still_fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    def body(ctx: StepContext) -> None:
        ctx.report.verdict = "failed"
        ctx.report.error = "hashes differ"

    assert run_step(STEP, body, argv) == 1
    assert _error_lines(capsys.readouterr().err) == [f"error: {STEP}: hashes differ"]
    assert _report(argv).verdict == "failed"


def test_unexpected_exception_is_logged_with_traceback(argv: list[str], capsys: pytest.CaptureFixture[str],
                                                      caplog: pytest.LogCaptureFixture) -> None:
    def body(ctx: StepContext) -> None:
        raise KeyError("partitions")

    with caplog.at_level(logging.INFO):
        assert run_step(STEP, body, argv) == 1
    assert _error_lines(capsys.readouterr().err) == [f"error: {STEP}: KeyError: 'partitions'"]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert errors and errors[0].exc_info is not None
    assert _report(argv).error == "KeyError: 'partitions'"
    assert any("failed" in r.getMessage() and r.levelno == logging.INFO for r in caplog.records)  # summary


def test_invalid_spec_exits_2_and_writes_nothing(spec_dict: dict[str, Any], write_spec: Callable[..., str],
                                                 tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    del spec_dict["tenant"]
    run_dir = tmp_path / "run"
    called: list[bool] = []
    code = run_step(STEP, lambda ctx: called.append(True), ["--spec", write_spec(spec_dict), "--run-dir", str(run_dir)])
    assert code == 2 and not called and not run_dir.exists()
    assert capsys.readouterr().err == "error: spec: missing field 'tenant'\n"


def test_unset_token_variable_exits_2(argv: list[str], monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("CLUSTER_B_TOKEN")
    assert run_step(STEP, lambda ctx: None, argv) == 2
    assert capsys.readouterr().err == (
        "error: spec: environment variable CLUSTER_B_TOKEN (token for cluster-b) is not set\n")


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_step(STEP, lambda ctx: None, ["--run-dir", "/tmp/x"]) == 2
    assert "--spec" in capsys.readouterr().err


def test_extra_arguments(argv: list[str]) -> None:
    def add_args(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--start", required=True)
        parser.add_argument("--end", required=True)

    seen: list[argparse.Namespace] = []
    window = ["--start", "2026-01-01T00:00:00Z", "--end", "2026-01-02T00:00:00Z"]
    assert run_step("backfill_window", lambda ctx: seen.append(ctx.args), [*argv, *window], add_args=add_args) == 0
    assert (seen[0].start, seen[0].end) == ("2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z")


def test_unwritable_run_dir_fails_before_the_body(argv: list[str], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    argv[argv.index("--run-dir") + 1] = str(blocker / "run")
    called: list[bool] = []
    assert run_step(STEP, lambda ctx: called.append(True), argv) == 1
    assert not called
    assert _error_lines(capsys.readouterr().err) == [f"error: {STEP}: cannot create run dir {blocker / 'run'}: "
                                                     "Not a directory"]


def test_body_can_use_spark(argv: list[str], spark: Any) -> None:
    def body(ctx: StepContext) -> None:
        ctx.report.counts["rows"] = ctx.spark.range(5).count()

    assert run_step(STEP, body, argv) == 0
    assert _report(argv).counts == {"rows": 5}
    assert spark.range(2).count() == 2  # a session run_step did not build is left running


def test_unreachable_admin_url_names_the_cluster(spec_dict: dict[str, Any], write_spec: Callable[..., str],
                                                 tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CLUSTER_B_TOKEN", "x")
    spec_dict["clusters"]["cluster-a"]["admin_url"] = "http://127.0.0.1:1"  # nothing listens on port 1
    run_dir = tmp_path / "run"

    def body(ctx: StepContext) -> None:
        ctx.spec.source_cluster.admin(retries=1).clusters()

    assert run_step(STEP, body, ["--spec", write_spec(spec_dict), "--run-dir", str(run_dir)]) == 1
    lines = _error_lines(capsys.readouterr().err)
    assert lines == [f"error: {STEP}: cluster cluster-a is unreachable at http://127.0.0.1:1: ConnectionError"]
    assert StepReport.read(str(run_dir), STEP).verdict == "failed"


@pytest.mark.slow
def test_under_spark_submit_the_error_line_reaches_stderr(spec_dict: dict[str, Any], write_spec: Callable[..., str],
                                                          tmp_path: Path) -> None:
    """spark-submit merges the Python driver's stderr into its stdout; the error line must still reach stderr."""
    script = tmp_path / "failing_step.py"
    script.write_text(
        "import sys\n"
        "from pulsar_migration.stepjob import StepFailed, run_step\n"
        "def body(ctx):\n"
        "    raise StepFailed('verification failed')\n"
        "sys.exit(run_step('demo_step', body))\n",
        encoding="utf-8",
    )
    spec_dict["clusters"]["cluster-b"]["token_env"] = None
    spark_submit = Path(sys.executable).with_name("spark-submit")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    done = subprocess.run(
        [str(spark_submit), "--master", "local[1]", "--conf", "spark.ui.enabled=false", str(script),
         "--spec", write_spec(spec_dict), "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert done.returncode == 1
    assert _error_lines(done.stderr) == ["error: demo_step: verification failed"]
    assert _error_lines(done.stdout) == []
    assert StepReport.read(str(tmp_path / "run"), "demo_step").verdict == "failed"
