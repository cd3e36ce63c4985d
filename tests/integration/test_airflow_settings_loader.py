"""The airflow_settings.yaml loader against a real, migrated Airflow metadata DB in a temp AIRFLOW_HOME.

The loader runs as its CLI in a subprocess (Airflow binds to one AIRFLOW_HOME per process) and the
result is read back with Airflow's own `export` commands, so the check does not trust the loader.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from localdev.airflow_local import airflow_env, migrated_db
from localdev.airflow_settings import DEFAULT_FILE

OUTCOME = re.compile(r"\b(connection|pool|variable):(\S+) (created|updated|unchanged)\b")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A migrated home the module's tests share (a migrate is half a minute); each apply test applies the project
    file first."""
    env = airflow_env(tmp_path_factory.mktemp("airflow"))
    migrated_db(env)
    return env


def apply(env: dict[str, str], file: Path = DEFAULT_FILE) -> dict[str, str]:
    proc = subprocess.run([sys.executable, "-m", "localdev.airflow_settings", "apply", "--file", str(file)],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return {f"{kind}:{name}": result for kind, name, result in OUTCOME.findall(proc.stdout + proc.stderr)}


# `airflow <kind> export <file>` for each pair of arguments: the entry point the `airflow` script calls, run once per
# export in one interpreter (each `airflow` process is a whole Airflow start-up of several CPU seconds).
EXPORT = textwrap.dedent("""\
    import sys
    from airflow.__main__ import main
    for kind, path in zip(sys.argv[1::2], sys.argv[2::2]):
        sys.argv = ["airflow", kind, "export", path]
        main()
    """)


def exported(env: dict[str, str], tmp_path: Path,
             kinds: Sequence[str] = ("connections", "pools", "variables")) -> dict[str, Any]:
    """What Airflow's own export commands read from the DB."""
    files = {kind: tmp_path / f"{kind}.json" for kind in kinds}
    proc = subprocess.run([sys.executable, "-c", EXPORT, *(a for kind in kinds for a in (kind, str(files[kind])))],
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {kind: json.loads(file.read_text()) for kind, file in files.items()}


def test_applies_the_project_file_and_is_idempotent(env: dict[str, str], tmp_path: Path) -> None:
    first = apply(env)  # the module's first test: a fresh home
    assert first == {
        "connection:spark_default": "created",
        "connection:pulsar_cluster_a": "created",
        "connection:pulsar_cluster_b": "created",
        "connection:pulsar_lookup": "created",
        "pool:pulsar_admin": "created",
        "variable:pulsar_migration_run_dir_base": "created",
    }
    state = exported(env, tmp_path)
    conns = state["connections"]
    assert conns["spark_default"]["conn_type"] == "spark"
    assert conns["spark_default"]["host"] == "local[*]"
    assert conns["spark_default"]["port"] is None
    for conn_id, port, name, broker_port in (("pulsar_cluster_a", 8081, "cluster-a", 6651),
                                             ("pulsar_cluster_b", 8082, "cluster-b", 6652)):
        conn = conns[conn_id]
        assert (conn["conn_type"], conn["host"], conn["port"], conn["schema"]) == ("pulsar", "127.0.0.1", port, "http")
        assert conn["password"] is None and conn["login"] is None
        assert json.loads(conn["extra"]) == {"cluster_name": name, "service_url": f"pulsar://127.0.0.1:{broker_port}",
                                             "tls": None}
    lookup = conns["pulsar_lookup"]
    assert (lookup["host"], lookup["port"], lookup["schema"], lookup["password"]) == ("127.0.0.1", 8090, "http", None)
    assert state["pools"]["pulsar_admin"]["slots"] == 2
    assert state["pools"]["pulsar_admin"]["description"] == "Tasks that call Pulsar admin APIs"
    assert state["variables"]["pulsar_migration_run_dir_base"] == "var/runs"

    second = apply(env)
    assert set(second) == set(first) and set(second.values()) == {"unchanged"}
    assert exported(env, tmp_path) == state


def test_updates_existing_entries_from_another_file(env: dict[str, str], tmp_path: Path) -> None:
    apply(env)
    changed = tmp_path / "changed.yaml"
    changed.write_text(textwrap.dedent("""\
        airflow:
          connections:
            - conn_id: pulsar_cluster_b
              conn_type: pulsar
              conn_host: broker-b.example
              conn_schema: https
              conn_login:
              conn_password: s3cr3t-token
              conn_port: 8443
              conn_extra: '{"cluster_name": "cluster-b", "service_url": "pulsar+ssl://broker-b.example:6651",
                            "tls": {"trust_certs_file": "/etc/ca.pem"}}'
            - conn_id: pulsar_cluster_c
              conn_type: pulsar
              conn_host: 127.0.0.1
              conn_port: 8083
              conn_schema: http
              conn_extra:
                cluster_name: cluster-c
                service_url: pulsar://127.0.0.1:6653
          pools:
            - pool_name: pulsar_admin
              pool_slot: 5
              pool_description: more slots
          variables:
            - variable_name: pulsar_migration_run_dir_base
              variable_value: /data/runs
            - variable_name: pulsar_migration_limits
              variable_value: {"max_topics": 100}
        """))
    assert apply(env, changed) == {
        "connection:pulsar_cluster_b": "updated",
        "connection:pulsar_cluster_c": "created",
        "pool:pulsar_admin": "updated",
        "variable:pulsar_migration_run_dir_base": "updated",
        "variable:pulsar_migration_limits": "created",
    }
    state = exported(env, tmp_path)
    b = state["connections"]["pulsar_cluster_b"]
    assert (b["host"], b["port"], b["schema"], b["password"]) == ("broker-b.example", 8443, "https", "s3cr3t-token")
    assert json.loads(b["extra"])["tls"] == {"trust_certs_file": "/etc/ca.pem"}
    assert json.loads(state["connections"]["pulsar_cluster_c"]["extra"])["cluster_name"] == "cluster-c"
    assert state["connections"]["pulsar_cluster_a"]["port"] == 8081  # not in the file: untouched
    assert (state["pools"]["pulsar_admin"]["slots"], state["pools"]["pulsar_admin"]["description"]) == (5, "more slots")
    assert state["variables"]["pulsar_migration_run_dir_base"] == "/data/runs"
    assert state["variables"]["pulsar_migration_limits"] == {"max_topics": 100}  # stored as JSON

    # Back to the project file: the token and the changed fields are reset, the extra entries stay.
    back = apply(env)
    assert back["connection:pulsar_cluster_b"] == "updated" and back["connection:pulsar_cluster_a"] == "unchanged"
    b = exported(env, tmp_path, ["connections"])["connections"]["pulsar_cluster_b"]
    assert (b["host"], b["port"], b["schema"], b["password"]) == ("127.0.0.1", 8082, "http", None)


@pytest.mark.parametrize(("body", "message"), [
    ("airflow: [oops", "invalid YAML at line 1"),
    ("airflw:\n  connections: []\n", "top level must be exactly one key `airflow`"),
    ("airflow:\n  conections: []\n", "unknown section(s) under `airflow`: conections"),
    ("airflow:\n  connections:\n    - conn_id: x\n      conn_host: h\n",
     "connections[0] (x): conn_type is required"),
    ("airflow:\n  connections:\n    - conn_id: x\n      conn_type: http\n      conn_port: eighty\n",
     "connections[0] (x): conn_port must be an integer 1-65535, got 'eighty'"),
    ("airflow:\n  connections:\n    - conn_id: x\n      conn_type: http\n      conn_hots: h\n",
     "connections[0] (x): unknown key(s) conn_hots"),
    ("airflow:\n  connections:\n    - conn_id: x\n      conn_type: http\n      conn_extra: '{bad'\n",
     "connections[0] (x): conn_extra is not valid JSON"),
    ("airflow:\n  connections:\n    - {conn_id: x, conn_type: http}\n    - {conn_id: x, conn_type: http}\n",
     "connections[1]: duplicate conn_id 'x'"),
    ("airflow:\n  connections:\n    - conn_id: 'bad id'\n      conn_type: http\n", "connections[0]: conn_id must be"),
    ("airflow:\n  pools:\n    - pool_name: p\n      pool_slot: -5\n", "pools[0] (p): pool_slot must be an integer"),
    ("airflow:\n  variables:\n    - variable_name: v\n", "variables[0] (v): variable_value is required"),
])
def test_malformed_file_fails_with_one_clear_line(env: dict[str, str], tmp_path: Path, body: str,
                                                  message: str) -> None:
    # The module's last tests: a file refused before anything is applied leaves the shared home as it is.
    bad = tmp_path / "bad.yaml"
    bad.write_text(body)
    proc = subprocess.run([sys.executable, "-m", "localdev.airflow_settings", "apply", "--file", str(bad)],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: {bad}: ")
    assert message in lines[0]
