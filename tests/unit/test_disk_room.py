"""The benchmarks' disk check: room for a run's data on the local clusters' disk, judged before anything is written."""

from __future__ import annotations

import shutil
from collections import namedtuple
from pathlib import Path

import pytest

from benchmarks import disk_room
from benchmarks import replication_throughput as bench

Usage = namedtuple("Usage", "total used free")
GB = 10**9


def fake_disk(monkeypatch: pytest.MonkeyPatch, total_gb: int, used_gb: int, free_gb: int | None = None) -> list[Path]:
    asked: list[Path] = []

    def usage(path: Path) -> Usage:
        asked.append(Path(path))
        return Usage(total_gb * GB, used_gb * GB, (total_gb - used_gb if free_gb is None else free_gb) * GB)

    monkeypatch.setattr(shutil, "disk_usage", usage)
    return asked


def test_a_run_writes_its_payload_once_per_method_and_once_as_source_twice_over() -> None:
    assert disk_room.bytes_needed(768 * 10**6 * 6, 4) == 46_080_000_000  # measured: 44 GB for that run


def test_room_below_ninety_percent_use_is_enough(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_disk(monkeypatch, total_gb=100, used_gb=50)
    assert disk_room.shortage(tmp_path, 40 * GB) is None
    line = disk_room.shortage(tmp_path, 41 * GB)
    assert line is not None and "needs about 41.0 GB" in line and "only 40.0 GB are left" in line
    assert "make clusters-reset" in line and "\n" not in line


def test_use_is_counted_as_the_bookie_counts_it_from_what_is_free(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    # A shared disk (this machine's: 252 GB, 19 GB used by this file system's view, 77 GB free): the bookie sees
    # 1 - free/total of it in use, and stops writing when free space falls under 5% of the total.
    fake_disk(monkeypatch, total_gb=252, used_gb=19, free_gb=77)
    assert disk_room.shortage(tmp_path, 51 * GB) is None
    line = disk_room.shortage(tmp_path, 60 * GB)
    assert line is not None and "only 51.8 GB are left below 90% use (77.0 GB free" in line


def test_a_path_not_made_yet_is_judged_by_its_nearest_existing_parent(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    asked = fake_disk(monkeypatch, total_gb=100, used_gb=10)
    assert disk_room.shortage(tmp_path / "var" / "pulsar", GB) is None
    assert asked == [tmp_path]


def test_the_benchmark_refuses_a_run_the_disk_cannot_hold_before_writing(monkeypatch: pytest.MonkeyPatch,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(bench.PulsarAdmin, "healthy", lambda self: True)
    fake_disk(monkeypatch, total_gb=100, used_gb=89)
    tenants_made: list[object] = []
    monkeypatch.setattr(bench, "Tenants", lambda *a: tenants_made.append(a))

    code = bench.main(["--mb", "768", "--sizes", "1024", "--shapes", "batched", "--methods", "raw", "--no-plot"])

    assert code == 1 and not tenants_made
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: the run needs about 3.1 GB")
