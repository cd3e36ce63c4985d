"""Property-based tests (hypothesis) of position, range and message-id parsing and of the cursor translation.

The judges are independent of the code under test where one exists: the Python client's own MessageId
serialization, Python's tuple order, and a brute-force "which entries are acknowledged" model.
"""

from __future__ import annotations

import pulsar
from hypothesis import given, settings
from hypothesis import strategies as st
from pulsar_migration.positions import (
    MAX_ENTRY,
    MAX_LEDGER,
    AckRange,
    Position,
    PositionError,
    SourceTag,
    parse_ack_ranges,
    parse_message_id_data,
    position_of_sequence_id,
    sequence_id,
)
from pulsar_migration.progress.cursors import CursorState
from pulsar_migration.progress.window import Row, acked, judge, plan

ledgers = st.integers(min_value=0, max_value=MAX_LEDGER)
entries = st.integers(min_value=0, max_value=MAX_ENTRY)
positions = st.builds(Position, ledgers, entries)
any_positions = st.builds(Position, st.integers(-1, 2**62), st.integers(-1, 2**62))
settings.register_profile("project", max_examples=300, deadline=None)
settings.load_profile("project")


@given(any_positions, any_positions)
def test_position_text_round_trips_and_orders_like_its_tuple(p: Position, q: Position) -> None:
    assert Position.parse(str(p)) == p
    assert (p < q) == ((p.ledger, p.entry) < (q.ledger, q.entry))


@given(st.text(max_size=30))
def test_position_parse_accepts_or_raises_position_error(text: str) -> None:
    try:
        Position.parse(text)
    except PositionError:
        pass


@given(positions, positions)
def test_sequence_ids_round_trip_are_positive_and_keep_order(p: Position, q: Position) -> None:
    assert position_of_sequence_id(sequence_id(p)) == p
    assert sequence_id(p) >= 1 and sequence_id(p) < 2**63
    assert (p < q) == (sequence_id(p) < sequence_id(q))


@given(st.one_of(st.builds(Position, st.integers(MAX_LEDGER + 1, 2**62), entries),
                 st.builds(Position, ledgers, st.integers(MAX_ENTRY + 1, 2**40)),
                 st.builds(Position, st.integers(-(2**40), -1), entries)))
def test_positions_outside_the_sequence_encoding_are_refused(p: Position) -> None:
    try:
        sequence_id(p)
    except PositionError:
        return
    raise AssertionError(f"{p} was encoded")


@given(positions, st.integers(-1, 10_000), st.integers(0, 10_000), st.none() | positions)
def test_source_tags_round_trip(p: Position, index: int, size: int, first: Position | None) -> None:
    tag = SourceTag(p, index, size, first)
    assert SourceTag.decode(tag.encode()) == tag


@given(st.text(alphabet="0123456789:-x ", max_size=40))
def test_source_tag_decode_accepts_or_raises_position_error(text: str) -> None:
    try:
        SourceTag.decode(text)
    except PositionError:
        pass


@given(st.integers(0, 2**31 - 1), st.integers(0, 2**40), st.integers(-1, 2**20), st.integers(-1, 10_000))
def test_message_ids_parse_like_the_python_client_serialises_them(partition: int, ledger: int, entry: int,
                                                                  batch_index: int) -> None:
    message_id = pulsar.MessageId(partition, ledger, entry, batch_index)
    info = parse_message_id_data(message_id.serialize())
    assert (info.ledger, info.entry) == (message_id.ledger_id(), message_id.entry_id())
    assert info.partition == message_id.partition() and info.batch_index == message_id.batch_index()


@given(st.binary(max_size=64))
def test_arbitrary_bytes_parse_or_raise_position_error(data: bytes) -> None:
    try:
        parse_message_id_data(data)
    except PositionError:
        pass


@st.composite
def ack_range_lists(draw: st.DrawFn) -> list[AckRange]:
    """Disjoint, non-adjacent ranges within ledgers, in order, as a broker lists them."""
    out: list[AckRange] = []
    for ledger in sorted(draw(st.sets(st.integers(0, 10**6), max_size=4))):
        edges = sorted(draw(st.sets(st.integers(-1, 500), max_size=8)))
        for lower, upper in zip(edges[::2], edges[1::2], strict=False):
            out.append(AckRange(Position(ledger, lower), Position(ledger, upper)))
    return out


@given(ack_range_lists(), st.sampled_from(["", " "]), st.sampled_from([",", ", "]))
def test_ack_ranges_round_trip_the_brokers_format(ranges: list[AckRange], pad: str, sep: str) -> None:
    text = "[" + sep.join(f"({r.lower}..{pad}{r.upper}]" for r in ranges) + "]"
    assert parse_ack_ranges(text) == ranges
    for r in ranges:
        assert list(r.entries) == list(range(r.lower.entry + 1, r.upper.entry + 1))
        assert Position(r.lower.ledger, r.upper.entry) in r and Position(r.lower.ledger, r.lower.entry) not in r


@given(st.text(alphabet="[](),.:-0123456789 ", max_size=40))
def test_ack_range_parse_accepts_or_raises_position_error(text: str) -> None:
    try:
        parse_ack_ranges(text)
    except PositionError:
        pass


@st.composite
def mapped_cursor(draw: st.DrawFn) -> tuple[list[Row], CursorState, CursorState]:
    """A partition's position map (source entries 1:1 onto target entries of other ledgers, both increasing),
    a source cursor with any markDelete and individually acknowledged entries, and an arbitrary target cursor."""
    n = draw(st.integers(1, 40))
    src_ledger, tgt_ledger = draw(st.integers(1, 1000)), draw(st.integers(1001, 2000))
    src_entries = sorted(draw(st.sets(st.integers(0, 200), min_size=n, max_size=n)))
    tgt_start = draw(st.integers(0, 50))
    rows = [Row(Position(src_ledger, e), Position(tgt_ledger, tgt_start + i), draw(st.integers(1, 5)), 1)
            for i, e in enumerate(src_entries)]

    def cursor(ledger: int, candidates: list[int]) -> CursorState:
        md = draw(st.integers(-1, max(candidates) + 1))
        later = sorted(e for e in draw(st.sets(st.sampled_from(candidates))) if e > md + 1)
        ranges = []
        for e in later:  # one range per acknowledged entry, merging neighbours as the broker does
            if ranges and ranges[-1].upper.entry == e - 1:
                ranges[-1] = AckRange(ranges[-1].lower, Position(ledger, e))
            else:
                ranges.append(AckRange(Position(ledger, e - 1), Position(ledger, e)))
        return CursorState("persistent://t/ns/x", "sub", Position(ledger, md), tuple(ranges), "Shared", 0, 0, 0)

    return rows, cursor(src_ledger, src_entries), cursor(tgt_ledger, [r.target.entry for r in rows])


def applied(rows: list[Row], source: CursorState, target: CursorState) -> CursorState:
    """The target cursor after window.plan's reset and acknowledgements, as the broker would hold it."""
    cursor_plan, acks = plan(rows, source)
    assert cursor_plan.reset_ledger is not None and cursor_plan.reset_entry is not None
    reset = Position(cursor_plan.reset_ledger, cursor_plan.reset_entry)
    md = reset if cursor_plan.excluded else Position(reset.ledger, reset.entry - 1)
    ranges = tuple(AckRange(Position(led, e - 1), Position(led, e)) for led, e in acks if Position(led, e) > md)
    return CursorState(target.topic, target.subscription, md, ranges, target.sub_type, 0, 0, 0)


@given(mapped_cursor())
def test_the_translated_cursor_acknowledges_exactly_what_the_source_did(
        case: tuple[list[Row], CursorState, CursorState]) -> None:
    rows, source, target = case
    # Brute force: a source entry is acknowledged iff at or before markDelete or inside a listed range.
    expected = [r.source <= source.mark_delete or any(r.source in a for a in source.ranges) for r in rows]
    assert acked(source, [r.source for r in rows]) == expected
    after = applied(rows, source, target)
    assert acked(after, [r.target for r in rows]) == expected
    verdict = judge(rows, source, after)
    assert (verdict.lost, verdict.duplicated, verdict.exact) == (0, 0, True)
    # ... and the verdict on the untouched target counts every difference, by messages.
    before = judge(rows, source, target)
    theirs = acked(target, [r.target for r in rows])
    assert before.duplicated == sum(r.source_messages for r, s, t in zip(rows, expected, theirs, strict=True)
                                    if s and not t)
    assert before.lost == sum(r.source_messages for r, s, t in zip(rows, expected, theirs, strict=True)
                              if t and not s)
