"""The rate caps' check against what the source takes in now (replication.step.intake_check): a cap not above the
intake gets one warning line, in the log and the report. Its numbers come from the partitions' stats; a fake admin
stands in for them here (the capped copies against real brokers are in tests/integration/test_copy_rate_cap.py)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from pulsar_migration.admin import NotFound
from pulsar_migration.positions import Position
from pulsar_migration.replication.partition import PartitionJob
from pulsar_migration.replication.step import intake_check, intake_warning
from pulsar_migration.throttle import Caps


class StatsAdmin:
    def __init__(self, stats: dict[str, dict[str, Any]]) -> None:
        self.stats = stats

    def topic_path(self, topic: str) -> str:
        return topic

    def get(self, path: str) -> dict[str, Any]:
        topic = path.removesuffix("/stats")
        if topic not in self.stats:
            raise NotFound(path)
        return self.stats[topic]


def job(topic: str) -> PartitionJob:
    return PartitionJob(topic, "ns/" + topic, -1, Position(1, 1))


def test_a_cap_at_or_below_the_intake_is_named() -> None:
    assert intake_warning(Caps(10e6, None), 4e6, 100) is None
    assert intake_warning(Caps(None, 500), 4e6, 100) is None
    assert intake_warning(Caps(None, None), 4e6, 1e6) is None
    assert intake_warning(Caps(5e6, None), 0, 0) is None  # nothing coming in: nothing to fall behind
    assert intake_warning(Caps(4e6, 1000), 4e6, 1500) == (
        "the copy's rate cap is not above what the source takes in now (4 MB/s against 4 MB/s; 1000 msgs/s against "
        "1500 msgs/s): the copy will fall further behind while it runs")


def test_the_intake_is_summed_over_the_partitions_and_a_missing_one_counts_nothing(
        caplog: pytest.LogCaptureFixture) -> None:
    admin = StatsAdmin({"a": {"msgThroughputIn": 1_500_000.0, "msgRateIn": 300.0},
                        "b": {"msgThroughputIn": 1_000_000.0, "msgRateIn": 200.5}})
    jobs = [job("a"), job("b"), job("gone")]
    intake, _ = intake_check(Caps(5e6, None), admin, jobs, 4)  # type: ignore[arg-type]
    assert intake == {"source_in_mb_per_s": 2.5, "source_in_msgs_per_s": 500.5}
    with caplog.at_level(logging.WARNING, logger="pulsar_migration.replication.step"):
        checked, _ = intake_check(Caps(2e6, None), admin, jobs, 4)  # type: ignore[arg-type]
    assert checked["warning"].startswith("the copy's rate cap is not above what the source takes in now (2 MB/s")
    assert [r.getMessage() for r in caplog.records] == [checked["warning"]]


def test_the_same_stats_give_each_job_its_average_message_size() -> None:
    """The engine sizes its readers by it: read here, it is not read again per partition (0.0: read, none counted;
    None: not read, the engine reads it)."""
    admin = StatsAdmin({"a": {"msgThroughputIn": 0, "msgRateIn": 0, "msgInCounter": 4, "bytesInCounter": 4096},
                        "b": {"msgThroughputIn": 0, "msgRateIn": 0}})
    _, jobs = intake_check(Caps(5e6, None), admin, [job("a"), job("b"), job("gone")], 2)  # type: ignore[arg-type]
    assert [(j.topic, j.average_message_bytes) for j in jobs] == [("a", 1024.0), ("b", 0.0), ("gone", None)]
