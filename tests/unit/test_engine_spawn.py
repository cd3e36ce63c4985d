"""How the copy engine's JVM is started from a Spark driver or task (engine.spawn_tied): it dies with the thread
that started it, and starting it leaves the other threads' py4j connections to the Spark JVM alone (a
`preexec_fn` ran Python in the forked child, where py4j's finalizers shut those sockets down: one "Exception while
sending command" per engine start in the cutover's driver)."""

from __future__ import annotations

import logging
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pulsar_migration.replication.engine import spawn_tied
from pyspark.sql import SparkSession

PY4J_RETRY = "Exception while sending command"


def test_starting_it_leaves_the_other_threads_py4j_connections_alone(spark: SparkSession,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    jvm: Any = spark.sparkContext._jvm
    pinned, go = threading.Event(), threading.Event()
    answers: list[int] = []

    def other_thread() -> None:
        answers.append(jvm.java.lang.Math.abs(-1))  # this thread's own connection (PySpark pins one per thread)
        pinned.set()
        go.wait(30)
        answers.append(jvm.java.lang.Math.abs(-2))  # the same connection, after the spawn

    caplog.set_level(logging.INFO)
    thread = threading.Thread(target=other_thread)
    thread.start()
    assert pinned.wait(30)
    assert spawn_tied(["true"], stdout=subprocess.DEVNULL).wait(30) == 0
    go.set()
    thread.join(30)
    assert answers == [1, 2]
    assert not [r.getMessage() for r in caplog.records if PY4J_RETRY in r.getMessage()]


def test_it_runs_the_command_itself_and_dies_with_the_thread_that_started_it() -> None:
    started: list[subprocess.Popen[Any]] = []

    def starter() -> None:
        child = spawn_tied(["sleep", "60"])
        started.append(child)
        deadline = time.monotonic() + 30
        # Past the launcher: the child's own process is now `sleep` (so its pid is the command's, for signals).
        while Path(f"/proc/{child.pid}/comm").read_text().strip() != "sleep" and time.monotonic() < deadline:
            time.sleep(0.01)

    thread = threading.Thread(target=starter)
    thread.start()
    thread.join(40)
    assert started[0].wait(10) == -signal.SIGKILL


def test_a_failing_command_gives_its_own_exit_code() -> None:
    assert spawn_tied(["sh", "-c", "exit 7"]).wait(30) == 7
