"""Fault points: a parked step marks where it is and goes on when the test says so (or when its pause ends)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pulsar_migration import faults


@pytest.fixture
def armed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    monkeypatch.setenv(faults.ENV, "demo.point@2=30")
    monkeypatch.setenv(faults.MARK_DIR_ENV, str(tmp_path))
    faults._armed.cache_clear()
    yield tmp_path
    faults._armed.cache_clear()


def test_only_the_armed_pass_parks_and_a_go_file_ends_the_pause(armed: Path) -> None:
    started = time.monotonic()
    faults.at("demo.point", 1)
    faults.at("other.point", 2)
    assert not (armed / "demo.point").exists() and time.monotonic() - started < 1

    def release() -> None:
        while not (armed / "demo.point").exists():
            time.sleep(0.05)
        (armed / "demo.point.go").touch()

    releaser = threading.Thread(target=release)
    releaser.start()
    started = time.monotonic()
    faults.at("demo.point", 2)
    releaser.join()
    assert (armed / "demo.point").exists() and time.monotonic() - started < 10  # not the 30 s pause


def test_without_a_go_file_the_pause_runs_out(armed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(faults.ENV, "demo.point@1=0.3")
    faults._armed.cache_clear()
    started = time.monotonic()
    faults.at("demo.point", 1)
    assert 0.3 <= time.monotonic() - started < 5
