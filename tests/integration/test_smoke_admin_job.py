"""spark_jobs/smoke_admin.py through real spark-submit: it fails loudly when a cluster does not answer."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from localdev.airflow_local import airflow_env, venv_bin
from localdev.paths import PROJECT_ROOT
from localdev.pulsar_local import LocalCluster
from pulsar_migration.dag_support import library_zip

JOB = PROJECT_ROOT / "spark_jobs" / "smoke_admin.py"


def test_unreachable_cluster_fails_the_job(pulsar_clusters: list[LocalCluster], tmp_path: Path) -> None:
    clusters = {c.name: {"admin_url": c.admin_url, "service_url": c.service_url, "token_env": None, "tls": None}
                for c in pulsar_clusters}
    # Port 9 (discard) has no listener here: refused at once.
    clusters["cluster-z"] = {"admin_url": "http://127.0.0.1:9", "service_url": "pulsar://127.0.0.1:9"}
    output = tmp_path / "result.json"
    proc = subprocess.run(
        [str(venv_bin() / "spark-submit"), "--master", "local[2]", "--conf", "spark.ui.enabled=false",
         "--py-files", library_zip(tmp_path / "lib"), str(JOB),
         "--clusters", json.dumps(clusters), "--output", str(output), "--timeout", "30"],
        env=airflow_env(tmp_path / "airflow"), capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    # PythonRunner merges the driver's stderr into spark-submit's stdout.
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "cluster-z" in errors[0] and "unreachable" in errors[0], errors
    result = json.loads(output.read_text())
    assert result["ok"] is False
    by_name = {r["name"]: r for r in result["clusters"]}
    assert by_name["cluster-z"]["error"]
    assert all(by_name[c.name]["healthy"] for c in pulsar_clusters)
    assert any("does not list cluster-z" in p for p in result["problems"])


def test_token_variable_named_but_unset_fails_before_spark(tmp_path: Path) -> None:
    clusters = {"a": {"admin_url": "http://127.0.0.1:8081", "token_env": "PM_TEST_UNSET_TOKEN"},
                "b": {"admin_url": "http://127.0.0.1:8082"}}
    env = airflow_env(tmp_path / "airflow")
    env.pop("PM_TEST_UNSET_TOKEN", None)
    proc = subprocess.run([str(venv_bin() / "python"), str(JOB), "--clusters", json.dumps(clusters)],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: spec: environment variable PM_TEST_UNSET_TOKEN (token for a) is not set"
