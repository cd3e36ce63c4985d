"""sync_progress in the driver, over the map's tail only: the cutover's final sync, which clients wait for.

The Spark path (progress.step) joins every subscription with the whole position map; its fixed cost (a
dozen small Spark jobs, 10-20 s on two cores) is the whole hold when the final delta is a few hundred
entries. Here the same model runs in plain Python over a *window*: per partition, the map rows after the
lowest markDelete of its subscriptions on either side. Rows before the window are acknowledged on both
sides by every subscription (each one's markDelete is at or past the window's start), so they agree
and need no look; inside it, each row gets the source's and the target's "acknowledged" flag exactly as
translate.mark_acked defines it, the plan is translate.target_plan's (reset at the first unacknowledged
row, acknowledge the acknowledged rows after it), and the verdict is translate.compare's (lost and
duplicated per subscription, all must be 0 after a read-back).

It declines, and the caller falls back to the Spark path, whenever the window leaves that model's easy
part: a subscription missing on the target, a chunked message in the window, or more rows than
WINDOW_LIMIT (a consumer far behind).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.positions import Position
from pulsar_migration.progress.apply import ACK_MAX_IN_FLIGHT, VERIFY_ATTEMPTS, Applied, CursorPlan, apply_cursor
from pulsar_migration.progress.cursors import CursorState, cursor_states, note_target_only, read_cursors
from pulsar_migration.replication import posmap
from pulsar_migration.replication.step import driver_threads
from pulsar_migration.snapshot import FenceSnapshot, PartitionState
from pulsar_migration.stepjob import StepContext, StepFailed

log = logging.getLogger(__name__)

WINDOW_LIMIT = 200_000


class Declined(Exception):
    """The window is not for this path; the message says why (the Spark path takes over)."""


@dataclass(frozen=True)
class Row:
    source: Position
    target: Position
    source_messages: int
    target_messages: int


@dataclass
class Verdict:
    topic: str
    subscription: str
    window_rows: int
    source_acked: int = 0
    target_acked: int = 0
    lost: int = 0  # messages acked on the target, not on the source: a drain there would never get them
    duplicated: int = 0  # acked on the source, not on the target: a drain there would get them again
    first_difference: str | None = None
    plan: str | None = None
    acks_sent: int = 0
    exact: bool = True


def acked(state: CursorState, positions: Iterable[Position]) -> list[bool]:
    """translate.mark_acked for one side and chunk-free rows: at or before markDelete, or in a range."""
    individually = {(r.lower.ledger, e) for r in state.ranges for e in r.entries}
    return [p <= state.mark_delete or (p.ledger, p.entry) in individually for p in positions]


COLUMNS = ("source_ledger", "source_entry", "target_ledger", "target_entry", "source_messages", "target_messages",
           "source_first_chunk", "target_first_chunk")


def columns(frame: Any) -> dict[str, Any]:
    """One topic's map rows as numpy columns, in target order."""
    ordered = frame.sort_values(["target_ledger", "target_entry"])
    return {c: ordered[c].to_numpy() for c in COLUMNS}


def columns_by_topic(frame: Any) -> dict[str, dict[str, Any]]:
    """`columns` of every topic in the map, split in one pass (a filter of the whole map per topic costs
    milliseconds each, which the held clients would wait for)."""
    import numpy as np

    ordered = frame.sort_values(["topic", "target_ledger", "target_entry"])
    names, starts = np.unique(ordered["topic"].to_numpy(), return_index=True)
    cols = {c: ordered[c].to_numpy() for c in COLUMNS}
    ends = [*starts[1:], len(ordered)]
    return {str(name): {c: v[start:end] for c, v in cols.items()} for name, start, end in zip(names, starts, ends,
                                                                                             strict=True)}


def window(frame: Any, sources: list[CursorState], targets: list[CursorState]) -> list[Row]:
    """The rows of one partition's map that some subscription has not acknowledged on both sides, in target
    order; Declined for chunked messages."""
    return window_of(columns(frame), sources, targets)


def window_of(cols: dict[str, Any], sources: list[CursorState], targets: list[CursorState]) -> list[Row]:
    """`window` over one topic's `columns`."""
    import numpy as np
    import pandas as pd

    lo_src = min(s.mark_delete for s in sources)
    lo_tgt = min(t.mark_delete for t in targets)
    sl, se, tl, te = cols["source_ledger"], cols["source_entry"], cols["target_ledger"], cols["target_entry"]
    after = ((sl > lo_src.ledger) | ((sl == lo_src.ledger) & (se > lo_src.entry))
             | (tl > lo_tgt.ledger) | ((tl == lo_tgt.ledger) & (te > lo_tgt.entry)))
    picked = np.flatnonzero(after)
    if len(picked) > WINDOW_LIMIT:
        raise Declined(f"{len(picked)} map rows after the slowest subscription (over {WINDOW_LIMIT})")
    if pd.notna(cols["source_first_chunk"][picked]).any() or pd.notna(cols["target_first_chunk"][picked]).any():
        raise Declined("chunked messages in the window")
    sm, tm = cols["source_messages"], cols["target_messages"]
    return [Row(Position(int(sl[i]), int(se[i])), Position(int(tl[i]), int(te[i])), int(sm[i]), int(tm[i]))
            for i in picked]


def judge(rows: list[Row], source: CursorState, target: CursorState) -> Verdict:
    """translate.compare over the window: lost and duplicated messages, and where the two sides first differ."""
    verdict = Verdict(source.topic, source.subscription, len(rows))
    src = acked(source, (r.source for r in rows))
    tgt = acked(target, (r.target for r in rows))
    for row, s, t in zip(rows, src, tgt, strict=True):
        verdict.source_acked += s
        verdict.target_acked += t
        if s and not t:
            verdict.duplicated += row.source_messages
        elif t and not s:
            verdict.lost += row.source_messages
        if s != t and verdict.first_difference is None:
            verdict.first_difference = str(row.target)
    verdict.exact = verdict.first_difference is None
    return verdict


def plan(rows: list[Row], source: CursorState) -> tuple[CursorPlan, list[tuple[int, int]]]:
    """translate.target_plan over the window: reset at the first unacknowledged row (markDelete just before
    it), then acknowledge the acknowledged rows after it; all acknowledged: markDelete at the last row."""
    flags = acked(source, (r.source for r in rows))
    first = next((i for i, flag in enumerate(flags) if not flag), None)
    if first is None:
        last = rows[-1].target
        return CursorPlan(source.topic, source.subscription, last.ledger, last.entry, True), []
    reset = rows[first].target
    acks = [(r.target.ledger, r.target.entry) for r, flag in zip(rows[first:], flags[first:], strict=True) if flag]
    return CursorPlan(source.topic, source.subscription, reset.ledger, reset.entry, False), acks


def sync(ctx: StepContext, topics: list[str], snapshot: FenceSnapshot | None = None) -> None:
    """The final sync of `topics`; Declined when the window is not for this path (nothing was written then),
    StepFailed when a subscription could not be set or differs after the read-back. With the cutover's
    `snapshot`, both sides' cursors come from it (neither moves while the tenant is fenced) and the read-back
    reads internalStats only."""
    spec, report = ctx.spec, ctx.report
    started = time.monotonic()
    frame = posmap.read_local(ctx.run_dir, topics)
    if frame is None:
        raise Declined("no local position map")
    src_admin, tgt_admin = spec.source_cluster.admin(), spec.target_cluster.admin()
    client = spec.target_cluster.pulsar_client()
    try:
        with ThreadPoolExecutor(driver_threads(spec, len(topics))) as pool:
            if snapshot is not None:
                sources = states_of(snapshot.source, topics)
                targets = states_of(snapshot.target, topics)
            else:
                sources = read_all(pool, src_admin, topics)
                targets = read_all(pool, tgt_admin, topics)
            known_stats = {t: snapshot.target[t].stats for t in topics} if snapshot is not None else None
            windows: dict[str, list[Row]] = {}
            by_topic = columns_by_topic(frame)
            empty = columns(frame.iloc[0:0])
            for topic in topics:
                subs = sources[topic]
                if not subs:
                    continue
                missing = [name for name in subs if name not in targets[topic]]
                if missing:
                    raise Declined(f"subscription {missing[0]} of {topic} is not on the target yet")
                windows[topic] = window_of(by_topic.get(topic, empty), list(subs.values()),
                                           [targets[topic][name] for name in subs])
            report.details["read_s"] = round(time.monotonic() - started, 3)
            note_target_only(report, (c for t in topics for c in sources[t].values()),
                             (c for t in topics for c in targets[t].values()))
            report.counts["window_rows"] = sum(len(rows) for rows in windows.values())
            before = [judge(windows[t], s, targets[t][n]) for t in windows for n, s in sources[t].items()]
            pending = [v for v in before if not v.exact]
            report.counts["subscriptions"] = len(before)
            report.counts["subscriptions_already_exact"] = len(before) - len(pending)

            started = time.monotonic()
            by_topic: dict[str, list[Verdict]] = {}
            for verdict in pending:
                by_topic.setdefault(verdict.topic, []).append(verdict)

            def apply_topic(topic: str) -> list[Applied]:  # one subscription after another: a reset kicks consumers
                done = []
                for verdict in by_topic[topic]:
                    cursor, acks = plan(windows[topic], sources[topic][verdict.subscription])
                    verdict.plan = f"{cursor.reset_ledger}:{cursor.reset_entry}" + (
                        "" if cursor.excluded else " (first unacked)")
                    try:
                        subs = known_stats[topic].get("subscriptions") or {} if known_stats is not None else None
                        done.append(apply_cursor(tgt_admin, client, cursor, acks, max_in_flight=ACK_MAX_IN_FLIGHT,
                                                 subscriptions=subs))
                    except Exception as exc:  # one line per subscription (ProgressError or the admin's)
                        done.append(Applied(topic, verdict.subscription, error=f"{type(exc).__name__}: {exc}"))
                return done

            applied = [a for group in pool.map(apply_topic, list(by_topic)) for a in group]
            report.details["apply_s"] = round(time.monotonic() - started, 3)
            report.counts["subscriptions_set"] = sum(1 for a in applied if not a.error)
            report.counts["acks_sent"] = sum(a.acks_sent for a in applied)
            failed = [a for a in applied if a.error]
            if failed:
                report.details["failures"] = [asdict(a) for a in failed[:20]]
                raise StepFailed(f"{len(failed)} subscription(s) could not be set; first: {failed[0].error}")

            started = time.monotonic()
            after = before
            for attempt in range(VERIFY_ATTEMPTS):
                targets = read_all(pool, tgt_admin, topics, known_stats)
                after = [judge(windows[t], s, targets[t][n]) for t in windows for n, s in sources[t].items()]
                if all(v.exact for v in after) or attempt + 1 == VERIFY_ATTEMPTS:
                    break
                time.sleep(0.2 * (attempt + 1))
            report.details["verify_s"] = round(time.monotonic() - started, 3)
    finally:
        client.close()
        src_admin.close()
        tgt_admin.close()
    summarise(ctx, after, {(v.topic, v.subscription): v for v in pending}, applied)


def read_all(pool: ThreadPoolExecutor, admin: PulsarAdmin, topics: list[str],
             stats: dict[str, dict[str, Any]] | None = None) -> dict[str, dict[str, CursorState]]:
    """Every topic's cursors; with `stats` (the subscriptions are known) only internalStats is read."""
    return dict(zip(topics, pool.map(lambda t: read_cursors(admin, t, stats[t] if stats else None), topics),
                    strict=True))


def states_of(side: dict[str, PartitionState], topics: list[str]) -> dict[str, dict[str, CursorState]]:
    return {t: cursor_states(t, side[t].stats, side[t].internal, side[t].read_at_ms) for t in topics}


def summarise(ctx: StepContext, after: list[Verdict], pending: dict[tuple[str, str], Verdict],
              applied: list[Applied]) -> None:
    report = ctx.report
    done = {(a.topic, a.subscription): a for a in applied}
    details = []
    for v in after:
        key = (v.topic, v.subscription)
        detail = asdict(v)
        detail["plan"] = pending[key].plan if key in pending else None
        detail["acks_sent"] = done[key].acks_sent if key in done else 0
        details.append(detail)
    report.details["subscriptions"] = details
    for name in ("lost", "duplicated", "source_acked", "target_acked"):
        report.counts[name] = sum(getattr(v, name) for v in after)
    wrong = [v for v in after if not v.exact]
    if wrong:
        raise StepFailed(f"{len(wrong)} subscription(s) differ on the target after the final sync (first: "
                         f"{wrong[0].topic} {wrong[0].subscription} at target entry {wrong[0].first_difference}): "
                         f"lost {report.counts['lost']}, duplicated {report.counts['duplicated']} message(s)")
