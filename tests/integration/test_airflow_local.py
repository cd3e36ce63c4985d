"""`python -m localdev.airflow_local` lifecycle on a throw-away var dir and its own ports.

Runs beside a developer's `make airflow` (8080): another port, another home, and `stop` only ends
processes carrying this home's marker.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from localdev.airflow_local import MARKER_ENV

pytestmark = pytest.mark.slow


def free_port_block() -> int:
    """A port p with p, p+1, p+2 free (API server and the two log servers)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 2 < 65536 and all(_free(p) for p in (port, port + 1, port + 2)):
            return port
    raise RuntimeError("no free block of three ports")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def marked(home: Path) -> list[int]:
    needle = f"{MARKER_ENV}={home.resolve()}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
                state = (entry / "stat").read_text().split(") ", 1)[1][0]
            except (OSError, IndexError):
                continue
            if needle in environ and state != "Z":
                pids.append(int(entry.name))
    return pids


def test_start_is_idempotent_and_stop_leaves_nothing(tmp_path: Path) -> None:
    port = free_port_block()
    env = {**os.environ, "PM_VAR_DIR": str(tmp_path / "var"), "PM_AIRFLOW_PORT": str(port),
           "PM_AIRFLOW_ADMIN_PASSWORD": "test-admin-pw"}
    home = tmp_path / "var" / "airflow"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "localdev.airflow_local", *args], env=env,
                              capture_output=True, text=True, timeout=400, check=False)

    try:
        first = cli("start")
        assert first.returncode == 0, first.stderr[-3000:]
        assert "user: admin  password: test-admin-pw" in first.stdout
        assert "healthy at" in cli("status").stdout

        # The fixed credentials work; a wrong password does not.
        url = f"http://127.0.0.1:{port}/auth/token"
        assert requests.post(url, json={"username": "admin", "password": "test-admin-pw"}, timeout=10).ok
        assert requests.post(url, json={"username": "admin", "password": "nope"}, timeout=10).status_code == 401
        # The settings file was applied before start-up.
        token = requests.post(url, json={"username": "admin", "password": "test-admin-pw"}, timeout=10).json()
        conn = requests.get(f"http://127.0.0.1:{port}/api/v2/connections/spark_default", timeout=10,
                            headers={"Authorization": f"Bearer {token['access_token']}"})
        assert conn.ok and conn.json()["host"] == "local[*]"

        again = cli("start")
        assert again.returncode == 0 and "password" not in again.stdout  # credentials shown once
        assert "already running" in again.stderr
        assert marked(home)
    finally:
        stopped = cli("stop")
    assert stopped.returncode == 0, stopped.stderr
    assert marked(home) == []
    assert not _listening(port)
    assert "stopped" in cli("status").stdout
