"""A long copy's progress lines: the engine's (engine.ProgressLog, from its PM-PROGRESS lines) and the Python
path's (partition.PartitionProgress). The engine's real lines are checked in tests/integration/test_copy_rate_cap.py."""

from __future__ import annotations

import logging

import pytest
from pulsar_migration.positions import Position
from pulsar_migration.replication.engine import ProgressLog
from pulsar_migration.replication.partition import PartitionJob, PartitionProgress


def test_engine_progress_lines_give_counts_and_the_rate_since_the_line_before(caplog: pytest.LogCaptureFixture) -> None:
    progress = ProgressLog(4)
    with caplog.at_level(logging.INFO, logger="pulsar_migration.replication.engine"):
        first = progress.log({"started": 4, "ended": 1, "copied_messages": 120_000, "copied_entries": 950,
                              "copied_bytes": 60_000_000, "elapsed_ms": 30_000})
        second = progress.log({"started": 4, "ended": 3, "copied_messages": 300_000, "copied_entries": 2_400,
                               "copied_bytes": 150_000_000, "elapsed_ms": 60_000})
    assert first == ("copy engine progress after 30s: 1 of 4 partition(s) done, 3 copying; 120,000 message(s) in "
                     "950 entries, 60.0 MB copied, 2.0 MB/s lately")
    assert second == ("copy engine progress after 60s: 3 of 4 partition(s) done, 1 copying; 300,000 message(s) in "
                      "2,400 entries, 150.0 MB copied, 3.0 MB/s lately")
    assert [r.getMessage() for r in caplog.records] == [first, second]


def test_python_path_progress_logs_once_an_interval(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    job = PartitionJob("persistent://t/ns/a", "ns/a", -1, Position(7, 999))
    progress = PartitionProgress(job, 30, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="pulsar_migration.replication.partition"):
        for i in range(1000):
            now[0] = i * 0.1  # 100 s of reading
            progress.read(1000, Position(7, i))
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "persistent://t/ns/a: 301 message(s), 0.3 MB read from the source in 30s, at 7:300 of 7:999",
        "persistent://t/ns/a: 601 message(s), 0.6 MB read from the source in 60s, at 7:600 of 7:999",
        "persistent://t/ns/a: 901 message(s), 0.9 MB read from the source in 90s, at 7:900 of 7:999",
    ]
