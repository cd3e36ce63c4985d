"""Runs the lookup service for the local cluster pair (part of `make demo`).

    python -m localdev.lookup_local start | stop | status

Its home is var/lookup/: `lookup.json` (both local clusters, default cluster-a, SQLite routes in
`routes.db`), `admin_token` (generated once, mode 600: the admin API's token, given to the service only
through its environment), `service.pid` and `service.log`. It listens on http://127.0.0.1:8090
(PM_LOOKUP_PORT overrides).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

from localdev.paths import var_dir
from localdev.processes import file_tail, read_live_pid, signal_process
from localdev.pulsar_local import local_clusters

log = logging.getLogger(__name__)

DEFAULT_PORT = 8090
START_TIMEOUT_S = 30.0


class LookupLocalError(RuntimeError):
    """The local lookup service could not be started or stopped (one line)."""


def home() -> Path:
    return var_dir() / "lookup"


def port() -> int:
    return int(os.environ.get("PM_LOOKUP_PORT", DEFAULT_PORT))


def url() -> str:
    return f"http://127.0.0.1:{port()}"


def admin_token() -> str:
    """The local service's admin token, created on first use (readable by this user only)."""
    path = home() / "admin_token"
    if not path.exists():
        home().mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(32))
        path.chmod(0o600)
    return path.read_text().strip()


def write_config() -> Path:
    clusters = local_clusters(2)
    config = home() / "lookup.json"
    home().mkdir(parents=True, exist_ok=True)
    config.write_text(json.dumps({
        "clusters": {c.name: {"http_url": c.admin_url, "token_env": None} for c in clusters},
        "default_cluster": clusters[0].name, "database_url": f"sqlite:///{home() / 'routes.db'}",
        "admin_token_env": "PM_LOOKUP_ADMIN_TOKEN", "hold_timeout_s": 20, "host": "127.0.0.1", "port": port(),
    }, indent=2))
    return config


def healthy() -> bool:
    try:
        return requests.get(f"{url()}/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def start() -> str:
    """Starts the service unless it runs; returns its URL."""
    pid_file = home() / "service.pid"
    if read_live_pid(pid_file) is not None and healthy():
        log.info("lookup service: already running at %s", url())
        return url()
    config = write_config()
    log_file = home() / "service.log"
    with log_file.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "pulsar_migration.lookup", "--config", str(config)],
                                env={**os.environ, "PM_LOOKUP_ADMIN_TOKEN": admin_token()}, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    pid_file.write_text(str(proc.pid))
    deadline = time.monotonic() + START_TIMEOUT_S
    while not healthy():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise LookupLocalError(f"the lookup service did not start; log: {file_tail(log_file, lines=5)}")
        time.sleep(0.2)
    log.info("lookup service: started (pid %d) at %s, log %s", proc.pid, url(), log_file)
    return url()


def stop() -> None:
    pid = read_live_pid(home() / "service.pid")
    if pid is None:
        return
    signal_process(pid, signal.SIGTERM)  # graceful: parked requests are answered
    deadline = time.monotonic() + 15
    while read_live_pid(home() / "service.pid") is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    log.info("lookup service: stopped")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localdev.lookup_local", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["start", "stop", "status"])
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        if args.command == "start":
            start()
        elif args.command == "stop":
            stop()
        else:
            sys.stdout.write(f"lookup service at {url()}: {'healthy' if healthy() else 'not running'}\n")
    except LookupLocalError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
