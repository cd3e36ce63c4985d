"""Applies `airflow_settings.yaml` (Astro CLI schema) to the metadata DB of the current AIRFLOW_HOME.

    python -m localdev.airflow_settings apply [--file airflow_settings.yaml]
    python -m localdev.airflow_settings check [--file airflow_settings.yaml]   # validate only

Only Astro CLI reads that file natively; this is the project's loader for everything else (`make
airflow`, the DAG tests). Applying is idempotent: each connection, pool and variable is created,
updated to match the file, or left alone; entries absent from the file are never deleted.

It uses Airflow's models in this process (one import, one DB session) instead of the CLI: `airflow
connections add` refuses existing ids and rewrites unknown `--conn-type`s to `generic`, and each CLI
call costs a couple of seconds of start-up. Parsing and validation need no Airflow import.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from localdev.paths import PROJECT_ROOT

log = logging.getLogger(__name__)

DEFAULT_FILE = PROJECT_ROOT / "airflow_settings.yaml"

CONNECTION_KEYS = (
    "conn_id", "conn_type", "conn_host", "conn_schema", "conn_login", "conn_password", "conn_port", "conn_extra",
)
POOL_KEYS = ("pool_name", "pool_slot", "pool_description")
VARIABLE_KEYS = ("variable_name", "variable_value")
SECTIONS = {"connections": CONNECTION_KEYS, "pools": POOL_KEYS, "variables": VARIABLE_KEYS}
# Airflow's own key rule (airflow.utils.helpers.validate_key), checked here so `check` needs no Airflow.
_KEY = re.compile(r"^[\w.-]{1,200}$")


class SettingsError(ValueError):
    """The settings file is malformed; the message names the file and the bad entry in one line."""


@dataclass(frozen=True)
class ConnectionSetting:
    conn_id: str
    conn_type: str
    host: str | None = None
    schema: str | None = None
    login: str | None = None
    password: str | None = None
    port: int | None = None
    extra: dict[str, Any] | None = None


@dataclass(frozen=True)
class PoolSetting:
    name: str
    slots: int
    description: str = ""


@dataclass(frozen=True)
class VariableSetting:
    key: str
    value: str


@dataclass(frozen=True)
class AirflowSettings:
    connections: tuple[ConnectionSetting, ...] = ()
    pools: tuple[PoolSetting, ...] = ()
    variables: tuple[VariableSetting, ...] = ()


# -- parsing and validation ---------------------------------------------------------------------------

def load_settings(path: str | Path = DEFAULT_FILE) -> AirflowSettings:
    """Reads and validates a settings file; raises SettingsError naming the bad entry."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SettingsError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise SettingsError(f"{path}: invalid YAML{where}: {problem}") from exc
    return parse_settings(data, source=str(path))


def parse_settings(data: Any, source: str = "airflow_settings.yaml") -> AirflowSettings:
    """Validates the loaded YAML document (`{"airflow": {...}}`)."""
    if data is None:
        return AirflowSettings()
    if not isinstance(data, Mapping) or set(data) != {"airflow"}:
        found = sorted(map(str, data)) if isinstance(data, Mapping) else type(data).__name__
        raise SettingsError(f"{source}: the top level must be exactly one key `airflow`, found {found}")
    body = data["airflow"]
    if body is None:
        return AirflowSettings()
    if not isinstance(body, Mapping):
        raise SettingsError(f"{source}: `airflow` must be a mapping, got {type(body).__name__}")
    unknown = sorted(set(map(str, body)) - set(SECTIONS))
    if unknown:
        raise SettingsError(f"{source}: unknown section(s) under `airflow`: {', '.join(unknown)}"
                            f" (allowed: {', '.join(SECTIONS)})")
    parsed: dict[str, list[Any]] = {}
    for section, keys in SECTIONS.items():
        entries = body.get(section) or []
        if not isinstance(entries, list):
            raise SettingsError(f"{source}: `airflow.{section}` must be a list, got {type(entries).__name__}")
        parsed[section] = []
        seen: set[str] = set()
        for index, raw in enumerate(entries):
            if raw is None or (isinstance(raw, Mapping) and all(v is None for v in raw.values())):
                continue  # Astro's template ships empty placeholder entries
            where = f"{source}: {section}[{index}]"
            entry = _entry(raw, keys, where)
            item = _PARSERS[section](entry, where)
            ident = _ident(item)
            if ident in seen:
                raise SettingsError(f"{where}: duplicate {keys[0]} {ident!r}")
            seen.add(ident)
            parsed[section].append(item)
    return AirflowSettings(tuple(parsed["connections"]), tuple(parsed["pools"]), tuple(parsed["variables"]))


def _entry(raw: Any, keys: tuple[str, ...], where: str) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise SettingsError(f"{where}: must be a mapping with keys {', '.join(keys)}, got {type(raw).__name__}")
    unknown = sorted(set(map(str, raw)) - set(keys))
    if unknown:
        name = raw.get(keys[0])
        label = f" ({name})" if isinstance(name, str) else ""
        raise SettingsError(f"{where}{label}: unknown key(s) {', '.join(unknown)} (allowed: {', '.join(keys)})")
    return dict(raw)


def _ident(item: ConnectionSetting | PoolSetting | VariableSetting) -> str:
    if isinstance(item, ConnectionSetting):
        return item.conn_id
    return item.name if isinstance(item, PoolSetting) else item.key


def _key(entry: dict[str, Any], field: str, where: str) -> str:
    value = entry.get(field)
    if not isinstance(value, str) or not _KEY.match(value):
        raise SettingsError(f"{where}: {field} must be 1-200 characters of letters, digits, '_', '.', '-',"
                            f" got {value!r}")
    return value


def _optional_str(entry: dict[str, Any], field: str, where: str) -> str | None:
    value = entry.get(field)
    if value is None or value == "":
        return None  # Astro writes empty fields as null; Airflow stores absent fields as NULL
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise SettingsError(f"{where}: {field} must be a string, got {type(value).__name__}")
    return str(value)


def _connection(entry: dict[str, Any], where: str) -> ConnectionSetting:
    conn_id = _key(entry, "conn_id", where)
    where = f"{where} ({conn_id})"
    conn_type = entry.get("conn_type")
    if not isinstance(conn_type, str) or not conn_type.strip():
        raise SettingsError(f"{where}: conn_type is required (e.g. spark, http, generic), got {conn_type!r}")
    port = entry.get("conn_port")
    if port is not None and port != "":
        if isinstance(port, str) and port.isdigit():
            port = int(port)
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise SettingsError(f"{where}: conn_port must be an integer 1-65535, got {port!r}")
    else:
        port = None
    return ConnectionSetting(
        conn_id=conn_id,
        conn_type=conn_type.strip(),
        host=_optional_str(entry, "conn_host", where),
        schema=_optional_str(entry, "conn_schema", where),
        login=_optional_str(entry, "conn_login", where),
        password=_optional_str(entry, "conn_password", where),
        port=port,
        extra=_extra(entry.get("conn_extra"), where),
    )


def _extra(value: Any, where: str) -> dict[str, Any] | None:
    """Astro accepts conn_extra as a YAML mapping or as a JSON object in a string."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise SettingsError(f"{where}: conn_extra is not valid JSON: {exc.msg} at column {exc.colno}") from exc
    if not isinstance(value, Mapping):
        raise SettingsError(f"{where}: conn_extra must be a mapping (or a JSON object), got {type(value).__name__}")
    try:
        json.dumps(value)
    except TypeError as exc:
        raise SettingsError(f"{where}: conn_extra holds a value JSON cannot encode: {exc}") from exc
    return dict(value) or None


def _pool(entry: dict[str, Any], where: str) -> PoolSetting:
    name = _key(entry, "pool_name", where)
    where = f"{where} ({name})"
    slots = entry.get("pool_slot")
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < -1:
        raise SettingsError(f"{where}: pool_slot must be an integer >= 0 (or -1 for unlimited), got {slots!r}")
    return PoolSetting(name=name, slots=slots, description=_optional_str(entry, "pool_description", where) or "")


def _variable(entry: dict[str, Any], where: str) -> VariableSetting:
    key = _key(entry, "variable_name", where)
    if "variable_value" not in entry:
        raise SettingsError(f"{where} ({key}): variable_value is required")
    value = entry["variable_value"]
    # Strings are stored as written; anything else as JSON, so Variable.get(deserialize_json=True) reads it.
    return VariableSetting(key=key, value=value if isinstance(value, str) else json.dumps(value))


_PARSERS = {"connections": _connection, "pools": _pool, "variables": _variable}


# -- applying ------------------------------------------------------------------------------------------

def apply_settings(settings: AirflowSettings) -> dict[str, str]:
    """Makes the metadata DB of the current AIRFLOW_HOME match `settings`.

    Returns `{"connection:<id>" | "pool:<name>" | "variable:<key>": "created" | "updated" | "unchanged"}`.
    Everything is written in one transaction: a failure leaves the DB as it was.
    """
    # Imported here: Airflow reads AIRFLOW_HOME and its config at import time.
    from airflow.models.connection import Connection
    from airflow.models.pool import Pool
    from airflow.models.variable import Variable
    from airflow.utils.session import create_session
    from sqlalchemy import select

    outcome: dict[str, str] = {}
    with create_session() as session:
        for c in settings.connections:
            current = session.scalar(select(Connection).where(Connection.conn_id == c.conn_id))
            if current is None:
                session.add(Connection(conn_id=c.conn_id, conn_type=c.conn_type, host=c.host, schema=c.schema,
                                       login=c.login, password=c.password, port=c.port, extra=c.extra))
                outcome[f"connection:{c.conn_id}"] = "created"
                continue
            have = (current.conn_type, current.host, current.schema, current.login, current.password or None,
                    current.port, current.extra_dejson or None)
            want = (c.conn_type, c.host, c.schema, c.login, c.password, c.port, c.extra)
            if have == want:
                outcome[f"connection:{c.conn_id}"] = "unchanged"
                continue
            current.conn_type, current.host, current.schema, current.login = want[:4]
            if c.password:
                current.password = c.password  # the property setter encrypts with the Fernet key
            else:
                # The setter ignores falsy values, so removing a token needs the column itself.
                current._password = None
                current.is_encrypted = False
            current.port = c.port
            current.extra = json.dumps(c.extra) if c.extra is not None else None
            outcome[f"connection:{c.conn_id}"] = "updated"

        for p in settings.pools:
            current_pool = session.scalar(select(Pool).where(Pool.pool == p.name))
            if current_pool is not None and (current_pool.slots, current_pool.description or "") == (
                p.slots, p.description
            ):
                outcome[f"pool:{p.name}"] = "unchanged"
                continue
            Pool.create_or_update_pool(
                p.name, p.slots, p.description,
                # not in the Astro schema: keep whatever the pool has
                current_pool.include_deferred if current_pool is not None else False,
                session=session,
            )
            outcome[f"pool:{p.name}"] = "created" if current_pool is None else "updated"

        for v in settings.variables:
            current_var = session.scalar(select(Variable).where(Variable.key == v.key))
            if current_var is not None and current_var.val == v.value:
                outcome[f"variable:{v.key}"] = "unchanged"
                continue
            Variable.set(v.key, v.value, session=session)
            outcome[f"variable:{v.key}"] = "created" if current_var is None else "updated"
    return outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localdev.airflow_settings", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["apply", "check"])
    parser.add_argument("--file", type=Path, default=DEFAULT_FILE, help="default: %(default)s")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        settings = load_settings(args.file)
    except SettingsError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    if args.command == "check":
        log.info("%s: %d connections, %d pools, %d variables: valid", args.file,
                 len(settings.connections), len(settings.pools), len(settings.variables))
        return 0
    try:
        outcome = apply_settings(settings)
    except Exception as exc:  # a DB or Airflow problem: one clear line, details in the log
        log.debug("apply failed", exc_info=True)
        first_line = (str(exc).strip().splitlines() or [""])[0]
        sys.stderr.write(f"error: applying {args.file} failed: {type(exc).__name__}: {first_line}"
                         " (has `airflow db migrate` run for this AIRFLOW_HOME?)\n")
        return 1
    for name, result in outcome.items():
        log.info("%s %s", name, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
