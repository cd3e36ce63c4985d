"""switch.geo_dedup: only producers that stored entries on the source since a mark taken before the hold are judged
by the target-dedup check. A producer connected through the switch but idle since then got its receipts before the
hold; the target's dedup, whose last snapshot hid its older entry from the reload's replay, knows less of it, and
the check refused the flip on every retry (a geo rollback of a tenant with a low-rate producer was impossible)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pulsar_migration.positions import Position
from pulsar_migration.switch import geo_dedup
from pulsar_migration.switch.geo_dedup import TargetDedupBehind, record_marks, source_marks, teach_target

T, U = "persistent://acme/ns/t", "persistent://acme/ns/u"
SOURCE: Any = object()  # the source's admin (producers_since is scripted here)


class Spec:
    source_cluster = "source"
    target_cluster = "target"


def known(monkeypatch: pytest.MonkeyPatch, source: dict[tuple[str, str], int], target: dict[tuple[str, str], int],
          sent_since: dict[str, set[str]]) -> list[tuple[str, Position | None]]:
    read: list[tuple[str, Position | None]] = []
    monkeypatch.setattr(geo_dedup, "reload_with_dedup", lambda admin, partitions: None)
    monkeypatch.setattr(geo_dedup, "last_sequence_ids",
                        lambda cluster, pairs: {p: (source if cluster == "source" else target)[p] for p in pairs})

    def since(cluster: Any, admin: Any, topic: str, mark: Position | None) -> set[str]:
        read.append((topic, mark))
        return sent_since[topic]

    monkeypatch.setattr(geo_dedup, "producers_since", since)
    return read


def test_a_producer_idle_since_the_mark_is_not_refused_one_that_sent_is(monkeypatch: pytest.MonkeyPatch) -> None:
    producers = {T: ["busy", "idle"], U: ["other"]}
    source = {(T, "busy"): 50, (T, "idle"): 41, (U, "other"): 7}
    marks = {T: Position(5, 3), U: Position(6, 0)}
    read = known(monkeypatch, source, {(T, "busy"): 50, (T, "idle"): -1, (U, "other"): 7}, {T: {"busy"}})
    checked = teach_target(Spec(), None, producers, marks, SOURCE)  # type: ignore[arg-type]
    assert checked["idle_since_mark_behind"] == 1 and checked["producers"] == 3
    assert read == [(T, Position(5, 3))]  # only partitions with a producer behind are read
    # The same without marks (the old rule): the idle producer refuses the flip.
    known(monkeypatch, source, {(T, "busy"): 50, (T, "idle"): -1, (U, "other"): 7}, {T: {"busy"}})
    with pytest.raises(TargetDedupBehind, match=r"knows producer idle on .* up to sequence id -1, the source's up "
                                                r"to 41"):
        teach_target(Spec(), None, producers)  # type: ignore[arg-type]
    # A producer that stored entries since the mark and that the target knows less of is refused.
    known(monkeypatch, source, {(T, "busy"): 49, (T, "idle"): 41, (U, "other"): 7}, {T: {"busy"}})
    with pytest.raises(TargetDedupBehind, match="knows producer busy on"):
        teach_target(Spec(), None, producers, marks, SOURCE)  # type: ignore[arg-type]
    # A partition without a mark is judged whole.
    known(monkeypatch, source, {(T, "busy"): 50, (T, "idle"): -1, (U, "other"): 7}, {T: set()})
    with pytest.raises(TargetDedupBehind, match="knows producer idle"):
        teach_target(Spec(), None, producers, {U: Position(6, 0)}, SOURCE)  # type: ignore[arg-type]


class LastEntries:
    def __init__(self, last: dict[str, Position | None]) -> None:
        self.last = last

    def last_entry(self, topic: str) -> Position | None:
        return self.last[topic]


def test_an_earlier_fenced_attempts_mark_is_kept_where_it_is_earlier(tmp_path: Path) -> None:
    run_dir = str(tmp_path)
    now = LastEntries({T: Position(9, 0), U: Position(9, 5)})
    first = source_marks(run_dir, now, [T, U])  # type: ignore[arg-type]
    assert first == {T: Position(9, 0), U: Position(9, 5)}
    record_marks(run_dir, {T: Position(7, 2), U: None})  # an attempt fenced earlier: U was empty then
    later = LastEntries({T: Position(9, 9), U: Position(9, 9)})
    assert source_marks(run_dir, later, [T, U]) == {T: Position(7, 2), U: None}  # type: ignore[arg-type]


def test_a_producer_whose_chunked_message_straddles_the_mark_is_found() -> None:
    """A reader started at the mark drops a chunked message whose first chunk lies before it: its producer, with no
    other entry since, was taken for idle. The entries the reader passed over are looked up for their producers."""
    from tests.unit.test_reader_restart_chunks import LEDGER, Topic, chunks

    class Source(Topic):
        name = "cluster-a"

        def pulsar_client(self, **_: Any) -> Topic:
            return self

        def last_entry(self, topic: str) -> Position:
            return Position(LEDGER, len(self.entries) - 1)

        def close(self) -> None:
            pass

    source = Source(["a", *chunks("S", 3, range(2)), "b@other", *chunks("S", 3, range(2, 3)), "c@other"])
    mark = Position(LEDGER, 2)  # after S's first two chunks
    found = geo_dedup.producers_since(source, source, "t", mark)  # type: ignore[arg-type]
    assert found == {"other", "p-S"}  # p-S: the chunked message's producer, from its last chunk's headers
    assert geo_dedup.producers_since(source, source, "t", Position(LEDGER, 5)) == set()  # nothing since
