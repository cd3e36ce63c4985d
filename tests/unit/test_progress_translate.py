"""Cursor-state parsing and the Spark translation of acknowledged sets through a position map (pure logic, a
local Spark session, no Pulsar)."""

from __future__ import annotations

import pytest
from pulsar_migration.positions import AckRange, Position, PositionError, parse_ack_ranges
from pulsar_migration.progress import translate
from pulsar_migration.progress.cursors import CursorState, cursor_state, is_system_cursor
from pulsar_migration.replication.posmap import MAP_SCHEMA
from pyspark.sql import DataFrame, SparkSession

TOPIC = "persistent://t/ns/x"


def test_ack_ranges_parse_tolerantly() -> None:
    assert parse_ack_ranges("[]") == [] == parse_ack_ranges("") == parse_ack_ranges(None)
    ranges = parse_ack_ranges("[(3:5..3:7], (4:-1..4:2],(4:9..4:10]]")
    assert ranges == [AckRange(Position(3, 5), Position(3, 7)), AckRange(Position(4, -1), Position(4, 2)),
                      AckRange(Position(4, 9), Position(4, 10))]
    assert list(ranges[1].entries) == [0, 1, 2] and Position(3, 5) not in ranges[0] and Position(3, 7) in ranges[0]
    for bad in ("[(3:5..4:7]]", "[(3:5-3:7]]", "[(3:7..3:5]]", "[3:5..3:7]"):
        with pytest.raises(PositionError):
            parse_ack_ranges(bad)


def test_system_cursors_are_skipped() -> None:
    assert all(is_system_cursor(n) for n in ("pulsar.repl.cluster-b", "pulsar.dedup", "__compaction"))
    assert not any(is_system_cursor(n) for n in ("orders", "__compaction-audit", "pulsar.dedup-check"))
    state = cursor_state(TOPIC, "s", {"markDeletePosition": "3:4", "individuallyDeletedMessages": "[(3:5..3:6]]"},
                         {"type": "Shared", "consumers": [{}], "msgBacklog": 9}, 1)
    assert state.mark_delete == Position(3, 4) and state.acked_after_mark_delete == 1 and state.consumers == 1


def map_frame(spark: SparkSession, rows: list[tuple[tuple[int, int], tuple[int, int], str | None, str | None]]
              ) -> DataFrame:
    """Map rows from ((source L, E), (target L, E), source first chunk, target first chunk)."""
    data = [(TOPIC, -1, s[0], s[1], 1, False, sf, t[0], t[1], 1, False, tf, 0, "copy") for s, t, sf, tf in rows]
    return spark.createDataFrame(data, MAP_SCHEMA)


def state(sub: str, mark_delete: str, ranges: str) -> CursorState:
    return cursor_state(TOPIC, sub, {"markDeletePosition": mark_delete, "individuallyDeletedMessages": ranges},
                        {"type": "Shared"}, 0)


# source ledger 10 entries 0..9 (entry 4 is a marker: not in the map; 7..8 one chunked message) -> target 50
MAP_ROWS = [((10, e), (50, t), None, None) for e, t in ((0, 0), (1, 1), (2, 2), (3, 3), (5, 4), (6, 5))] + [
    ((10, 8), (50, 7), "10:7", "50:6"), ((10, 9), (50, 8), None, None)]


def marked(spark: SparkSession, states: list[CursorState], side: str = "source") -> DataFrame:
    cursors, ranges = translate.cursor_frames(spark, states)
    return translate.mark_acked(map_frame(spark, MAP_ROWS), cursors, translate.acked_entries(ranges), side)


def acked_targets(frame: DataFrame, sub: str) -> list[int]:
    return sorted(r.target_entry for r in frame.where(f"subscription = '{sub}' and acked").collect())


def test_acked_sets_translate_per_entry_with_markers_and_chunks(spark: SparkSession) -> None:
    states = [state("md-only", "10:2", "[]"),
              state("holes", "10:1", "[(10:2..10:3],(10:5..10:6],(10:8..10:9]]"),  # chunk's first chunk unacked
              state("chunk", "10:-1", "[(10:6..10:8]]"),
              # markDelete on the first chunk (a cumulative ack between chunks): the message is never assembled
              state("md-first-chunk", "10:7", "[]"),
              state("none", "9:99", "[]")]
    frame = marked(spark, states)
    assert acked_targets(frame, "md-only") == [0, 1, 2]
    assert acked_targets(frame, "holes") == [0, 1, 3, 5, 8]
    assert acked_targets(frame, "chunk") == [7]
    assert acked_targets(frame, "md-first-chunk") == [0, 1, 2, 3, 4, 5, 7]
    assert acked_targets(frame, "none") == []


def test_plan_resets_to_the_acked_prefix_then_acks_the_rest(spark: SparkSession) -> None:
    states = [state("holes", "10:3", "[(10:5..10:6],(10:6..10:8]]"),  # 10:4 marker: prefix runs through it
              state("first-unacked", "9:99", "[(10:1..10:2]]"),
              state("all", "10:9", "[]")]
    plan, acks = translate.target_plan(marked(spark, states))
    plans = {r.subscription: (r.reset_ledger, r.reset_entry, r.excluded, r.individual_acks) for r in plan.collect()}
    assert plans["holes"] == (50, 3, True, 2)  # target 50:4 (source 10:5) unacked; 50:5 and the chunk acked
    assert plans["first-unacked"] == (50, 0, False, 1)
    assert plans["all"] == (50, 8, True, 0)
    entries = sorted((r.subscription, r.entry) for r in acks.collect())
    assert entries == [("first-unacked", 2), ("holes", 5), ("holes", 6), ("holes", 7)]  # the chunk: both entries


def test_compare_counts_lost_and_duplicated_messages(spark: SparkSession) -> None:
    source_states = [state("s", "10:1", "[(10:5..10:6]]"), state("missing", "10:9", "[]")]
    target_states = [cursor_state(TOPIC, "s", {"markDeletePosition": "50:2", "individuallyDeletedMessages": "[]"},
                                  {"type": "Shared", "msgBacklog": 6}, 0)]
    src = marked(spark, source_states)
    tgt = marked(spark, target_states, side="target")
    src_cursors, _ = translate.cursor_frames(spark, source_states)
    tgt_cursors, _ = translate.cursor_frames(spark, target_states)
    rows = {r.subscription: r for r in translate.compare(src_cursors, src, tgt, tgt_cursors).collect()}
    s = rows["s"]
    assert (s.mapped_entries, s.source_acked_entries, s.target_acked_entries) == (8, 3, 3)
    assert (s.lost, s.duplicated, s.first_difference) == (1, 1, "50:2")  # target 50:2 acked only there, 50:5 reverse
    assert (s.source_backlog, s.target_backlog, s.on_target) == (5, 5, True)
    assert s.source_digest != s.target_digest
    assert rows["missing"].on_target is False and rows["missing"].duplicated == 8


# Geo-replication keeps the source's entry order, so a chunked message's chunks may interleave with other producers'
# entries: (message, its entries in order; the last one is the map's row, the first its first chunk).
INTERLEAVED = {
    "persistent://t/ns/a-b-a-c": {"A": [0, 2], "B": [1], "C": [3]},
    "persistent://t/ns/d-a-a-d-b": {"D": [0, 3], "A": [1, 2], "B": [4]},
    "persistent://t/ns/a-b-a-b-a-c": {"A": [0, 2, 4], "B": [1, 3], "C": [5]},
}


def test_every_acked_subset_of_interleaved_chunked_messages_is_carried_exactly(spark: SparkSession) -> None:
    """For each topic and each subset of its messages a consumer acknowledged at the source (one subscription per
    subset), the plan applied as the broker applies it (the reset, then each individual ack past the markDelete)
    leaves the target acknowledging exactly those messages. Before, the reset covered an unacknowledged message's
    first chunk when an acknowledged entry came before its last (A acked-or-not with B acked lost A), and acking a
    chunked message acknowledged every entry between its chunks (A acked with B not: B lost)."""
    from itertools import combinations

    rows, states = [], []
    for topic, messages in INTERLEAVED.items():
        for entries in messages.values():
            first = f"{entries[0]}" if len(entries) > 1 else None
            rows.append((topic, -1, 10, entries[-1], 1, False, first and f"10:{first}", 50, entries[-1], 1, False,
                         first and f"50:{first}", 0, "geo"))
        names = sorted(messages)
        for subset in (c for n in range(len(names) + 1) for c in combinations(names, n)):
            ranges = ",".join(f"(10:{e - 1}..10:{e}]" for name in subset for e in messages[name])
            states.append(cursor_state(topic, "+".join(subset) or "none",
                                       {"markDeletePosition": "10:-1", "individuallyDeletedMessages": f"[{ranges}]"},
                                       {"type": "Shared"}, 0))
    position_map = spark.createDataFrame(rows, MAP_SCHEMA)
    cursors, ranges = translate.cursor_frames(spark, states)
    source = translate.mark_acked(position_map, cursors, translate.acked_entries(ranges), "source")
    plan, acks = translate.target_plan(source)
    acked_after: dict[tuple[str, str], list[int]] = {}
    for a in acks.collect():
        acked_after.setdefault((a.topic, a.subscription), []).append(a.entry)
    target_states = []
    for p in plan.collect():
        mark_delete = p.reset_entry if p.excluded else p.reset_entry - 1
        ranges = ",".join(f"(50:{e - 1}..50:{e}]" for e in sorted(acked_after.get((p.topic, p.subscription), []))
                          if e > mark_delete)
        target_states.append(cursor_state(p.topic, p.subscription, {
            "markDeletePosition": f"{p.reset_ledger}:{mark_delete}", "individuallyDeletedMessages": f"[{ranges}]"},
            {"type": "Shared"}, 0))
    target_cursors, target_ranges = translate.cursor_frames(spark, target_states)
    target = translate.mark_acked(position_map, target_cursors, translate.acked_entries(target_ranges), "target")
    wrong = [(r.topic.rsplit("/", 1)[-1], r.subscription, r.lost, r.duplicated, r.first_difference)
             for r in translate.compare(cursors, source, target, target_cursors).collect()
             if r.lost or r.duplicated or not r.on_target]
    assert len(target_states) == len(states) == 8 + 8 + 8
    assert wrong == [], wrong
