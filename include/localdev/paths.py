"""Where the local environment keeps its files (all outside git: var/ and the user cache)."""

from __future__ import annotations

import os
from pathlib import Path

from pulsar_migration.cachedir import cache_dir as user_cache_dir

PROJECT_ROOT = Path(os.environ.get("PM_PROJECT_ROOT", Path(__file__).resolve().parents[2]))


def var_dir() -> Path:
    """Runtime state (cluster data, logs, Airflow home); git-ignored."""
    return Path(os.environ.get("PM_VAR_DIR", PROJECT_ROOT / "var"))


def cache_dir() -> Path:
    """Downloads kept across clones and runs (the library's user cache)."""
    return user_cache_dir()
