"""How replicate_topics spreads a tenant's partitions over Spark tasks and engine processes: a task or process per
partition while they are few, bounded by the slots when they are many (each start costs clients or a JVM)."""

from __future__ import annotations

from pulsar_migration.positions import Position
from pulsar_migration.replication.partition import PartitionJob
from pulsar_migration.replication.step import (
    ENGINE_PARTITIONS_PER_PROCESS,
    PYTHON_TASKS_PER_SLOT,
    engine_processes,
    task_caps,
    task_groups,
)
from pulsar_migration.throttle import Caps


def jobs(n: int) -> list[PartitionJob]:
    return [PartitionJob(f"persistent://t/ns/x-partition-{i}", "ns/x", i, Position(1, i), None) for i in range(n)]


def test_few_partitions_get_a_task_each() -> None:
    few = jobs(PYTHON_TASKS_PER_SLOT * 2)
    assert task_groups(few, 2) == [[job] for job in few]
    assert task_groups([], 2) == []


def test_many_partitions_are_dealt_round_robin_into_a_bounded_number_of_tasks() -> None:
    many = jobs(1214)
    groups = task_groups(many, 2)
    assert len(groups) == 2 * PYTHON_TASKS_PER_SLOT
    assert sorted(j.topic for g in groups for j in g) == sorted(j.topic for j in many)  # each exactly once
    assert max(map(len, groups)) - min(map(len, groups)) <= 1
    assert [j.partition for j in groups[1][:3]] == [1, 1 + len(groups), 1 + 2 * len(groups)]  # neighbours apart


def test_engine_processes_grow_with_partitions_up_to_the_slots() -> None:
    assert engine_processes(1, 8) == 1
    assert engine_processes(ENGINE_PARTITIONS_PER_PROCESS, 8) == 1
    assert engine_processes(ENGINE_PARTITIONS_PER_PROCESS + 1, 8) == 2
    assert engine_processes(1214, 2) == 2  # was 38 processes on 2 slots
    assert engine_processes(1214, 64) == 38
    assert engine_processes(5, 0) == 1


def test_a_cap_is_shared_by_the_tasks_that_run_at_once() -> None:
    caps = Caps(8e6, 1000)
    assert task_caps(caps, 1, 2) == Caps(8e6, 1000)  # one task: it gets the whole cap
    assert task_caps(caps, 2, 2) == Caps(4e6, 500)
    assert task_caps(caps, 4 * PYTHON_TASKS_PER_SLOT, 2) == Caps(4e6, 500)  # queued tasks wait for a slot
    assert task_caps(Caps(), 3, 2) == Caps()
