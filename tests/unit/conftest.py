"""Unit-test fixtures: the example spec of DESIGN.md section 2, as a dict and as a file."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

DESIGN_EXAMPLE: dict[str, Any] = {
    "tenant": "acme",
    "source": "cluster-a",
    "target": "cluster-b",
    "clusters": {
        "cluster-a": {"admin_url": "http://127.0.0.1:8081", "service_url": "pulsar://127.0.0.1:6651",
                      "token_env": None, "tls": None},
        "cluster-b": {"admin_url": "http://127.0.0.1:8082", "service_url": "pulsar://127.0.0.1:6652",
                      "token_env": "CLUSTER_B_TOKEN", "tls": None},
    },
    "namespaces": None,
    "topics": {"include": [".*"], "exclude": []},
    "replication": {"mode": "copy"},
    "lookup": {"url": None, "token_env": None},
    "options": {"proceed_on_conflict": False},
}


@pytest.fixture
def spec_dict() -> dict[str, Any]:
    """A fresh copy of the DESIGN.md example (tests may mutate it)."""
    return copy.deepcopy(DESIGN_EXAMPLE)


@pytest.fixture
def write_spec(tmp_path: Path):
    """Writes a spec dict to a file and returns its path."""

    def write(data: dict[str, Any], name: str = "spec.json") -> str:
        path = tmp_path / name
        path.write_text(json.dumps(data), encoding="utf-8")
        return str(path)

    return write
