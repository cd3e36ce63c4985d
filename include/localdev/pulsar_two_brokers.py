"""A local cluster of two brokers, as production clusters are: topics are owned by one broker or the other, and
the other answers an admin call or an HTTP lookup about them with a redirect (307) to the owner.

The first process is the distribution's standalone in ZooKeeper mode (ZooKeeper on 2181+i, a bookie and broker
one on the cluster's usual ports); the second is `bin/pulsar broker` on web 9081+i / broker 7651+i, joined through
that ZooKeeper (a RocksDB metadata store, as pulsar_local's clusters use, belongs to one process). Token
authentication as pulsar_local's `--auth` when asked. Files under var/pulsar/<name>/ like the others.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from pathlib import Path

from pulsar_migration.admin import PulsarAdmin

from localdev import pulsar_local
from localdev.processes import port_in_use
from localdev.pulsar_auth import LocalAuth
from localdev.pulsar_dist import ensure_distribution
from localdev.pulsar_local import LocalCluster, LocalClusterError

log = logging.getLogger(__name__)

SECOND_OFFSET = 1000  # the second broker's ports: the cluster's + this


def zookeeper_port(cluster: LocalCluster) -> int:
    return 2181 + cluster.index


def second_admin_url(cluster: LocalCluster) -> str:
    return f"http://127.0.0.1:{cluster.web_port + SECOND_OFFSET}"


def _second_pid_file(cluster: LocalCluster) -> Path:
    return cluster.root / "broker2.pid"


def _metadata(cluster: LocalCluster) -> dict[str, str]:
    url = f"zk:127.0.0.1:{zookeeper_port(cluster)}"
    return {"metadataStoreUrl": url, "configurationMetadataStoreUrl": url}


def owners(cluster: LocalCluster, topics: list[str]) -> set[str]:
    """The web URLs of the brokers that own `topics` (`persistent://...` partitions), looked up at the first broker
    (the load manager gives new bundles to the less loaded second one: the first hosts the bookie and the
    system topics)."""
    admin = cluster.admin(timeout_s=30)
    try:
        return {admin.get(f"/lookup/v2/topic/{t.replace('://', '/')}")["httpUrl"] for t in topics}
    finally:
        admin.close()


def start(cluster: LocalCluster, *, auth: bool, timeout_s: float = pulsar_local.START_TIMEOUT_S) -> None:
    """Starts both brokers afresh (data wiped), waits for both to be healthy, registers the cluster with the
    default pair."""
    stop(cluster)
    shutil.rmtree(cluster.root, ignore_errors=True)
    home = ensure_distribution()
    local_auth = LocalAuth.default(home).ensure() if auth else None
    for port in (cluster.web_port, cluster.broker_port, cluster.web_port + SECOND_OFFSET,
                 cluster.broker_port + SECOND_OFFSET, zookeeper_port(cluster)):
        if port_in_use(port):
            raise LocalClusterError(f"{cluster.name}: port {port} is taken by another process")
    work = cluster.root / "work"
    for d in (work, cluster.log_dir, cluster.root / "logs2"):
        d.mkdir(parents=True, exist_ok=True)
    if auth:
        cluster.auth_marker.write_text("token\n")
    first = cluster.root / "standalone.conf"
    first.write_text(pulsar_local.apply_overrides(
        pulsar_local.render_config((home / "conf" / "standalone.conf").read_text(), cluster, local_auth),
        _metadata(cluster)))
    second = cluster.root / "broker2.conf"
    second.write_text(pulsar_local.apply_overrides((home / "conf" / "broker.conf").read_text(), {
        **pulsar_local.CONFIG_OVERRIDES, **_metadata(cluster), "clusterName": cluster.name,
        "brokerServicePort": str(cluster.broker_port + SECOND_OFFSET),
        "webServicePort": str(cluster.web_port + SECOND_OFFSET), "functionsWorkerEnabled": "false",
        **(local_auth.broker_overrides() if local_auth else {})}))
    env = {**os.environ, "PULSAR_MEM": os.environ.get("PM_PULSAR_MEM", pulsar_local.PULSAR_MEM)}
    # bin/pulsar runs in the distribution's directory: ZooKeeper's data would land there without --zookeeper-dir.
    _spawn(cluster.pid_file, [str(home / "bin" / "pulsar"), "standalone", "--bookkeeper-dir",
                              str(cluster.root / "data" / "bookkeeper"), "--bookkeeper-port", "0",
                              "--zookeeper-dir", str(cluster.root / "data" / "zookeeper"),
                              "--no-functions-worker", "--no-stream-storage"],
           {**env, "PULSAR_STANDALONE_CONF": str(first), "PULSAR_LOG_DIR": str(cluster.log_dir),
            "PULSAR_STANDALONE_USE_ZOOKEEPER": "1"}, work, cluster.log_dir)
    try:
        _wait(cluster, cluster.admin(), timeout_s)
        _spawn(_second_pid_file(cluster), [str(home / "bin" / "pulsar"), "broker"],
               {**env, "PULSAR_BROKER_CONF": str(second), "PULSAR_LOG_DIR": str(cluster.root / "logs2")}, work,
               cluster.root / "logs2")
        second_admin = PulsarAdmin(second_admin_url(cluster), token=cluster.superuser_token(), timeout_s=5.0,
                                   retries=0, name=f"{cluster.name} (2nd)")
        _wait(cluster, second_admin, timeout_s)
    except LocalClusterError:
        stop(cluster)  # nothing left running for a start that failed
        raise
    pulsar_local.register_each_other([*pulsar_local.local_clusters(), cluster])


def stop(cluster: LocalCluster) -> None:
    """Stops both brokers (the second first: it leans on the first's ZooKeeper and bookie)."""
    pulsar_local.stop_group(_second_pid_file(cluster), f"{cluster.name} (2nd)")
    pulsar_local.stop_clusters([cluster])


def _spawn(pid_file: Path, command: list[str], env: dict[str, str], cwd: Path, log_dir: Path) -> None:
    with (log_dir / "stdout.log").open("ab") as out:
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    pid_file.write_text(str(proc.pid))


def _wait(cluster: LocalCluster, admin: PulsarAdmin, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not admin.healthy():
        if time.monotonic() > deadline:
            raise LocalClusterError(f"{cluster.name}: {admin.admin_url} not healthy after {timeout_s:.0f}s; "
                                    f"logs in {cluster.root}")
        time.sleep(1.0)
    log.info("%s: healthy at %s", cluster.name, admin.admin_url)
