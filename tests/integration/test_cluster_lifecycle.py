"""Lifecycle promises of the local cluster tooling, on a third throwaway cluster (cluster-c)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from localdev import processes, pulsar_local
from localdev.pulsar_local import LocalCluster, LocalClusterError


@pytest.fixture
def cluster_c(pulsar_clusters: list[LocalCluster]) -> Iterator[LocalCluster]:
    cluster = pulsar_local.local_clusters(3)[2]
    pulsar_local.stop_clusters([cluster])
    shutil.rmtree(cluster.root, ignore_errors=True)
    yield cluster
    pulsar_local.stop_clusters([cluster])
    shutil.rmtree(cluster.root, ignore_errors=True)


def test_start_is_idempotent_registers_all_and_stop_leaves_no_process(cluster_c: LocalCluster) -> None:
    pulsar_local.start(3)
    pid = int(cluster_c.pid_file.read_text())
    assert cluster_c.admin().healthy()
    assert set(pulsar_local.local_clusters(1)[0].admin().clusters()) >= {"cluster-a", "cluster-b", "cluster-c"}
    assert set(cluster_c.admin().clusters()) >= {"cluster-a", "cluster-b", "cluster-c"}

    pulsar_local.start(3)  # already running: no second broker
    assert int(cluster_c.pid_file.read_text()) == pid
    assert pulsar_local.status(3)["cluster-c"].startswith("healthy")

    pulsar_local.stop_clusters([cluster_c])
    assert not processes.alive(pid)
    assert not processes.port_in_use(cluster_c.web_port)
    assert not processes.port_in_use(cluster_c.broker_port)
    assert pulsar_local.status(3)["cluster-c"] == "stopped"


def test_crashed_start_reports_the_log_tail_and_leaves_nothing(cluster_c: LocalCluster,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PM_PULSAR_MEM", "-Xmx1m -Xms1m")  # the JVM cannot start with this heap
    with pytest.raises(LocalClusterError) as failure:
        pulsar_local.start(3, timeout_s=60)
    message = str(failure.value)
    assert "cluster-c" in message and "last log lines" in message
    assert "heap" in message.lower()  # the JVM's own complaint, from the log tail
    assert pulsar_local.status(3)["cluster-c"] == "stopped"
    assert pulsar_local.status(3)["cluster-a"].startswith("healthy")


def test_cli_reports_errors_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert pulsar_local.main(["logs", "cluster-z"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: unknown cluster 'cluster-z'; known: cluster-a, cluster-b"]
