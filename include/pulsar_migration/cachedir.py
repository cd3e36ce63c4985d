"""The user cache the project keeps across clones and runs (the Pulsar download, the compiled copy engine)."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path


def cache_dir() -> Path:
    """PM_CACHE_DIR, else pulsar-migration/ under XDG_CACHE_HOME (default ~/.cache)."""
    base = os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))
    return Path(os.environ.get("PM_CACHE_DIR", Path(base) / "pulsar-migration"))


def build_once(target: Path, ready: Path, build: Callable[[], None]) -> bool:
    """Runs `build` unless `ready` exists, under a lock file beside `target` (`<target>.lock`), so that parallel
    processes build the same thing once and the others wait for it. True when this call built it."""
    if ready.exists():
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready.exists():
            return False
        build()
        return True
