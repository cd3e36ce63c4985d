"""What DAG files share: Pulsar clusters from Airflow connections, the library as a --py-files zip,
run-dir paths. Used as template macros, so it runs in the worker when a task renders its fields.

A Pulsar cluster connection (see airflow_settings.yaml): host/port/schema give the admin URL (schema is
the URL scheme), the password holds the cluster's token when it is secured, and extra holds
`cluster_name`, `service_url` and `tls` (the spec's TLS object). Tokens never enter arguments, specs
or XComs: a task gets them as environment variables named by `token_env_name`, rendered from
`conn.<id>.password` in `env_vars`, and the spec carries only those names.

The migration DAG's pure half lives here too: trigger params -> validated spec document
(`spec_document`), the spec file in the run dir, and the check of a step's report (`step_outcome`).
Its Airflow half (tasks, the step operator) is `pulsar_migration.dag_tasks`.

No Airflow import here: connections are duck-typed (conn_id, host, port, schema, password, extra_dejson).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import re
import tempfile
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pulsar_migration import rundir, tokens
from pulsar_migration.bytecode import write_module
from pulsar_migration.report import StepReport
from pulsar_migration.spec import ClusterSpec, MigrationSpec, SpecError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TOKEN_ENV_PREFIX = "PULSAR_TOKEN_"
PACKAGE_DIR = Path(__file__).resolve().parent
RUN_DIR_BASE_VARIABLE = "pulsar_migration_run_dir_base"
DEFAULT_RUN_DIR_BASE = "var/runs"
SPEC_FILE = "spec.json"
# Connection ids are pasted into `conn[...]` templates (token_env_vars): no quotes, braces or spaces.
CONN_ID_PATTERN = r"^[A-Za-z0-9_.:-]+$"

# Trigger param -> its place in the spec document. A later step's param is one more line here.
PARAM_TO_SPEC: dict[str, tuple[str, ...]] = {
    "tenant": ("tenant",),
    "namespaces": ("namespaces",),
    "topics_include": ("topics", "include"),
    "topics_exclude": ("topics", "exclude"),
    "proceed_on_conflict": ("options", "proceed_on_conflict"),
    "replication_mode": ("replication", "mode"),
    "backfill_sink": ("options", "backfill_sink"),
    "archive_path": ("options", "archive_path"),
    "copy_max_mb_per_s": ("options", "copy_max_mb_per_s"),
    "copy_max_msgs_per_s": ("options", "copy_max_msgs_per_s"),
}
# Spec options holding locations: a relative local one is taken under the project root, like the run dir base.
PATH_OPTIONS = ("archive_path", "backfill_state_dir", "follows_run_dir")
CONFLICTS_IN_SUMMARY = 20


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
    entry = {
        "admin_url": admin_url,
        "service_url": extra["service_url"],
        # Named only when the connection holds a token, so an open cluster needs no variable at all.
        "token_env": token_env_name(conn.conn_id) if conn.password else None,
        "tls": extra.get("tls"),
    }
    if extra.get("listener_name"):
        entry["listener_name"] = extra["listener_name"]
    entry.update({key: extra[key] for key in ("token_file", "oauth2") if extra.get(key)})
    if len(tokens.credentials_given(entry)) > 1:
        raise ValueError(f"connection {conn.conn_id}: holds more than one of a token (password), "
                         "extra.token_file and extra.oauth2; give one")
    return str(extra.get("cluster_name") or conn.conn_id), entry


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

    Compiled bytecode rides along (pulsar_migration.bytecode). Named by a hash of the sources, so concurrent
    and repeated tasks reuse one file and a changed library gets a new one. Built where the task runs
    (spark-submit uploads it to a real cluster).
    """
    dest = Path(dest_dir) if dest_dir else Path(tempfile.gettempdir()) / "pulsar-migration-lib"
    # The copy engine's Java source and log configuration ride along: the engine is built from them wherever the
    # library runs (without them no copy under spark-submit ever took the engine).
    files = sorted(p for pattern in ("*.py", "java/*") for p in PACKAGE_DIR.rglob(pattern)
                   if "__pycache__" not in p.parts and p.is_file())
    digest = hashlib.sha256(importlib.util.MAGIC_NUMBER)  # the bytecode inside is for this Python
    for path in files:
        digest.update(path.relative_to(PACKAGE_DIR).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    target = dest / f"pulsar_migration-{digest.hexdigest()[:16]}.zip"
    if target.is_file():
        return str(target)
    dest.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest, prefix=".pulsar_migration-", suffix=".zip.tmp")
    try:
        with os.fdopen(fd, "wb") as raw, zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as zf:
            for path in files:  # with bytecode: no driver or Python worker compiles the library again
                arcname = f"{PACKAGE_DIR.name}/{path.relative_to(PACKAGE_DIR).as_posix()}"
                if path.suffix == ".py":
                    write_module(zf, arcname, path.read_bytes())
                else:
                    zf.writestr(arcname, path.read_bytes())
        os.replace(tmp, target)  # readers see a whole zip or none
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return str(target)


def anchored(location: str, root: str | Path | None) -> str:
    """A relative local path taken under `root`; absolute paths and URIs (`s3a://...`) as they are."""
    if "://" not in location and root is not None and not os.path.isabs(location):
        return str(Path(root) / location)
    return location


def run_dir(base: str, *parts: str, root: str | Path | None = None) -> str:
    """`base/part/...` with each part made path-safe; a relative local base is taken under `root`."""
    safe = [re.sub(r"[^A-Za-z0-9_.=-]+", "_", p).strip("_") or "_" for p in parts]
    return "/".join([anchored(base, root).rstrip("/"), *safe])


def macros(project_root: str | Path) -> dict[str, Any]:
    """`user_defined_macros` for the project's DAGs."""
    return {
        "pulsar_clusters_json": clusters_json,
        "pulsar_library_zip": library_zip,
        "pulsar_run_dir": partial(run_dir, root=project_root),
    }


# -- the migration DAG: params -> spec, report -> verdict ------------------------------------------


def lookup_from_connection(conn: Any) -> dict[str, Any]:
    """The spec's `lookup` entry from the lookup service's connection: host/port/schema give its URL, the
    password (if any) is its admin token, passed as the variable `token_env_name(conn_id)`; an https service
    signed by a private authority names it in the extra's `trust_certs_file`."""
    if not conn.host:
        raise ValueError(f"connection {conn.conn_id}: host (the lookup service's host) is empty")
    url = f"{conn.schema or 'http'}://{conn.host}" + (f":{conn.port}" if conn.port else "")
    entry = {"url": url, "token_env": token_env_name(conn.conn_id) if conn.password else None}
    trust = (getattr(conn, "extra_dejson", None) or {}).get("trust_certs_file")
    return {**entry, "trust_certs_file": trust} if trust else entry


def check_window(params: Mapping[str, Any], data_interval_start: Any = None) -> None:
    """ValueError when the form gives one window edge without the other: the missing one would come from the run's
    data interval (another window than meant), and a manual run without a logical date has none; and when a DAG
    with window params gets neither edge in a run without a data interval (triggered with no logical date: its
    window task failed to render, and was retried, with "'data_interval_start' is undefined")."""
    given = [name for name in ("window_start", "window_end") if params.get(name)]
    if len(given) == 1:
        missing = "window_end" if given == ["window_start"] else "window_start"
        raise ValueError(f"{given[0]} is set but {missing} is not: give both, or neither for the run's data interval")
    if not given and "window_start" in params and data_interval_start is None:
        raise ValueError("this run has no data interval (triggered without a logical date) and the form gives no "
                         "window: set window_start and window_end, or trigger it with a logical date")


def spec_document(params: Mapping[str, Any], source_conn: Any, target_conn: Any,
                  lookup_conn: Any | None = None, root: str | Path | None = None) -> dict[str, Any]:
    """The validated MigrationSpec document (defaults filled in) for a trigger's params and its two connections
    (and the lookup service's, which switch_lookup and cleanup_source need).

    SpecError (one line) for a bad combination: same cluster on both sides, a bad regex, a connection
    lacking host or service_url. Relative local paths among the options are taken under `root`.
    """
    clusters: dict[str, dict[str, Any]] = {}
    names = []
    for conn in (source_conn, target_conn):
        try:
            name, entry = cluster_from_connection(conn)
        except ValueError as exc:
            raise SpecError(f"spec: {exc}") from exc
        # Two connections naming one cluster collapse into one entry; from_dict then reports
        # "source and target are both ...", which is the real problem.
        clusters.setdefault(name, entry)
        names.append(name)
    document: dict[str, Any] = {"source": names[0], "target": names[1], "clusters": clusters}
    if lookup_conn is not None:
        try:
            document["lookup"] = lookup_from_connection(lookup_conn)
        except ValueError as exc:
            raise SpecError(f"spec: {exc}") from exc
    for param, path in PARAM_TO_SPEC.items():
        if param in params:
            node = document
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = [] if param == "topics_exclude" and params[param] is None else params[param]
    options = document.get("options", {})
    for key in PATH_OPTIONS:
        if options.get(key):
            options[key] = anchored(options[key], root)
    return MigrationSpec.from_dict(document).to_dict()


def write_spec(run_dir_uri: str, document: Mapping[str, Any]) -> str:
    """Writes the spec as `RUN_DIR/spec.json` (re-validated); returns its location."""
    text = MigrationSpec.from_dict(dict(document)).to_json()
    with run_dir_spark(run_dir_uri) as spark:
        return rundir.write_text(run_dir_uri, SPEC_FILE, text, spark)


class StepOutcomeError(RuntimeError):
    """A step did not do its job: its report is missing, stale or says so. The message is one line."""


def step_outcome(run_dir_uri: str, step: str, *, step_succeeded: bool, dry_run: bool,
                 log: logging.Logger | None = None) -> dict[str, Any]:
    """Reads `RUN_DIR/<step>.json`, logs its summary and returns a compact dict of it.

    StepOutcomeError unless the report exists, the step's task succeeded in this attempt (an older
    attempt's report may still lie in the run dir) and the verdict is what the mode promises:
    "planned" for a dry run, "ok" otherwise.
    """
    location = rundir.join(run_dir_uri, f"{step}.json")
    try:
        with run_dir_spark(run_dir_uri) as spark:
            report = StepReport.read(run_dir_uri, step, spark)
    except FileNotFoundError:
        ran = "succeeded" if step_succeeded else "did not succeed"
        raise StepOutcomeError(f"{step}: no report at {location} (the step {ran} but wrote none)") from None
    for line in report.summary_lines():
        (log or logging.getLogger(__name__)).info("%s", line)
    if report.verdict == "failed":
        raise StepOutcomeError(f"{step} failed: {report.error or 'no error recorded'} (report: {location})")
    if not step_succeeded:
        raise StepOutcomeError(f"{step}: the step's task did not complete in this attempt, so {location} "
                               f"({report.verdict!r}, finished {report.finished_at}) is an earlier attempt's")
    expected = "planned" if dry_run else "ok"
    if report.verdict != expected:
        raise StepOutcomeError(f"{step}: verdict {report.verdict!r}, expected {expected!r} (report: {location})")
    details = report.details
    conflicts = details.get("conflicts") or []
    return {
        "step": report.step,
        "verdict": report.verdict,
        "dry_run": report.dry_run,
        "tenant": report.tenant,
        "source": report.source,
        "target": report.target,
        "spec_hash": report.spec_hash,
        "duration_s": report.duration_s,
        "counts": dict(report.counts),
        "hashes": dict(report.hashes),
        "report": location,
        "plan": details.get("plan"),
        "conflict_count": int(report.counts.get("CONFLICT", len(conflicts))),
        "conflicts": conflicts[:CONFLICTS_IN_SUMMARY],
    }


@contextlib.contextmanager
def run_dir_spark(uri: str) -> Iterator[SparkSession | None]:
    """None for a local run dir; else a local SparkSession for its Hadoop FileSystem (`s3a://` ...).

    Airflow tasks outside spark-submit reach an object-store run dir the way the steps do: through
    Hadoop, configured by spark-defaults. The session is stopped again only if made here.
    """
    if rundir.is_local(uri):
        yield None
        return
    from pyspark.sql import SparkSession  # deferred: local run dirs never import Spark

    active = SparkSession.getActiveSession()
    spark = active or (SparkSession.builder.master("local[1]").appName("pulsar-migration-airflow-io")
                       .config("spark.ui.enabled", "false").getOrCreate())
    try:
        yield spark
    finally:
        if active is None:
            spark.stop()


# -- the rollback DAG: an earlier migration run's spec and run dir -----------------------------------------

MIGRATION_DAG_ID = "pulsar_tenant_migration"


def migration_run_spec(base: str, run_id: str, root: str | Path | None = None, spark: SparkSession | None = None,
                       *, what: str = "") -> tuple[str, dict[str, Any]]:
    """The run dir and spec document of the migration run `run_id`; ValueError (one line, starting with `what`)
    when that run has no spec or its spec is not a JSON document."""
    directory = run_dir(base, MIGRATION_DAG_ID, run_id, root=root)
    try:
        document = json.loads(rundir.read_text(directory, SPEC_FILE, spark))
    except (FileNotFoundError, OSError):
        raise ValueError(f"{what}no run {run_id!r} of {MIGRATION_DAG_ID} with a spec at {directory}") from None
    except ValueError as exc:
        raise ValueError(f"{what}the spec of run {run_id!r} at {directory} is not JSON ({exc})") from None
    if not isinstance(document, dict):
        raise ValueError(f"{what}the spec of run {run_id!r} at {directory} is not a spec document")
    return directory, document


def following(document: Mapping[str, Any], base: str, run_id: str, root: str | Path | None = None,
              spark: SparkSession | None = None) -> dict[str, Any]:
    """The spec document continuing the migration run `run_id` (options.follows_run_dir, checked by
    replicate_topics); ValueError (one line) when that run has no spec, or migrated another tenant or pair."""
    if not rundir.is_local(directory := run_dir(base, MIGRATION_DAG_ID, run_id, root=root)):
        raise ValueError(f"Continue from run: only a run in a local run dir can be continued, not {directory}")
    directory, earlier = migration_run_spec(base, run_id, root, spark, what="Continue from run: ")
    ours = tuple(document[k] for k in ("tenant", "source", "target"))
    theirs = tuple(earlier.get(k) for k in ("tenant", "source", "target"))
    if ours != theirs:
        raise ValueError(f"Continue from run: run {run_id} migrated tenant {theirs[0]} from {theirs[1]} to "
                         f"{theirs[2]}, not tenant {ours[0]} from {ours[1]} to {ours[2]}")
    options = {**document.get("options", {}), "follows_run_dir": directory}
    return MigrationSpec.from_dict({**document, "options": options}).to_dict()


def switched_run_target(base: str, run_id: str, params: Mapping[str, Any], root: str | Path | None = None,
                    spark: SparkSession | None = None, connections: Mapping[str, Any] | None = None
                    ) -> dict[str, str]:
    """`{"spec_path", "run_dir"}` of the migration run `run_id`, whose switch rollback_lookup undoes (or whose
    source cleanup_source removes, some time after that switch). ValueError
    (one line) when that run has no spec, or when its spec names token variables of other connections than the
    trigger's (the tokens would not reach the step), or (given the trigger's `connections` by id) a token file or
    OAuth2 credentials other than those connections name (the step would use the run's, not the trigger's)."""
    directory, document = migration_run_spec(base, run_id, root, spark)
    wanted = {"source": params["source_conn"], "target": params["target_conn"]}
    for side, conn_id in wanted.items():
        name = document[side]
        token_env = document["clusters"][name].get("token_env")
        if token_env not in (None, token_env_name(conn_id)):
            raise ValueError(f"run {run_id} reached its {side} {name} with the token in {token_env}, not through "
                             f"connection {conn_id}: trigger with that run's connections")
        entry = document["clusters"][name]
        if connections is not None and conn_id in connections and (entry.get("token_file") or entry.get("oauth2")):
            _, now = cluster_from_connection(connections[conn_id])
            if any(now.get(key) != entry.get(key) for key in ("token_file", "oauth2")):
                used = ClusterSpec.from_entry(name, entry).credential
                raise ValueError(f"run {run_id} reached its {side} {name} with {used}, not through connection "
                                 f"{conn_id}: trigger with that run's connections")
    lookup_env = (document.get("lookup") or {}).get("token_env")
    if lookup_env not in (None, token_env_name(params.get("lookup_conn") or "")):
        raise ValueError(f"run {run_id} used the lookup service token in {lookup_env}: trigger with that run's "
                         "lookup connection")
    return {"spec_path": rundir.join(directory, SPEC_FILE), "run_dir": directory}
