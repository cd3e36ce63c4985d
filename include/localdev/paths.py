"""Where the local environment keeps its files (all outside git: var/ and the user cache)."""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(os.environ.get("PM_PROJECT_ROOT", Path(__file__).resolve().parents[2]))


def var_dir() -> Path:
    """Runtime state (cluster data, logs, Airflow home); git-ignored."""
    return Path(os.environ.get("PM_VAR_DIR", PROJECT_ROOT / "var"))


def cache_dir() -> Path:
    """Downloads kept across clones and runs."""
    base = os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))
    return Path(os.environ.get("PM_CACHE_DIR", Path(base) / "pulsar-migration"))
