"""The driver-side final sync (progress.window) against the Spark translation (progress.translate): on random
maps and cursor states both must find the same lost and duplicated counts, and their plans must leave the
target with the same acknowledged set (pure logic: a local Spark session and pandas, no Pulsar)."""

from __future__ import annotations

import random

import pandas as pd
import pytest
from pulsar_migration.positions import Position
from pulsar_migration.progress import translate, window
from pulsar_migration.progress.cursors import CursorState
from pulsar_migration.replication.posmap import MAP_SCHEMA
from pyspark.sql import SparkSession

TOPIC = "persistent://t/ns/x"


def random_map(rng: random.Random) -> list[tuple[Position, Position, int]]:
    """(source, target, messages) per entry: two source ledgers with gaps (markers), target entries 1:1 in
    order over two ledgers of their own."""
    rows, target_ledger, target_entry = [], 50, 0
    for ledger in (10, 11):
        for entry in range(rng.randint(3, 25)):
            if rng.random() < 0.1:
                continue  # a marker: stored on the source, not copied
            if target_entry > 15 and target_ledger == 50 and rng.random() < 0.2:
                target_ledger, target_entry = 51, 0
            rows.append((Position(ledger, entry), Position(target_ledger, target_entry), rng.randint(1, 3)))
            target_entry += 1
    return rows


def random_state(rng: random.Random, sub: str, positions: list[Position]) -> CursorState:
    """A markDelete somewhere (or before everything) and random individually acked runs after it."""
    from pulsar_migration.positions import AckRange

    md_index = rng.randint(-1, len(positions) - 1)
    mark_delete = positions[md_index] if md_index >= 0 else Position(positions[0].ledger, -1)
    ranges, i = [], md_index + 2
    while i < len(positions):
        if rng.random() < 0.4:
            start, end = positions[i], positions[i]
            while i + 1 < len(positions) and positions[i + 1].ledger == start.ledger and rng.random() < 0.6:
                i += 1
                end = positions[i]
            ranges.append(AckRange(Position(start.ledger, start.entry - 1), end))
            i += 2
        else:
            i += 1
    return CursorState(TOPIC, sub, mark_delete, tuple(ranges), "Shared", 0, 0, 0)


def spark_view(spark: SparkSession, rows: list[tuple[Position, Position, int]], pairs: list[tuple[CursorState,
               CursorState]]) -> dict[str, tuple[dict[str, int], set[Position]]]:
    """Per subscription: the Spark verdict and the target's acknowledged set after its plan (one Spark pass
    for all subscriptions: each costs seconds otherwise)."""
    data = [(TOPIC, -1, s.ledger, s.entry, n, False, None, t.ledger, t.entry, n, False, None, 0, "copy")
            for s, t, n in rows]
    position_map = spark.createDataFrame(data, MAP_SCHEMA)
    src_cursors, src_ranges = translate.cursor_frames(spark, [src for src, _ in pairs])
    tgt_cursors, tgt_ranges = translate.cursor_frames(spark, [tgt for _, tgt in pairs])
    source_marked = translate.mark_acked(position_map, src_cursors, translate.acked_entries(src_ranges), "source")
    target_marked = translate.mark_acked(position_map, tgt_cursors, translate.acked_entries(tgt_ranges), "target")
    verdicts = {r.subscription: {"lost": r.lost, "duplicated": r.duplicated}
                for r in translate.compare(src_cursors, source_marked, target_marked, tgt_cursors).collect()}
    plan, acks = translate.target_plan(source_marked)
    ack_rows = acks.collect()
    out = {}
    for p in plan.collect():
        reset = Position(p.reset_ledger, p.reset_entry)
        acked = {t for _, t, _ in rows if t < reset or (p.excluded and t == reset)}
        acked |= {Position(a.ledger, a.entry) for a in ack_rows if a.subscription == p.subscription}
        out[p.subscription] = (verdicts[p.subscription], acked)
    return out


def window_view(rows: list[tuple[Position, Position, int]], src: CursorState,
                tgt: CursorState) -> tuple[dict[str, int], set[Position]]:
    frame = pd.DataFrame([{"topic": TOPIC, "source_ledger": s.ledger, "source_entry": s.entry, "source_messages": n,
                           "source_first_chunk": None, "target_ledger": t.ledger, "target_entry": t.entry,
                           "target_messages": n, "target_first_chunk": None} for s, t, n in rows])
    tail = window.window(frame, [src], [tgt])
    verdict = window.judge(tail, src, tgt)
    in_window = {r.target for r in tail}
    acked = {t for s, t, _ in rows if t not in in_window and s <= src.mark_delete}  # before the window: acked
    if tail:
        plan, acks = window.plan(tail, src)
        reset = Position(plan.reset_ledger, plan.reset_entry)
        acked |= {r.target for r in tail if r.target < reset or (plan.excluded and r.target == reset)}
        acked |= {Position(ledger, entry) for ledger, entry in acks}
    else:
        acked = {t for _, t, _ in rows}
    return {"lost": verdict.lost, "duplicated": verdict.duplicated}, acked


def test_window_and_spark_agree_on_verdict_and_plan(spark: SparkSession) -> None:
    rng = random.Random(7)
    rows = random_map(rng)
    pairs = [(random_state(rng, f"s{i}", [s for s, _, _ in rows]), random_state(rng, f"s{i}", [t for _, t, _ in rows]))
             for i in range(40)]
    by_spark = spark_view(spark, rows, pairs)
    assert len(by_spark) == len(pairs)
    for src, tgt in pairs:
        window_verdict, window_acked = window_view(rows, src, tgt)
        assert (window_verdict, window_acked) == by_spark[src.subscription], src.subscription
        # and the plan is what the source acknowledges, translated: the sync is exact
        assert window_acked == {t for s, t, _ in rows if window.acked(src, [s])[0]}
    assert any(v[0]["lost"] for v in by_spark.values()) and any(v[0]["duplicated"] for v in by_spark.values())


def test_window_declines_chunks_and_far_behind_consumers(monkeypatch: pytest.MonkeyPatch) -> None:
    frame = pd.DataFrame([{"topic": TOPIC, "source_ledger": 10, "source_entry": e, "source_messages": 1,
                           "source_first_chunk": "10:0" if e == 1 else None, "target_ledger": 50, "target_entry": e,
                           "target_messages": 1, "target_first_chunk": None} for e in range(3)])
    start = CursorState(TOPIC, "s", Position(10, -1), (), "Shared", 0, 0, 0)
    target = CursorState(TOPIC, "s", Position(50, -1), (), "Shared", 0, 0, 0)
    with pytest.raises(window.Declined, match="chunked"):
        window.window(frame, [start], [target])
    monkeypatch.setattr(window, "WINDOW_LIMIT", 1)
    with pytest.raises(window.Declined, match="over 1"):
        window.window(frame.assign(source_first_chunk=None), [start], [target])
