"""cleanup_source's look-up of where the target's copies of the source's first entries are (target_starts), from a
local run dir (pyarrow) and through Spark (the path of a run dir on object storage) alike."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
from pulsar_migration import rundir
from pulsar_migration.cleanup.step import first_copies_from, target_starts
from pulsar_migration.positions import Position
from pulsar_migration.replication import posmap
from pulsar_migration.replication.posmap import MapRow
from pyspark.sql import SparkSession

A, B = "persistent://t/ns/a", "persistent://t/ns/b-partition-1"


def row(topic: str, source: tuple[int, int], target: tuple[int, int]) -> MapRow:
    return MapRow(topic=topic, partition=-1, source_ledger=source[0], source_entry=source[1], source_messages=1,
                  source_batched=False, source_first_chunk=None, target_ledger=target[0], target_entry=target[1],
                  target_messages=1, target_batched=False, target_first_chunk=None, source_publish_time=0,
                  mode="copy")


@pytest.mark.parametrize("through_spark", [False, True])
def test_the_map_gives_each_partitions_start_and_nothing_for_an_unmapped_entry(
        tmp_path: Path, spark: SparkSession, monkeypatch: pytest.MonkeyPatch, through_spark: bool) -> None:
    run_dir = str(tmp_path / "run")
    posmap.append_local(run_dir, [row(A, (10, i), (90, i + 3)) for i in range(5)]
                        + [row(B, (11, i), (91, i)) for i in range(5)])
    posmap.append_local(run_dir, [row(A, (12, 0), (90, 8))])  # a later run's rows, another source ledger
    if through_spark:
        monkeypatch.setattr(rundir, "is_local", lambda uri: False)
    ctx = types.SimpleNamespace(run_dir=run_dir, spark=spark)
    starts = target_starts(ctx, {A: Position(12, 0), B: Position(11, 2), "persistent://t/ns/c": Position(1, 0)})
    assert starts == {A: Position(90, 8), B: Position(91, 2)}
    assert target_starts(ctx, {A: Position(10, 9)}) == {}
    assert target_starts(types.SimpleNamespace(run_dir=str(tmp_path / "none"), spark=spark), {A: Position(10, 0)}) == {}


@pytest.mark.parametrize("through_spark", [False, True])
def test_the_first_copy_the_target_still_holds_is_found_per_partition(
        tmp_path: Path, spark: SparkSession, monkeypatch: pytest.MonkeyPatch, through_spark: bool) -> None:
    run_dir = str(tmp_path / "run")
    posmap.append_local(run_dir, [row(A, (10, i), (90, i)) for i in range(5)]
                        + [row(A, (10, 5 + i), (95, i)) for i in range(3)]  # copied after the target rolled over
                        + [row(B, (11, i), (91, i)) for i in range(5)])
    if through_spark:
        monkeypatch.setattr(rundir, "is_local", lambda uri: False)
    ctx = types.SimpleNamespace(run_dir=run_dir, spark=spark)
    # A holds from its second ledger on (the first trimmed), B from its entry 3; nothing at or after 92:0 is mapped.
    found = first_copies_from(ctx, {A: Position(95, 0), B: Position(91, 3), "persistent://t/ns/c": Position(1, 0)})
    assert found == {A: (Position(10, 5), Position(95, 0)), B: (Position(11, 3), Position(91, 3))}
    assert first_copies_from(ctx, {A: Position(94, 7)}) == {A: (Position(10, 5), Position(95, 0))}
    assert first_copies_from(ctx, {B: Position(92, 0)}) == {}
    assert first_copies_from(ctx, {}) == {}
