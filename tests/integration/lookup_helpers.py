"""The lookup service as a real process for tests: start, stop (SIGTERM), admin API calls."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from localdev.pulsar_local import LocalCluster
from localdev.pulsar_tls import LocalTls

TOKEN = "lookup-test-admin-token"
HOLD_TIMEOUT_S = 8.0  # short, so the lookup service's test of the bound is quick
# The live tests' holds: a cutover's hold of about 2 s can take several times that on a loaded host, and a parked
# lookup answered 503 sends a client into its reconnect backoff.
LIVE_HOLD_TIMEOUT_S = 20.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LookupProcess:
    def __init__(self, config: Path, port: int, ca_cert: Path | None = None) -> None:
        """`ca_cert`: the service answers over HTTPS with a certificate this authority signed."""
        self.config, self.port = config, port
        self.url = f"{'https' if ca_cert else 'http'}://127.0.0.1:{port}"
        self.verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=str(ca_cert)) if ca_cert else True
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "pulsar_migration.lookup", "--config", str(self.config)],
                                     env={**os.environ, "PM_LOOKUP_ADMIN_TOKEN": TOKEN}, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/health", timeout=1, verify=self.verify).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise RuntimeError(f"lookup service did not start: {self.stop()}")

    def stop(self) -> str:
        """SIGTERM (graceful); returns its output."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=30)
        return out

    def api(self, method: str, path: str, token: str | None = TOKEN, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.request(method, f"{self.url}/api/v1{path}", headers=headers, timeout=30, verify=self.verify,
                             **kwargs)


def start_service(tmp: Path, clusters: list[LocalCluster], default: LocalCluster,
                  hold_timeout_s: float = LIVE_HOLD_TIMEOUT_S, tls: LocalTls | None = None) -> LookupProcess:
    """The service routing to `clusters`; with `tls`, it answers over HTTPS and forwards to the clusters' TLS ports
    with the client certificate (the default pair serves TLS beside its plain ports)."""
    config = tmp / "lookup.json"
    port = free_port()
    entries: dict[str, Any] = {c.name: {"http_url": c.admin_url} for c in clusters}
    if tls:
        for c in clusters:
            tls_entry = tls.spec_entry(c.index)
            entries[c.name] = {"http_url": tls_entry["admin_url"], "tls": tls_entry["tls"]}
    config.write_text(json.dumps({
        "clusters": entries, "default_cluster": default.name, "database_url": f"sqlite:///{tmp / 'routes.db'}",
        "hold_timeout_s": hold_timeout_s, "port": port,
        **({"tls": {"cert_file": str(tls.broker_cert), "key_file": str(tls.broker_key)}} if tls else {}),
    }))
    process = LookupProcess(config, port, ca_cert=tls.ca_cert if tls else None)
    process.start()
    return process
