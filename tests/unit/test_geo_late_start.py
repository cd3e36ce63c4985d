"""geo.late_start_hint: a partition whose replicator cursor existed before the run (the namespace replicated to the
target before, a topic created while not selected, a cursor removed before replication was on) never gets its first
entries; every re-run failed as "content differs" with no cause named."""

from __future__ import annotations

from pulsar_migration.positions import MessageIdInfo
from pulsar_migration.replication.geo import _Entry, late_start_hint


class Spec:
    target = "cluster-b"


def entries(source_positions: list[int], origins: list[int | None] | None = None) -> list[_Entry]:
    origins = origins if origins is not None else [None] * len(source_positions)
    return [_Entry(MessageIdInfo(5, e), 1, 0, None if o is None else f"5:{o}")
            for e, o in zip(source_positions, origins, strict=True)]


def test_the_first_entries_missing_name_a_replication_that_began_after_them() -> None:
    source = entries(list(range(10)))
    target = entries([0, 1, 2, 3, 4], [5, 6, 7, 8, 9])  # copies of 5:5..5:9 only
    hint = late_start_hint(Spec(), source, target, cursor_passed=True)  # type: ignore[arg-type]
    assert "began after the source's first 5 entries (from 5:0, the first replicated 5:5)" in hint
    assert "replication.mode copy" in hint
    assert "began after the source's first 10 entries" in late_start_hint(
        Spec(), source, [], cursor_passed=True)  # type: ignore[arg-type]


def test_entries_missing_elsewhere_or_nothing_yet_are_not_a_late_start() -> None:
    source = entries(list(range(10)))
    middle = entries([0, 1, 2], [0, 1, 9])  # 5:2..5:8 missing, the first arrived
    assert late_start_hint(Spec(), source, middle, cursor_passed=True) == ""  # type: ignore[arg-type]
    assert late_start_hint(Spec(), source, [], cursor_passed=False) == ""  # type: ignore[arg-type]  # still coming
