"""How a backfill archive window spreads its partitions' reads over Spark tasks: a task (and a client) per
partition while they are few, the same bounded round-robin groups as replicate_topics when they are many (a task
and a client per partition took the reads of a 300-topic window from 2-9 s to 20-39 s). Planning only: nothing
is read, the frame is never evaluated."""

from __future__ import annotations

from typing import Any

from pulsar_migration.backfill.archive import window_frame
from pulsar_migration.backfill.window import Window, WindowRange
from pulsar_migration.positions import Position
from pulsar_migration.replication.step import PYTHON_TASKS_PER_SLOT
from pulsar_migration.spec import MigrationSpec
from pyspark.sql import SparkSession

WINDOW = Window.parse("2026-11-22T10:00:00Z", "2026-11-22T11:00:00Z")


def ranges(n: int, empty: int = 0) -> list[WindowRange]:
    full = [WindowRange(f"persistent://acme/ns/t{i}", f"ns/t{i}", -1, Position(1, 0), Position(1, 9))
            for i in range(n)]
    return full + [WindowRange(f"persistent://acme/ns/e{i}", f"ns/e{i}", -1, None, None) for i in range(empty)]


def read_tasks(spark: SparkSession, spec_dict: dict[str, Any], window_ranges: list[WindowRange]) -> int:
    return window_frame(spark, MigrationSpec.from_dict(spec_dict), WINDOW, window_ranges).rdd.getNumPartitions()


def test_few_partitions_are_read_in_a_task_each_and_empty_ones_in_none(spark: SparkSession,
                                                                          spec_dict: dict[str, Any]) -> None:
    tasks = spark.sparkContext.defaultParallelism * PYTHON_TASKS_PER_SLOT
    assert read_tasks(spark, spec_dict, ranges(1, empty=5)) == 1
    assert read_tasks(spark, spec_dict, ranges(tasks, empty=5)) == tasks


def test_many_partitions_are_read_in_a_bounded_number_of_tasks(spark: SparkSession,
                                                              spec_dict: dict[str, Any]) -> None:
    tasks = spark.sparkContext.defaultParallelism * PYTHON_TASKS_PER_SLOT
    assert read_tasks(spark, spec_dict, ranges(300, empty=40)) == tasks
