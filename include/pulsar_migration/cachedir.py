"""The user cache the project keeps across clones and runs (the Pulsar download, the compiled copy engine)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """PM_CACHE_DIR, else pulsar-migration/ under XDG_CACHE_HOME (default ~/.cache)."""
    base = os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))
    return Path(os.environ.get("PM_CACHE_DIR", Path(base) / "pulsar-migration"))
