"""Process bookkeeping shared by the local launchers (Pulsar brokers, Airflow standalone)."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path


def alive(pid: int) -> bool:
    """True while `pid` runs; a zombie (exited, not yet reaped: PID 1 here does not reap) is not running."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return True


def read_live_pid(pid_file: Path) -> int | None:
    """The pid recorded in `pid_file`, if that process still runs."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if alive(pid) else None


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex((host, port)) == 0


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Signals the process group led by `pid` (launchers start each service in its own session)."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def signal_process(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def file_tail(*candidates: Path, lines: int = 40) -> str:
    """The last `lines` lines of the first non-empty file among `candidates` (for start-up failures)."""
    for path in candidates:
        if path.is_file() and path.stat().st_size:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return f"(no log at {candidates[0]})"
