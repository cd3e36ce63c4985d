"""backfill.state_lock: one window at a time in a cluster sink's state dir (Airflow's `backfill create` runs up to
ten windows at once by default, whatever the DAG's max_active_runs)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from pulsar_migration.backfill import state_lock


def test_a_second_window_waits_for_the_first_and_is_told_who_holds_it(tmp_path: Path,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    state = str(tmp_path / "_state" / "demo.a.b")  # created by the lock: the first window's copy makes it anyway
    order: list[str] = []
    first_in = threading.Event()
    release = threading.Event()

    def first() -> None:
        with state_lock.holding(state, "window 10:00-11:00"):
            order.append("first in")
            first_in.set()
            release.wait(5)
            order.append("first out")

    def second() -> None:
        with state_lock.holding(state, "window 11:00-12:00", poll_s=0.05):
            order.append("second in")

    caplog.set_level("INFO", logger=state_lock.__name__)
    one = threading.Thread(target=first)
    one.start()
    assert first_in.wait(5)
    two = threading.Thread(target=second)
    two.start()
    time.sleep(0.3)
    assert order == ["first in"]  # the second waits
    release.set()
    one.join(5)
    two.join(5)
    assert order == ["first in", "first out", "second in"]
    assert "waiting for window 10:00-11:00 (pid" in caplog.text
    with state_lock.holding(state, "again", poll_s=0.05):  # released: taken at once
        pass


def test_a_state_dir_spark_writes_is_not_locked_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    with state_lock.holding("s3a://bucket/_state/demo.a.b", "window"):
        pass
    assert "cannot be locked" in caplog.text
