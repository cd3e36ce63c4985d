"""Starts, checks and stops a local `airflow standalone` for this project.

    python -m localdev.airflow_local start [--timeout 240] | stop | status

AIRFLOW_HOME is var/airflow; DAGs and plugins come from the repository; SQLite + LocalExecutor with
low parallelism (two cores are shared with two Pulsar brokers and Spark). `start` migrates the DB,
applies airflow_settings.yaml, fixes the admin password, launches standalone in its own process group
and waits until the API server answers with a healthy scheduler and DAG processor. `stop` ends that
group and any process that inherited its marker variable (task runners start their own groups).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import requests
from pulsar_migration.cachedir import build_once

from localdev.paths import PROJECT_ROOT, cache_dir, var_dir
from localdev.processes import alive, file_tail, port_in_use, read_live_pid, signal_group, signal_process

log = logging.getLogger(__name__)

API_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
START_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 30.0
ADMIN_USER = "admin"
DEFAULT_ADMIN_PASSWORD = "admin"
# Every process of a standalone started here inherits this variable (value: its AIRFLOW_HOME), so
# `stop` finds task runners and spark-submit JVMs that left the standalone's process group.
MARKER_ENV = "PM_AIRFLOW_LOCAL_HOME"


class AirflowLocalError(RuntimeError):
    """The local Airflow could not be prepared, started or stopped."""


def airflow_home() -> Path:
    return var_dir() / "airflow"


def venv_bin() -> Path:
    """The bin/ of the running interpreter's environment: `airflow`, `spark-submit` and `python3` live there."""
    return Path(sys.prefix) / "bin"


def api_port() -> int:
    return int(os.environ.get("PM_AIRFLOW_PORT", DEFAULT_PORT))


def admin_password() -> str:
    return os.environ.get("PM_AIRFLOW_ADMIN_PASSWORD", DEFAULT_ADMIN_PASSWORD)


def airflow_env(home: Path | None = None, *, port: int | None = None,
                base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment every Airflow process of this project runs with (standalone, CLI calls, tests).

    Airflow reads these at import time: set them before `import airflow` in the same process.
    """
    home = Path(home or airflow_home()).resolve()
    port = port or api_port()
    env = dict(os.environ if base is None else base)
    env.setdefault("SPARK_CONF_DIR", str(PROJECT_ROOT / "conf" / "spark"))  # the tasks' spark-submits
    parallelism = env.get("PM_AIRFLOW_PARALLELISM", "2")
    path = env.get("PATH", "")
    if str(venv_bin()) not in path.split(os.pathsep):
        path = os.pathsep.join(p for p in (str(venv_bin()), path) if p)
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT_ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(PROJECT_ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        # Each running task may hold a spark-submit JVM: keep concurrency at the core count.
        "AIRFLOW__CORE__PARALLELISM": parallelism,
        "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": parallelism,
        "AIRFLOW__API__WORKERS": "1",
        # Fixed local admin password: listen on loopback only unless asked otherwise.
        "AIRFLOW__API__HOST": env.get("PM_AIRFLOW_HOST", "127.0.0.1"),
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://localhost:{port}/execution/",
        # One API worker answers the running tasks too: on a loaded host 5 s (the default) can pass before it does.
        "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": env.get("AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT", "30"),
        # The log servers' defaults (8793/8794) would clash when a second instance runs on another port.
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(8793 if port == DEFAULT_PORT else port + 1),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(8794 if port == DEFAULT_PORT else port + 2),
        # New DAG files show up within half a minute instead of five.
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN_USER}:admin",
        # The connection form's Test button (PulsarHook.test_connection); off in Airflow by default, on here
        # for the local admin (set it to Disabled in the environment to turn it off).
        "AIRFLOW__CORE__TEST_CONNECTION": env.get("AIRFLOW__CORE__TEST_CONNECTION", "Enabled"),
        # spark-submit (pyspark's launcher) and the `python3` it starts for PySpark come from the venv.
        "PATH": path,
    })
    return env


def write_admin_password(home: Path, password: str | None = None) -> Path:
    """Pre-writes the simple auth manager's password file so the admin password is fixed, not generated."""
    path = home / "simple_auth_manager_passwords.json.generated"
    home.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({ADMIN_USER: password or admin_password()}) + "\n")
    path.chmod(0o600)
    return path


def run_airflow_cli(args: list[str], env: Mapping[str, str], *, timeout_s: float = 300.0) -> float:
    """Runs `airflow <args>`; returns its duration, raises with the output tail on failure."""
    started = time.monotonic()
    proc = subprocess.run([str(venv_bin() / "airflow"), *args], env=dict(env), capture_output=True, text=True,
                          timeout=timeout_s, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-20:])
        raise AirflowLocalError(f"`airflow {' '.join(args)}` exited {proc.returncode}:\n{tail}")
    return time.monotonic() - started


def migrated_db(env: Mapping[str, str]) -> float:
    """`airflow db migrate` for the home `env` names, as a copy of a DB migrated once per Airflow install into the
    user cache (a migrate is half a minute of CPU, and each test home needs one). Returns the seconds taken."""
    started = time.monotonic()
    db = Path(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].removeprefix("sqlite:///"))
    template = cache_dir() / "airflow-db" / _install_key() / "airflow.db"

    def build() -> None:
        staging = template.parent.with_name(f".{template.parent.name}.{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        run_airflow_cli(["db", "migrate"], airflow_env(staging, base=env))
        template.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging / "airflow.db", template)
        shutil.rmtree(staging, ignore_errors=True)

    build_once(template, template, build)
    db.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, db)
    return time.monotonic() - started


def _install_key() -> str:
    """The installed Airflow distributions and their versions: what the migrated schema depends on."""
    from importlib import metadata

    names = sorted(f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions()
                   if (d.metadata["Name"] or "").lower().startswith("apache-airflow"))
    return hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]


def prepare(home: Path | None = None, *, settings_file: Path | None = None) -> dict[str, float]:
    """Migrates the metadata DB, applies airflow_settings.yaml and fixes the admin password."""
    home = Path(home or airflow_home())
    home.mkdir(parents=True, exist_ok=True)
    env = airflow_env(home)
    timings = {"db_migrate_s": run_airflow_cli(["db", "migrate"], env)}
    started = time.monotonic()
    cmd = [str(venv_bin() / "python"), "-m", "localdev.airflow_settings", "apply"]
    if settings_file:
        cmd += ["--file", str(settings_file)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1].removeprefix("error: ")
        raise AirflowLocalError(f"applying airflow settings failed: {last}")
    timings["apply_settings_s"] = time.monotonic() - started
    write_admin_password(home)
    return timings


# -- process bookkeeping ------------------------------------------------------------------------------

def _pid_file(home: Path) -> Path:
    return home / "standalone.pid"


def _log_file(home: Path) -> Path:
    return home / "standalone.log"


def _read_pid(home: Path) -> int | None:
    return read_live_pid(_pid_file(home))


def _marked_pids(home: Path) -> list[int]:
    """Processes whose environment carries this home's marker (Linux /proc)."""
    needle = f"{MARKER_ENV}={home.resolve()}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0") and alive(int(entry.name)):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def log_tail(home: Path | None = None, lines: int = 40) -> str:
    return file_tail(_log_file(Path(home or airflow_home())), lines=lines)


def health(port: int | None = None, timeout_s: float = 15.0) -> dict[str, str] | None:
    """Component statuses from the API server (`{"metadatabase": "healthy", ...}`), None if it does not answer."""
    try:
        resp = requests.get(f"http://{API_HOST}:{port or api_port()}/api/v2/monitor/health", timeout=timeout_s)
    except requests.RequestException:
        return None
    if resp.status_code != 200:
        return None
    try:
        body = resp.json()
    except ValueError:
        return None
    return {name: (part or {}).get("status") or "unknown" for name, part in body.items() if isinstance(part, dict)}


def _ready(state: dict[str, str] | None) -> bool:
    return bool(state) and all(
        state.get(part) == "healthy" for part in ("metadatabase", "scheduler", "dag_processor")
    )


# -- lifecycle ----------------------------------------------------------------------------------------

def start(*, timeout_s: float = START_TIMEOUT_S, settings_file: Path | None = None) -> dict[str, float]:
    """Starts standalone unless it runs already; returns timings. Raises AirflowLocalError on failure."""
    home = airflow_home()
    port = api_port()
    pid = _read_pid(home)
    if pid is not None and _ready(health(port)):
        log.info("airflow: already running (pid %d) at http://localhost:%d", pid, port)
        return {}
    timings: dict[str, float] = {}
    if pid is None:
        if port_in_use(port, API_HOST):
            raise AirflowLocalError(f"port {port} is taken by a process this tool did not start; free it first")
        timings.update(prepare(home, settings_file=settings_file))
        env = airflow_env(home, port=port)
        env[MARKER_ENV] = str(home.resolve())
        with _log_file(home).open("ab") as out:
            proc = subprocess.Popen(
                [str(venv_bin() / "airflow"), "standalone"], cwd=PROJECT_ROOT, env=env, stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: stop() takes the components down together
            )
        pid = proc.pid
        _pid_file(home).write_text(str(pid))
        log.info("airflow: standalone started (pid %d), log %s", pid, _log_file(home))
    else:
        log.info("airflow: standalone pid %d is starting; waiting for it", pid)
    started = time.monotonic()
    deadline = started + timeout_s
    while not _ready(state := health(port)):
        if _read_pid(home) is None:
            raise AirflowLocalError(f"airflow standalone exited during start-up; last log lines:\n{log_tail(home)}")
        if time.monotonic() > deadline:
            tail = log_tail(home)
            stop()
            raise AirflowLocalError(
                f"airflow not healthy after {timeout_s:.0f}s (health: {state}); last log lines:\n{tail}"
            )
        time.sleep(1.0)
    timings["start_to_healthy_s"] = time.monotonic() - started
    log.info("airflow: healthy at http://localhost:%d after %.1fs", port, timings["start_to_healthy_s"])
    return timings


def stop(timeout_s: float = STOP_TIMEOUT_S) -> None:
    """TERM the standalone's process group and marked stragglers, KILL what remains after the timeout."""
    home = airflow_home()
    pid = _read_pid(home)
    marked = _marked_pids(home)
    if pid is None and not marked:
        log.info("airflow: not running")
        _pid_file(home).unlink(missing_ok=True)
        return
    if pid is not None:
        signal_group(pid, signal.SIGTERM)
    for other in marked:
        signal_process(other, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and ((pid is not None and alive(pid)) or _marked_pids(home)):
        time.sleep(0.5)
    leftovers = _marked_pids(home)
    if (pid is not None and alive(pid)) or leftovers:
        log.warning("airflow: processes ignored SIGTERM for %.0fs; killing", timeout_s)
    if pid is not None:
        signal_group(pid, signal.SIGKILL)
    for other in leftovers:
        signal_process(other, signal.SIGKILL)
    _pid_file(home).unlink(missing_ok=True)
    log.info("airflow: stopped")


def status() -> str:
    home = airflow_home()
    pid = _read_pid(home)
    state = health()
    if pid is None:
        return "stopped" if state is None else f"not started by this tool, but port {api_port()} answers: {state}"
    if _ready(state):
        return f"healthy at http://localhost:{api_port()} (pid {pid})"
    return f"process {pid} running, not healthy yet (health: {state})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localdev.airflow_local", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["start", "stop", "status"])
    parser.add_argument("--timeout", type=float, default=START_TIMEOUT_S)
    parser.add_argument("--settings-file", type=Path, default=None, help="default: airflow_settings.yaml")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        if args.command == "start":
            timings = start(timeout_s=args.timeout, settings_file=args.settings_file)
            if timings:  # freshly started: show the credentials once
                log.info("airflow: timings %s", {k: round(v, 1) for k, v in timings.items()})
                sys.stdout.write(
                    f"Airflow UI: http://localhost:{api_port()}  user: {ADMIN_USER}  password: {admin_password()}\n"
                )
        elif args.command == "stop":
            stop()
        else:
            sys.stdout.write(f"airflow: {status()}\n")
    except AirflowLocalError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
