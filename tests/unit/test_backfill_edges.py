"""The archive's window edges and the rule for writing a window again (pure logic: the broker's answers are
scripted; the real windows are archived and restored in tests/integration/test_backfill_window.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pulsar_migration.backfill import edges
from pulsar_migration.backfill.step import archive_change
from pulsar_migration.backfill.window import Window
from pulsar_migration.positions import Position
from pulsar_migration.stepjob import StepFailed

TOPIC = "persistent://t/ns/x"
HOUR_MS = 3_600_000
LAST = Position(7, 4)


class ScriptedBroker:
    """A partition of ledgers 5 (entries 0-9) and 7 (the open one, entries 0..last); `first_after` answers the
    `messageid/{timestamp}` lookup as the broker would now."""

    def __init__(self, first_after: dict[int, Position], last: Position = LAST) -> None:
        self.first_after, self.last = first_after, last
        self.asked: list[str] = []

    def topic_path(self, topic: str) -> str:
        return "/persistent/t/ns/x"

    def last_entry(self, topic: str) -> Position | None:
        return self.last

    def get(self, path: str) -> Any:
        self.asked.append(path)
        if path.endswith("/internalStats"):
            return {"ledgers": [{"ledgerId": 5, "entries": 10}, {"ledgerId": 7, "entries": 0}]}
        found = self.first_after[int(path.rsplit("/", 1)[1])]
        return {"ledgerId": found.ledger, "entryId": found.entry}


def test_an_edge_cuts_where_it_was_first_cut_though_the_broker_answers_otherwise_later(tmp_path: Path) -> None:
    """Window [10, 11) ran first and cut the 11:00 edge at 7:2; an entry published at 10:59:59 was stored at 7:3
    after it (a producer re-sending after a reconnect), so the broker's answer for 11:00 is 7:4 an hour later.
    Window [11, 12) still starts at 7:2: the late entry is in it, not between the two windows."""
    eleven = 11 * HOUR_MS
    broker = ScriptedBroker({eleven: Position(7, 2)})
    first = edges.cuts(broker, str(tmp_path), "t", eleven, [TOPIC], concurrency=2, record=True)  # type: ignore[arg-type]
    broker.first_after[eleven] = Position(7, 4)
    later = edges.cuts(broker, str(tmp_path), "t", eleven, [TOPIC], concurrency=2, record=True)  # type: ignore[arg-type]
    assert first == later == {TOPIC: Position(7, 2)}
    recorded = tmp_path / "_edges" / "tenant=t" / edges.edge_name(eleven)
    assert json.loads(recorded.read_text()) == {TOPIC: "7:2"}
    # A dry run finds cuts but records none.
    ten = 10 * HOUR_MS
    broker.first_after[ten] = Position(5, 3)
    edges.cuts(broker, str(tmp_path), "t", ten, [TOPIC], concurrency=2, record=False)  # type: ignore[arg-type]
    assert not (tmp_path / "_edges" / "tenant=t" / edges.edge_name(ten)).exists()


def test_a_window_holds_its_start_cut_up_to_its_end_cut_across_ledgers() -> None:
    broker = ScriptedBroker({})
    at = edges.window_range_at
    assert at(broker, TOPIC, "ns/x", -1, Position(5, 3), Position(7, 2)).first == Position(5, 3)  # type: ignore[arg-type]
    assert at(broker, TOPIC, "ns/x", -1, Position(5, 3), Position(7, 2)).upper == Position(7, 1)  # type: ignore[arg-type]
    # a cut past ledger 5's last entry (the next entry's place when it was cut) starts at ledger 7's first
    assert at(broker, TOPIC, "ns/x", -1, Position(5, 10), Position(7, 9)).first == Position(7, 0)  # type: ignore[arg-type]
    assert at(broker, TOPIC, "ns/x", -1, Position(5, 10), Position(7, 9)).upper == Position(7, 4)  # type: ignore[arg-type]
    # a partition that held nothing when its start was cut: from its first entry
    assert at(broker, TOPIC, "ns/x", -1, edges.BEFORE_EVERYTHING, Position(5, 2)).first == Position(5, 0)  # type: ignore[arg-type]
    assert at(broker, TOPIC, "ns/x", -1, Position(7, 5), Position(7, 9)).empty  # type: ignore[arg-type]


WINDOW = Window.parse("2026-11-22T10:00:00Z", "2026-11-22T11:00:00Z")


def totals(rows: int, digest: str = "1") -> dict[tuple[str, str, int], dict[str, Any]]:
    return {("ns", "x", -1): {"rows": rows, "digest_sum": digest, "last": (5, rows - 1)}}


def test_writing_a_window_again_keeps_what_the_source_no_longer_holds() -> None:
    assert archive_change(WINDOW, totals(10), totals(10)) == "unchanged"
    assert archive_change(WINDOW, totals(6, "0"), totals(10)) == "completed"  # an earlier write cut short
    with pytest.raises(StepFailed, match="10 archived, 7 now"):
        archive_change(WINDOW, totals(10), totals(7, "2"))  # retention took three since the window was archived
    with pytest.raises(StepFailed, match="10 archived, 0 now"):
        archive_change(WINDOW, totals(10), {})  # the topic deleted since


def test_a_window_is_labelled_by_both_edges() -> None:
    assert WINDOW.label == "20261122T100000Z-20261122T110000Z"
    half = Window.parse("2026-11-22T10:00:00Z", "2026-11-22T10:30:00.250Z")
    assert half.label == "20261122T100000Z-20261122T103000.250Z" != WINDOW.label
