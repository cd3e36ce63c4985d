"""A Spark standalone cluster (one master, one worker) from the installed pyspark, for proving the steps off
`local[*]`: spark-submit ships the library with --py-files to executors in another JVM, and the run dir is
shared through its path (on a real cluster: an object store, `s3a://...`).

    with standalone_cluster(work_dir) as master_url:   # spark://127.0.0.1:<port>
        ...

The master and the worker are `spark-class` JVMs in their own sessions, logging to `work_dir`; the worker's
executors start `python3` from PATH, so the venv's bin comes first there.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from localdev.airflow_local import venv_bin
from localdev.processes import file_tail, port_in_use, signal_group

log = logging.getLogger(__name__)

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


class SparkStandaloneError(RuntimeError):
    """The standalone cluster did not come up (message: one line plus the log's tail)."""


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(work_dir: Path, name: str, args: list[str]) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env.update({"SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": "127.0.0.1",
                "PATH": os.pathsep.join([str(venv_bin()), env.get("PATH", "")]),
                "SPARK_WORKER_DIR": str(work_dir / "worker")})
    out = (work_dir / f"{name}.log").open("wb")
    return subprocess.Popen([str(spark_home() / "bin" / "spark-class"), *args], env=env, stdout=out,
                            stderr=subprocess.STDOUT, start_new_session=True)


def _wait_for(condition: str, check: Callable[[], bool], log_file: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise SparkStandaloneError(f"{condition} within {timeout_s:.0f}s; log:\n{file_tail(log_file)}")
        time.sleep(0.5)


@contextmanager
def standalone_cluster(work_dir: Path, cores: int = 2, memory: str = "1g",
                       timeout_s: float = 90.0) -> Iterator[str]:
    """Starts a master and one worker, yields the master URL once the worker registered, stops both."""
    work_dir.mkdir(parents=True, exist_ok=True)
    port, ui_port, worker_ui = free_port(), free_port(), free_port()
    url = f"spark://127.0.0.1:{port}"
    processes = [_start(work_dir, "master", [MASTER_CLASS, "--host", "127.0.0.1", "--port", str(port),
                                             "--webui-port", str(ui_port)])]
    try:
        _wait_for(f"the Spark master did not listen on {port}", lambda: port_in_use(port), work_dir / "master.log",
                  timeout_s)
        processes.append(_start(work_dir, "worker", [WORKER_CLASS, url, "--host", "127.0.0.1", "--cores", str(cores),
                                                     "--memory", memory, "--webui-port", str(worker_ui)]))
        worker_log = work_dir / "worker.log"
        _wait_for("the Spark worker did not register with the master",
                  lambda: "Successfully registered with master" in worker_log.read_text(errors="replace"),
                  worker_log, timeout_s)
        log.info("Spark standalone at %s (UI http://127.0.0.1:%d), logs in %s", url, ui_port, work_dir)
        yield url
    finally:
        for proc in reversed(processes):
            signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                signal_group(proc.pid, signal.SIGKILL)
                proc.wait(10)
