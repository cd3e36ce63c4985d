"""What DAG files share: Pulsar clusters from Airflow connections, the library as a --py-files zip,
run-dir paths. Used as template macros, so it runs in the worker when a task renders its fields.

A Pulsar cluster connection (see airflow_settings.yaml): host/port/schema give the admin URL (schema is
the URL scheme), the password holds the cluster's token when it is secured, and extra holds
`cluster_name`, `service_url` and `tls` (the spec's TLS object). Tokens never enter arguments, specs
or XComs: a task gets them as environment variables named by `token_env_name`, rendered from
`conn.<id>.password` in `env_vars`, and the spec carries only those names.

No Airflow import here: connections are duck-typed (conn_id, host, port, schema, password, extra_dejson).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import zipfile
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Any

TOKEN_ENV_PREFIX = "PULSAR_TOKEN_"
PACKAGE_DIR = Path(__file__).resolve().parent


def token_env_name(conn_id: str) -> str:
    """The environment variable that carries a connection's token into a task (`PULSAR_TOKEN_<ID>`)."""
    return TOKEN_ENV_PREFIX + re.sub(r"[^A-Za-z0-9_]", "_", conn_id).upper()


def token_env_vars(conn_ids: Iterable[str]) -> dict[str, str]:
    """`env_vars` templates for SparkSubmitOperator: each token variable renders the connection's password.

    Rendered in the worker; an empty value means no token (the local clusters are open).
    """
    return {token_env_name(c): "{{ conn[" + json.dumps(c) + "].password or '' }}" for c in conn_ids}


def cluster_from_connection(conn: Any) -> tuple[str, dict[str, Any]]:
    """`(cluster name, spec cluster entry)` from an Airflow connection; ValueError names what is missing."""
    extra = conn.extra_dejson or {}
    if not conn.host:
        raise ValueError(f"connection {conn.conn_id}: host (the admin API host) is empty")
    if not extra.get("service_url"):
        raise ValueError(f"connection {conn.conn_id}: extra.service_url (pulsar://host:port) is missing")
    admin_url = f"{conn.schema or 'http'}://{conn.host}" + (f":{conn.port}" if conn.port else "")
    return str(extra.get("cluster_name") or conn.conn_id), {
        "admin_url": admin_url,
        "service_url": extra["service_url"],
        # Named only when the connection holds a token, so an open cluster needs no variable at all.
        "token_env": token_env_name(conn.conn_id) if conn.password else None,
        "tls": extra.get("tls"),
    }


def clusters_json(conns: Iterable[Any]) -> str:
    """The spec's `clusters` mapping (name -> entry) as JSON, from connections; no tokens inside."""
    clusters: dict[str, dict[str, Any]] = {}
    for conn in conns:
        name, entry = cluster_from_connection(conn)
        if name in clusters:
            raise ValueError(f"connection {conn.conn_id}: cluster name {name!r} is used by another connection")
        clusters[name] = entry
    return json.dumps(clusters, sort_keys=True)


def library_zip(dest_dir: str | Path | None = None) -> str:
    """Zips the pulsar_migration package for `--py-files`; returns the path.

    Named by a hash of the sources, so concurrent and repeated tasks reuse one file and a changed
    library gets a new one. Built where the task runs (spark-submit uploads it to a real cluster).
    """
    dest = Path(dest_dir) if dest_dir else Path(tempfile.gettempdir()) / "pulsar-migration-lib"
    files = sorted(p for p in PACKAGE_DIR.rglob("*.py") if "__pycache__" not in p.parts)
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(PACKAGE_DIR).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    target = dest / f"pulsar_migration-{digest.hexdigest()[:16]}.zip"
    if target.is_file():
        return str(target)
    dest.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest, prefix=".pulsar_migration-", suffix=".zip.tmp")
    try:
        with os.fdopen(fd, "wb") as raw, zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as zf:
            for path in files:
                zf.write(path, f"{PACKAGE_DIR.name}/{path.relative_to(PACKAGE_DIR).as_posix()}")
        os.replace(tmp, target)  # readers see a whole zip or none
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return str(target)


def run_dir(base: str, *parts: str, root: str | Path | None = None) -> str:
    """`base/part/...` with each part made path-safe; a relative local base is taken under `root`."""
    safe = [re.sub(r"[^A-Za-z0-9_.=-]+", "_", p).strip("_") or "_" for p in parts]
    if "://" not in base and root is not None and not os.path.isabs(base):
        base = str(Path(root) / base)
    return "/".join([base.rstrip("/"), *safe])


def macros(project_root: str | Path) -> dict[str, Any]:
    """`user_defined_macros` for the project's DAGs."""
    return {
        "pulsar_clusters_json": clusters_json,
        "pulsar_library_zip": library_zip,
        "pulsar_run_dir": partial(run_dir, root=project_root),
    }
