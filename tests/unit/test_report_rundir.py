"""Run-dir I/O (local paths, file:// URIs, Hadoop FS through Spark) and step reports."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from pulsar_migration import rundir
from pulsar_migration.report import StepReport, canonical_line, stable_hash
from pulsar_migration.spec import MigrationSpec

# -- rundir -----------------------------------------------------------------------------------------


def test_join_keeps_the_run_dir_form() -> None:
    assert rundir.join("/tmp/run", "a.json") == "/tmp/run/a.json"
    assert rundir.join("/tmp/run/", "a.json") == "/tmp/run/a.json"
    assert rundir.join("file:///tmp/run", "positions/p.json") == "file:///tmp/run/positions/p.json"
    assert rundir.join("s3a://bucket/runs/1", "a.json") == "s3a://bucket/runs/1/a.json"
    for escaping in ("", "/etc/passwd", "../x", "a/../../x"):
        with pytest.raises(ValueError):
            rundir.join("/tmp/run", escaping)


def test_is_local() -> None:
    assert rundir.is_local("/tmp/x") and rundir.is_local("rel/x") and rundir.is_local("file:///tmp/x")
    assert rundir.is_local("file:/tmp/x") and rundir.local_path("file:/tmp/x") == "/tmp/x"
    assert not rundir.is_local("s3a://b/x") and not rundir.is_local("hdfs://nn:8020/x")


@pytest.mark.parametrize("form", ["path", "file-uri", "file-colon"])
def test_write_read_exists_local(tmp_path: Path, form: str) -> None:
    base = tmp_path / "run"
    run_dir = {"path": str(base), "file-uri": base.as_uri(), "file-colon": f"file:{base}"}[form]
    rundir.ensure_dir(run_dir)
    assert base.is_dir()
    assert not rundir.exists(run_dir, "a.json")
    where = rundir.write_text(run_dir, "sub/a.json", "héllo\n")  # parents are created
    assert where == rundir.join(run_dir, "sub/a.json")
    assert rundir.exists(run_dir, "sub/a.json")
    assert rundir.read_text(run_dir, "sub/a.json") == "héllo\n"
    assert (base / "sub" / "a.json").read_text(encoding="utf-8") == "héllo\n"
    with pytest.raises(FileNotFoundError):
        rundir.read_text(run_dir, "missing.json")


def test_local_write_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rundir.write_text(str(tmp_path), "r.json", "old")
    rundir.write_text(str(tmp_path), "r.json", "new")
    assert (tmp_path / "r.json").read_text() == "new"
    assert os.listdir(tmp_path) == ["r.json"]  # no temp files left behind

    def crash(src: str, dst: str) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk gone"):
        rundir.write_text(str(tmp_path), "r.json", "torn")
    assert (tmp_path / "r.json").read_text() == "new"  # readers still see the last complete file
    assert os.listdir(tmp_path) == ["r.json"]


def test_non_local_run_dir_needs_a_spark_session(monkeypatch: pytest.MonkeyPatch) -> None:
    from pyspark.sql import SparkSession

    monkeypatch.setattr(SparkSession, "getActiveSession", staticmethod(lambda: None))
    with pytest.raises(ValueError, match="needs an active SparkSession"):
        rundir.read_text("s3a://bucket/run", "a.json")


def test_hadoop_filesystem_path(spark: Any, tmp_path: Path) -> None:
    """The py4j branch used for s3a:// and hdfs://, exercised on Hadoop's own file: filesystem."""
    hadoop = rundir._Hadoop(spark)
    base = (tmp_path / "hrun").as_uri()
    hadoop.mkdirs(base)
    assert (tmp_path / "hrun").is_dir()
    uri = f"{base}/r.json"
    assert not hadoop.exists(uri)
    hadoop.write_text(uri, "first ✓")
    hadoop.write_text(uri, "second ✓")  # replaces the existing file
    assert hadoop.exists(uri) and hadoop.read_text(uri) == "second ✓"
    assert sorted(p.name for p in (tmp_path / "hrun").iterdir() if not p.name.startswith(".")) == ["r.json"]
    with pytest.raises(FileNotFoundError):
        hadoop.read_text(f"{base}/missing.json")


# -- reports ----------------------------------------------------------------------------------------


def _report(spec_dict: dict[str, Any], **kwargs: Any) -> StepReport:
    return StepReport.start("sync_metadata", MigrationSpec.from_dict(spec_dict), **kwargs)


def test_report_starts_from_the_spec_and_finishes(spec_dict: dict[str, Any]) -> None:
    report = _report(spec_dict, dry_run=True)
    spec = MigrationSpec.from_dict(spec_dict)
    assert (report.tenant, report.source, report.target, report.spec_hash) == (
        "acme", "cluster-a", "cluster-b", spec.spec_hash())
    assert report.verdict == "running" and report.started_at.endswith("Z")
    report.count("namespaces")
    report.count("namespaces", 2)
    report.finish("planned")
    assert report.counts == {"namespaces": 3}
    assert report.verdict == "planned" and report.finished_at is not None
    assert report.duration_s is not None and report.duration_s >= 0


def test_report_write_read_round_trip(spec_dict: dict[str, Any], tmp_path: Path) -> None:
    report = _report(spec_dict)
    report.counts["topics"] = 4
    report.hashes["topics"] = stable_hash(["a", "b"])
    report.details["plan"] = [{"kind": "namespace", "name": "acme/ns1"}]
    report.details["seen"] = {"b", "a"}  # not JSON-native: stored as a sorted list
    report.finish("failed", "counts differ")
    for run_dir in (str(tmp_path / "r1"), (tmp_path / "r2").as_uri()):
        where = report.write(run_dir)
        assert where.endswith("/sync_metadata.json")
        back = StepReport.read(run_dir, "sync_metadata")
        assert back.to_dict() == {**report.to_dict(), "details": {**report.details, "seen": ["a", "b"]}}
    on_disk = json.loads((tmp_path / "r1" / "sync_metadata.json").read_text())
    assert set(on_disk) == {"step", "tenant", "source", "target", "spec_hash", "dry_run", "started_at",
                            "finished_at", "duration_s", "verdict", "error", "counts", "hashes", "details"}


def test_summary_lines(spec_dict: dict[str, Any]) -> None:
    report = _report(spec_dict, dry_run=True)
    report.counts.update(topics=3, namespaces=1)
    report.hashes["topics"] = "f" * 64
    report.finish("failed", "boom")
    lines = report.summary_lines()
    assert lines[0].startswith("sync_metadata: failed (dry run), tenant acme, cluster-a -> cluster-b in ")
    assert lines[1:] == ["counts: namespaces=1, topics=3", f"hashes: topics={'f' * 16}", "failure: boom"]


def test_stable_hash_is_order_insensitive_but_content_sensitive() -> None:
    rows = [canonical_line({"topic": t, "n": n}) for t, n in (("a", 1), ("b", 2), ("c", 3))]
    assert stable_hash(rows) == stable_hash(reversed(rows)) == stable_hash(iter(sorted(rows)))
    assert stable_hash(rows) != stable_hash(rows[:2])
    assert stable_hash(rows) != stable_hash([*rows, rows[0]])  # duplicates count
    assert stable_hash(["a\nb"]) != stable_hash(["a", "b"])  # row boundaries are unambiguous
    assert len(stable_hash([])) == 64
    assert canonical_line({"b": 1, "a": [1, 2]}) == '{"a":[1,2],"b":1}'
