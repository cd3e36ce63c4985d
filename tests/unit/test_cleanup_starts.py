"""cleanup_source's look-ups in the position map (where the target's copies of the source's first messages begin,
the first copy a trimmed target still holds), from a local run dir (pyarrow) and through Spark (the path of a run
dir on object storage) alike; and what it accepts of a target that trimmed copies (trimmed_on_target)."""

from __future__ import annotations

import re
import types
from pathlib import Path
from typing import Any

import pytest
from pulsar_migration import rundir
from pulsar_migration.cleanup.step import (
    CleanupError,
    SourceRange,
    first_copies_from,
    last_copies_before,
    target_starts,
    trimmed_on_target,
)
from pulsar_migration.positions import Position
from pulsar_migration.replication import posmap
from pulsar_migration.replication.content import ContentHash
from pulsar_migration.replication.partition import COPY_SOURCE_PROPERTY, COPY_TARGET_PROPERTY
from pulsar_migration.replication.posmap import MapRow
from pulsar_migration.report import StepReport
from pyspark.sql import SparkSession

A, B = "persistent://t/ns/a", "persistent://t/ns/b-partition-1"


def row(topic: str, source: tuple[int, int], target: tuple[int, int], chunks: tuple[str, str] | None = None
        ) -> MapRow:
    """A map row; `chunks`: a chunked message's first chunks (source, target), the row keyed by its last."""
    return MapRow(topic=topic, partition=-1, source_ledger=source[0], source_entry=source[1], source_messages=1,
                  source_batched=False, source_first_chunk=chunks[0] if chunks else None, target_ledger=target[0],
                  target_entry=target[1], target_messages=1, target_batched=False,
                  target_first_chunk=chunks[1] if chunks else None, source_publish_time=0, mode="copy")


@pytest.mark.parametrize("through_spark", [False, True])
def test_the_map_gives_each_partitions_start_and_nothing_for_an_unmapped_entry(
        tmp_path: Path, spark: SparkSession, monkeypatch: pytest.MonkeyPatch, through_spark: bool) -> None:
    run_dir = str(tmp_path / "run")
    posmap.append_local(run_dir, [row(A, (10, i), (90, i + 3)) for i in range(5)]
                        + [row(B, (11, i), (91, i)) for i in range(5)])
    posmap.append_local(run_dir, [row(A, (12, 0), (90, 8))])  # a later run's rows, another source ledger
    posmap.append_local(run_dir, [row(A, (13, 2), (97, 2), ("13:0", "97:0"))])
    if through_spark:
        monkeypatch.setattr(rundir, "is_local", lambda uri: False)
    ctx = types.SimpleNamespace(run_dir=run_dir, spark=spark)
    starts = target_starts(ctx, {A: Position(12, 0), B: Position(11, 2), "persistent://t/ns/c": Position(1, 0)})
    assert starts == {A: Position(90, 8), B: Position(91, 2)}
    assert target_starts(ctx, {A: Position(10, 9)}) == {}
    # A chunked message: keyed by its last chunk, its copy begins at the target's first chunk.
    assert target_starts(ctx, {A: Position(13, 2)}) == {A: Position(97, 0)}
    assert first_copies_from(ctx, {A: Position(97, 0)}) == {A: (Position(13, 0), Position(97, 0))}
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
    # ... and the last copy before it (gone with the trimmed ledgers): the one the subscriptions must be past
    assert last_copies_before(ctx, {A: Position(95, 0), B: Position(91, 3), "persistent://t/ns/c": Position(1, 0)}
                              ) == {A: Position(90, 4), B: Position(91, 2)}
    assert last_copies_before(ctx, {B: Position(91, 0)}) == {}


class TargetAdmin:
    """A target partition's properties and cursors, as the admin API answers them."""

    def __init__(self, properties: dict[str, str], cursors: dict[str, str]) -> None:
        self.answers = {"properties": properties,
                        "internalStats": {"cursors": {n: {"markDeletePosition": p} for n, p in cursors.items()}}}

    def topic_path(self, topic: str) -> str:
        return "/persistent/t/ns/a"

    def get(self, path: str) -> Any:
        return self.answers[path.rsplit("/", 1)[-1]]


UPPER = Position(10, 9)
LAST_LOST = Position(90, 9)


def trimmed(admin: TargetAdmin, cut: tuple[Position, Position] | None, map_end: Position | None,
            last_lost: Position | None = LAST_LOST) -> tuple[Any, Any, list[Position]]:
    """trimmed_on_target for a source of 10 messages at 10:0-10:9 whose copies 90:0-90:9 are gone."""
    report = StepReport(step="cleanup_source", tenant="t", source="a", target="b", spec_hash="x")
    content = ContentHash(messages=10)
    asked: list[Position] = []

    def read_from(at: Position) -> SourceRange:
        asked.append(at)
        return SourceRange(ContentHash(messages=4), at, UPPER)

    source, start = trimmed_on_target(types.SimpleNamespace(report=report), admin, A,
                                      SourceRange(content, Position(10, 0), UPPER), Position(90, 0),
                                      Position(91, 0), cut, map_end, last_lost, read_from)
    return (source.messages, start, report.counts.get("messages_trimmed_on_target")), report, asked


MARKED = {COPY_TARGET_PROPERTY: "a"}


def test_copies_the_target_trimmed_are_counted_and_the_rest_compared_from_the_first_one_left() -> None:
    consumed = {"sub": "91:0", "pulsar.dedup": "90:9"}
    found, _, asked = trimmed(TargetAdmin(MARKED, consumed), (Position(10, 6), Position(91, 0)), Position(10, 9))
    assert found == (4, Position(91, 0), 6) and asked == [Position(10, 6)]
    # Every copy gone, and the source holds nothing after the map's end: all counted, nothing left to compare.
    found, _, asked = trimmed(TargetAdmin({COPY_SOURCE_PROPERTY: "b"}, consumed), None, Position(10, 9))
    assert found == (0, None, 10) and asked == []


@pytest.mark.parametrize(("properties", "cursors", "cut", "map_end", "says"), [
    ({}, {}, None, Position(10, 9), "lacks the pulsar-migration.copy-target mark"),
    (MARKED, {"sub": "89:3"}, None, Position(10, 9), "subscription sub there did not consume them"),
    # inside the copies gone: it never read 90:3-90:9 (lost there, not consumed)
    (MARKED, {"sub": "90:2", "other": "90:9"}, None, Position(10, 9), "subscription sub there did not consume them"),
    (MARKED, {}, None, Position(10, 7), "holds entries after the position map's end 10:7 (up to 10:9): never copied"),
    (MARKED, {}, None, None, "after the position map's end None"),
])
def test_a_target_that_lost_copies_it_cannot_account_for_is_refused(
        properties: dict[str, str], cursors: dict[str, str], cut: Any, map_end: Position | None, says: str) -> None:
    with pytest.raises(CleanupError, match=re.escape(says)):
        trimmed(TargetAdmin(properties, cursors), cut, map_end)
