"""What the tests that start their own Airflow standalone share: free ports, the processes of one home."""

from __future__ import annotations

import socket
from pathlib import Path

from localdev.airflow_local import MARKER_ENV


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


def listening(port: int) -> bool:
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
