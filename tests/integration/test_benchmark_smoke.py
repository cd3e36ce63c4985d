"""A tiny run of benchmarks/replication_throughput.py so the harness cannot rot: every method on a few hundred
messages of one size, output into tmp_path (never benchmarks/results/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from localdev.pulsar_local import LocalCluster
from pulsar_migration.admin import PulsarAdmin
from pyspark.sql import SparkSession

from benchmarks import replication_throughput as bench


def test_replication_throughput_harness_runs_every_method(cluster_a: LocalCluster, cluster_b: LocalCluster,
                                                          admin_a: PulsarAdmin, admin_b: PulsarAdmin,
                                                          spark: SparkSession, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    # The harness talks to the default local pair; make sure the fixtures' clusters are those.
    assert (cluster_a.admin_url, cluster_a.service_url) == (bench.SOURCE.admin_url, bench.SOURCE.service_url)
    assert (cluster_b.admin_url, cluster_b.service_url) == (bench.TARGET.admin_url, bench.TARGET.service_url)

    code = bench.main(["--messages", "300", "--sizes", "1024", "--shapes", "batched", "--lookup-mb", "0",
                       "--partitions", "2", "--geo-timeout", "60", "--settle", "1",
                       "--copy-option", "copy_max_in_flight=1000", "--out-dir", str(tmp_path),
                       "--work-dir", str(tmp_path / "work")])

    assert code == 0
    [out] = tmp_path.glob("replication_throughput-*.json")
    assert (tmp_path / "work").is_dir()
    assert out.with_suffix(".png").stat().st_size > 0
    result = json.loads(out.read_text())
    [ds] = result["datasets"]
    assert (ds["size"], ds["batched"], ds["messages"]) == (1024, True, 300)
    assert set(ds["methods"]) == {"raw", "geo", "copy", "naive", "bare"}
    for name, method in ds["methods"].items():
        assert method["msgs_per_s"] > 0 and method["mb_per_s"] > 0, name
    assert ds["methods"]["copy"]["copied_messages"] == 300
    assert ds["methods"]["copy"]["options"]["copy_max_in_flight"] == 1000  # --copy-option reached the spec
    # The wait for idle brokers before each timed method, bounded by --settle (the other test worker keeps them busy).
    assert result["settle_max_s"] == 1.0
    assert all(0 <= ds["methods"][m]["settle_s"] <= 5 for m in ("geo", "copy", "bare"))  # 1 s and a poll, not 20
    assert ds["methods"]["copy"]["step_wall"]["mb_per_s"] > 0
    assert ds["methods"]["geo"]["target_entries"] == ds["methods"]["geo"]["source_entries"] > 0
    for key in ("produce", "consume", "pipeline"):
        assert ds["methods"]["raw"][key]["msgs_per_s"] > 0, key
    assert ds["ratios"]["copy_phase_vs_geo"] > 0 and ds["ratios"]["copy_phase_vs_raw_pipeline"] > 0
    bare = ds["methods"]["bare"]["figures"]
    assert bare["messages"] == 300 and bare["receipts"] == bare["entries"] > 0
    assert ds["ratios"]["bare_vs_geo"] > 0 and ds["ratios"]["copy_wall_vs_bare"] > 0
    assert "| 1024B-batched | 300 |" in capsys.readouterr().out
    # Every tenant the run created is gone from both clusters.
    assert result["tenants"]
    assert not set(result["tenants"]) & (set(admin_a.get("/tenants")) | set(admin_b.get("/tenants")))


def test_replication_scale_harness_runs_its_three_copies(cluster_a: LocalCluster, cluster_b: LocalCluster,
                                                         admin_a: PulsarAdmin, admin_b: PulsarAdmin,
                                                         spark: SparkSession, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import replication_scale as scale

    assert (cluster_a.admin_url, cluster_b.admin_url) == (scale.SOURCE.admin_url, scale.TARGET.admin_url)
    assert scale.main(["--topics", "6", "--messages", "3", "--geo-timeout", "120", "--out-dir", str(tmp_path)]) == 0
    [out] = tmp_path.glob("replication_scale-*.json")
    result = json.loads(out.read_text())
    run = result["run"]
    assert run["naive_messages"] == 3 * run["partitions"] > 0
    # The harness itself fails unless each copy moved exactly what it should; its figures are all there.
    assert run["copy_first"]["copied_messages"] == 3 * run["partitions"]
    assert run["copy_noop"]["copied_messages"] == 0
    assert run["copy_delta"]["copied_messages"] == run["delta_partitions"] > 0
    assert all(run[k]["wall_s"] > 0 for k in ("copy_first", "copy_noop", "copy_delta"))
    assert run["geo_s"] > 0 and run["geo_entries"] == 3 * run["partitions"]
    assert f"| 6 ({run['partitions']}) |" in capsys.readouterr().out
    assert result["tenants"]
    assert not set(result["tenants"]) & (set(admin_a.get("/tenants")) | set(admin_b.get("/tenants")))
