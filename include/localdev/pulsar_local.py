"""Starts, health-checks, registers and stops N local Pulsar standalone clusters.

    python -m localdev.pulsar_local start [--clusters 2] [--fresh] [--auth]
    python -m localdev.pulsar_local status | stop | fetch | logs NAME

Cluster i (0-based) is `cluster-<letter>` with web port 8081+i and broker port 6651+i (8080 belongs
to Airflow). Each has its own working, data and log directories under var/pulsar/<name>/, so the
standalone starter never finds another instance's ZooKeeper dir and falls back to ZooKeeper mode.

`--auth` (`make clusters-up AUTH=1`) starts them with token authentication and authorization on
(localdev.pulsar_auth: key and tokens under var/auth/); a marker file in the cluster's directory records
it, so the tools' own admin client sends the superuser token and a later start in the other mode refuses
rather than mixing the two.

The default pair (cluster-a, cluster-b) also serves TLS on ports of its own (web 8443+i, broker 6751+i, client
certificates required: localdev.pulsar_tls), for clients that must switch over TLS; the tools and the peers'
registrations use the plain ports.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pulsar_migration.admin import PulsarAdmin

from localdev import java_programs
from localdev.paths import var_dir
from localdev.processes import alive, file_tail, port_in_use, read_live_pid, signal_group
from localdev.pulsar_auth import SUPERUSER_ROLE, TOKEN_CLIENT_PLUGIN, AuthSetupError, LocalAuth, token_file
from localdev.pulsar_dist import DistributionError, ensure_distribution
from localdev.pulsar_tls import LocalTls

log = logging.getLogger(__name__)

DEFAULT_CLUSTER_COUNT = 2
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 45.0
# Two brokers (each with embedded BookKeeper) beside Airflow and Spark on a 2-core / 24 GiB machine. Direct
# memory holds BookKeeper reads: with 768m, native geo-replication of 4 partitions of 128 KiB batches (each
# replicator reads 1000 entries at once) ran the broker out of it and its replicators stalled (4.0.8).
# PM_PULSAR_MEM overrides it.
PULSAR_MEM = "-Xms256m -Xmx1g -XX:MaxDirectMemorySize=2g"
# Cluster i hands out ledger ids from i x this on (seed_ledger_ids), below 2^31 where short ids end.
LEDGER_ID_SPACING = 100_000_000

CONFIG_OVERRIDES = {
    "advertisedAddress": "127.0.0.1",
    "bindAddress": "127.0.0.1",
    "managedLedgerDefaultEnsembleSize": "1",
    "managedLedgerDefaultWriteQuorum": "1",
    "managedLedgerDefaultAckQuorum": "1",
    "brokerDeleteInactiveTopicsEnabled": "false",
    "loadBalancerEnabled": "false",
    # Tests and cleanup delete whole test tenants.
    "forceDeleteNamespaceAllowed": "true",
    "forceDeleteTenantAllowed": "true",
}


class LocalClusterError(RuntimeError):
    """A local cluster could not be started, checked or stopped."""


@dataclass(frozen=True)
class LocalCluster:
    index: int

    @property
    def name(self) -> str:
        return f"cluster-{chr(ord('a') + self.index)}"

    @property
    def web_port(self) -> int:
        return 8081 + self.index

    @property
    def broker_port(self) -> int:
        return 6651 + self.index

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    @property
    def metadata_dir(self) -> Path:
        return self.root / "data" / "metadata"

    @property
    def service_url(self) -> str:
        return f"pulsar://127.0.0.1:{self.broker_port}"

    @property
    def root(self) -> Path:
        return var_dir() / "pulsar" / self.name

    @property
    def log_dir(self) -> Path:
        return self.root / "logs"

    @property
    def broker_log(self) -> Path:
        return self.log_dir / "pulsar-standalone.log"

    @property
    def pid_file(self) -> Path:
        return self.root / "broker.pid"

    @property
    def auth_marker(self) -> Path:
        return self.root / "auth-enabled"

    @property
    def auth_enabled(self) -> bool:
        return self.auth_marker.is_file()

    def superuser_token(self) -> str | None:
        """The token the tools use on this cluster (None when it runs without authentication)."""
        if not self.auth_enabled:
            return None
        return token_file(SUPERUSER_ROLE).read_text().strip()

    def admin(self, timeout_s: float = 15.0) -> PulsarAdmin:
        return PulsarAdmin(self.admin_url, token=self.superuser_token(), timeout_s=timeout_s, retries=0,
                           name=self.name)


def local_clusters(count: int = DEFAULT_CLUSTER_COUNT) -> list[LocalCluster]:
    if not 1 <= count <= 26:
        raise LocalClusterError(f"cluster count must be 1..26, got {count}")
    return [LocalCluster(i) for i in range(count)]


# -- process bookkeeping -----------------------------------------------------------------------------

def _read_pid(cluster: LocalCluster) -> int | None:
    return read_live_pid(cluster.pid_file)


def log_tail(cluster: LocalCluster, lines: int = 40) -> str:
    return file_tail(cluster.broker_log, cluster.log_dir / "stdout.log", lines=lines)


# -- configuration -----------------------------------------------------------------------------------

def overrides_variable(cluster: LocalCluster) -> str:
    return "PM_PULSAR_CONF_" + re.sub(r"\W", "_", cluster.name).upper()


def extra_overrides(cluster: LocalCluster) -> dict[str, str]:
    """`PM_PULSAR_CONF_<NAME>` (e.g. PM_PULSAR_CONF_CLUSTER_C="key=value,key=value"): broker settings for one
    instance only, for tests of non-default broker behaviour on a throwaway cluster. A comma starts a new
    setting only before `key=`, so a value may hold commas (advertisedListeners=a:pulsar://...,b:pulsar://...)."""
    raw = os.environ.get(overrides_variable(cluster), "")
    pairs = [item.split("=", 1) for item in re.split(r",(?=\s*[A-Za-z][\w.]*=)", raw) if item.strip()]
    return {key.strip(): value.strip() for key, value in pairs}


def proxied_listener_overrides(cluster: LocalCluster, listener: str, proxy_port: int) -> str:
    """PM_PULSAR_CONF_<NAME> settings under which the broker also advertises `listener` at 127.0.0.1:`proxy_port`
    (a proxy in front of it): clients that ask for that listener in their lookups connect through the proxy."""
    return (f"advertisedAddress=,internalListenerName=internal,advertisedListeners=internal:pulsar://127.0.0.1:"
            f"{cluster.broker_port},{listener}:pulsar://127.0.0.1:{proxy_port}")


def main_pair_tls(cluster: LocalCluster) -> dict[str, str]:
    """The TLS ports of the default pair (none for the other clusters)."""
    if cluster.index >= DEFAULT_CLUSTER_COUNT:
        return {}
    return LocalTls.default().ensure().broker_settings(cluster.index)


def render_config(template: str, cluster: LocalCluster, auth: LocalAuth | None = None) -> str:
    """Sets this instance's keys in the distribution's standalone.conf (appending those it lacks)."""
    overrides = {
        **CONFIG_OVERRIDES,
        "clusterName": cluster.name,
        "brokerServicePort": str(cluster.broker_port),
        "webServicePort": str(cluster.web_port),
        **(auth.broker_overrides() if auth else {}),
        **main_pair_tls(cluster),
        **extra_overrides(cluster),
    }
    return apply_overrides(template, overrides)


def apply_overrides(text: str, overrides: dict[str, str]) -> str:
    """Sets each key of a Pulsar .conf text (appending those it lacks)."""
    for key, value in overrides.items():
        text, count = re.subn(rf"(?m)^{re.escape(key)}=.*$", f"{key}={value}", text)
        if count == 0:
            text += f"\n{key}={value}\n"
    return text


# -- lifecycle ---------------------------------------------------------------------------------------

def _launch(cluster: LocalCluster, home: Path, fresh: bool, auth: LocalAuth | None) -> int:
    for port in (cluster.web_port, cluster.broker_port,
                 *(int(v) for k, v in main_pair_tls(cluster).items() if k.endswith("PortTls"))):
        if port_in_use(port):
            raise LocalClusterError(
                f"{cluster.name}: port {port} is taken by another process; stop it or free the port"
            )
    if fresh and cluster.root.exists():
        shutil.rmtree(cluster.root)
    work = cluster.root / "work"
    for d in (work, cluster.log_dir, cluster.root / "data"):
        d.mkdir(parents=True, exist_ok=True)
    if not (cluster.metadata_dir / "CURRENT").exists():
        seed_ledger_ids(cluster, home)
    else:
        drop_stale_ephemerals(cluster, home)
    conf = cluster.root / "standalone.conf"
    conf.write_text(render_config((home / "conf" / "standalone.conf").read_text(), cluster, auth))
    if auth:
        cluster.auth_marker.write_text("token\n")
    else:
        cluster.auth_marker.unlink(missing_ok=True)
    env = {
        **os.environ,
        "PULSAR_STANDALONE_CONF": str(conf),
        "PULSAR_LOG_DIR": str(cluster.log_dir),
        "PULSAR_MEM": os.environ.get("PM_PULSAR_MEM", PULSAR_MEM),
        "PULSAR_STANDALONE_USE_ZOOKEEPER": "0",
    }
    cmd = [
        str(home / "bin" / "pulsar"), "standalone",
        "--metadata-dir", str(cluster.metadata_dir),
        "--bookkeeper-dir", str(cluster.root / "data" / "bookkeeper"),
        "--bookkeeper-port", "0",
        "--no-functions-worker", "--no-stream-storage",
    ]
    with (cluster.log_dir / "stdout.log").open("ab") as out:
        proc = subprocess.Popen(
            cmd, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: stop() can take everything down
        )
    cluster.pid_file.write_text(str(proc.pid))
    log.info("%s: started pid %d (web %d, broker %d), logs in %s",
             cluster.name, proc.pid, cluster.web_port, cluster.broker_port, cluster.log_dir)
    return proc.pid


def seed_ledger_ids(cluster: LocalCluster, home: Path) -> None:
    """Starts a new cluster's ledger ids at index x LEDGER_ID_SPACING. Ids come from the metadata store's one
    counter, so fresh clusters would all hand out 5, 6, 7, ... and the switch's guard would find the same ledger
    id on both sides of a topic (a consumer's ack of a prefetched source message would hit a target entry);
    real clusters with their own histories do not line up like that."""
    if cluster.index == 0:
        return
    subprocess.run([*java_programs.command("SeedMetadataSequence", home), str(cluster.metadata_dir),
                    str(cluster.index * LEDGER_ID_SPACING)], check=True, capture_output=True, timeout=120)


def drop_stale_ephemerals(cluster: LocalCluster, home: Path) -> None:
    """Deletes the ephemeral nodes a killed run left in the metadata store (localdev/java/DropStaleEphemerals:
    without this a SIGKILLed standalone restarted on its data can hang on its bookie's registration lock)."""
    done = subprocess.run([*java_programs.command("DropStaleEphemerals", home), str(cluster.metadata_dir)],
                          check=True, capture_output=True, text=True, timeout=120)
    log.info("%s: %s", cluster.name, done.stdout.strip() or "metadata checked")


def _wait_healthy(clusters: list[LocalCluster], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    pending = list(clusters)
    while pending:
        for cluster in list(pending):
            if cluster.admin().healthy():
                log.info("%s: healthy at %s", cluster.name, cluster.admin_url)
                pending.remove(cluster)
            elif _read_pid(cluster) is None:
                raise LocalClusterError(
                    f"{cluster.name}: broker exited during start-up; last log lines:\n{log_tail(cluster)}"
                )
        if pending and time.monotonic() > deadline:
            names = ", ".join(c.name for c in pending)
            tails = "\n".join(f"--- {c.name}\n{log_tail(c)}" for c in pending)
            raise LocalClusterError(f"{names}: not healthy after {timeout_s:.0f}s; last log lines:\n{tails}")
        if pending:
            time.sleep(1.0)


def registration(cluster: LocalCluster) -> dict[str, str]:
    """How peers register `cluster`; an authenticated one with the superuser's token *file* (all local
    clusters share one issuer), so no token is stored in any configuration store."""
    data = {"serviceUrl": cluster.admin_url, "brokerServiceUrl": cluster.service_url}
    if cluster.auth_enabled:
        data["authenticationPlugin"] = TOKEN_CLIENT_PLUGIN
        data["authenticationParameters"] = f"file://{token_file(SUPERUSER_ROLE)}"
    return data


def register_each_other(clusters: list[LocalCluster]) -> None:
    """Registers every cluster in every other one's configuration store (idempotent)."""
    for cluster in clusters:
        admin = cluster.admin(timeout_s=15.0)
        for other in clusters:
            if other == cluster:
                continue
            outcome = admin.upsert_cluster(other.name, registration(other))
            log.info("%s: cluster %s %s", cluster.name, other.name, outcome)


def start(count: int = DEFAULT_CLUSTER_COUNT, *, fresh: bool = False, timeout_s: float = START_TIMEOUT_S,
          auth: bool = False) -> list[LocalCluster]:
    """Starts the first `count` clusters not yet running, waits for health, registers them in each other."""
    return start_clusters(local_clusters(count), fresh=fresh, timeout_s=timeout_s, auth=auth)


def start_with_overrides(cluster: LocalCluster, settings: str) -> list[LocalCluster]:
    """Starts the default clusters and `cluster` with `settings` ("key=value,...", see extra_overrides) for
    `cluster` alone; the environment is as before afterwards."""
    variable = overrides_variable(cluster)
    before = os.environ.get(variable)
    os.environ[variable] = settings
    try:
        return start_clusters([*local_clusters(min(cluster.index, DEFAULT_CLUSTER_COUNT)), cluster])
    finally:
        if before is None:
            del os.environ[variable]
        else:
            os.environ[variable] = before


def start_clusters(clusters: list[LocalCluster], *, fresh: bool = False, timeout_s: float = START_TIMEOUT_S,
                   auth: bool = False) -> list[LocalCluster]:
    """Starts those of `clusters` not yet running (with token authentication when `auth`), waits for health,
    registers them in each other. A cluster running in the other mode is an error, not silently reused."""
    home = None
    local_auth = None
    launched: list[LocalCluster] = []
    for cluster in clusters:
        running = _read_pid(cluster) is not None
        if running and cluster.auth_enabled != auth:
            mode = "with" if cluster.auth_enabled else "without"
            raise LocalClusterError(f"{cluster.name} is running {mode} authentication; stop it first "
                                    f"(make clusters-down) to start it {'with' if auth else 'without'}")
        if auth and local_auth is None:
            home = home or ensure_distribution()
            local_auth = LocalAuth.default(home).ensure()
        if cluster.admin().healthy():
            log.info("%s: already running at %s", cluster.name, cluster.admin_url)
            continue
        if _read_pid(cluster) is not None:
            log.info("%s: already starting (pid %s)", cluster.name, _read_pid(cluster))
            launched.append(cluster)
            continue
        home = home or ensure_distribution()
        _launch(cluster, home, fresh, local_auth)
        launched.append(cluster)
    try:
        _wait_healthy(launched, timeout_s)
    except LocalClusterError:
        stop_clusters(launched)
        raise
    register_each_other(clusters)
    return clusters


def kill_clusters(clusters: Iterable[LocalCluster], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGKILLs each cluster's whole process group at once (a crash: no clean shutdown of broker or bookie)."""
    for cluster in clusters:
        pid = _read_pid(cluster)
        if pid is not None:
            signal_group(pid, signal.SIGKILL)
            deadline = time.monotonic() + timeout_s
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
        cluster.pid_file.unlink(missing_ok=True)
        log.info("%s: killed", cluster.name)


def stop_clusters(clusters: Iterable[LocalCluster], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Stops each cluster's whole process group: TERM, then KILL after the timeout."""
    for cluster in clusters:
        stop_group(cluster.pid_file, cluster.name, timeout_s)


def stop_group(pid_file: Path, name: str, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Stops the process group whose leader `pid_file` names: TERM, then KILL after the timeout."""
    pid = read_live_pid(pid_file)
    if pid is None:
        log.info("%s: not running", name)
        pid_file.unlink(missing_ok=True)
        return
    signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    if alive(pid):
        log.warning("%s: pid %d ignored SIGTERM for %.0fs; killing", name, pid, timeout_s)
    signal_group(pid, signal.SIGKILL)  # also reaps anything the broker left in its group
    pid_file.unlink(missing_ok=True)
    log.info("%s: stopped", name)


def stop(count: int = DEFAULT_CLUSTER_COUNT) -> None:
    stop_clusters(local_clusters(count))


def status(count: int = DEFAULT_CLUSTER_COUNT) -> dict[str, str]:
    result = {}
    for cluster in local_clusters(count):
        if cluster.admin().healthy():
            result[cluster.name] = f"healthy at {cluster.admin_url} (pid {_read_pid(cluster)})"
        elif _read_pid(cluster) is not None:
            result[cluster.name] = f"process {_read_pid(cluster)} running, not healthy"
        else:
            result[cluster.name] = "stopped"
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localdev.pulsar_local", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["fetch", "start", "stop", "status", "logs"])
    parser.add_argument("name", nargs="?", help="cluster name for `logs`")
    parser.add_argument("--clusters", type=int, default=int(os.environ.get("PM_CLUSTERS", DEFAULT_CLUSTER_COUNT)))
    parser.add_argument("--fresh", action="store_true", help="wipe the clusters' data before starting")
    parser.add_argument("--auth", action="store_true", default=os.environ.get("PM_AUTH", "") not in ("", "0"),
                        help="token authentication and authorization on (keys and tokens in var/auth/)")
    parser.add_argument("--timeout", type=float, default=START_TIMEOUT_S)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        if args.command == "fetch":
            ensure_distribution()
        elif args.command == "start":
            started = time.monotonic()
            start(args.clusters, fresh=args.fresh, timeout_s=args.timeout, auth=args.auth)
            log.info("clusters healthy and registered in %.1fs", time.monotonic() - started)
        elif args.command == "stop":
            stop(args.clusters)
        elif args.command == "status":
            for name, state in status(args.clusters).items():
                sys.stdout.write(f"{name}: {state}\n")
        elif args.command == "logs":
            by_name = {c.name: c for c in local_clusters(args.clusters)}
            if args.name not in by_name:
                raise LocalClusterError(f"unknown cluster {args.name!r}; known: {', '.join(by_name)}")
            sys.stdout.write(log_tail(by_name[args.name], 200) + "\n")
    except (LocalClusterError, DistributionError, AuthSetupError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
