"""cleanup_source: removes the migrated tenant's copy from the **source only**, after a verified switch.

Order, each refusal one line and nothing deleted:

1. **preconditions**: switch_lookup reported ok in this run dir and the lookup service routes the tenant to
   the target.
2. **re-verify**: for every selected partition, the source's messages equal the target's copies of the same
   entries, read from where the position map puts the source's first entry (count and the order-sensitive
   content hash replicate_topics uses; the target may have more, written by clients since the switch, and the
   source fewer, its consumed ledgers trimmed by the broker). Copies the target itself trimmed since (consumed
   there) are counted instead, on a partition carrying the copy's mark only.
3. **no clients** on any selected source partition.
4. **replication off on the source, without cascade**: a namespace that replicates to other clusters is
   set to replicate to the source only. That deletes topics on the *excluded* clusters only where the
   clusters read this namespace's policy, i.e. when they share the source's configuration store. So the
   step first checks that the target does not see the source's namespace policy (the target's own
   replication list for the namespace differs from the source's, or the target does not have the source in
   its list): with a shared store the step refuses, since any change there would reach the target.
   Topic-level policies are never touched: global topic policies replicate and would cascade.
5. **delete on the source**: each selected topic (force: its subscriptions go with it), then namespaces left
   empty of topics, then the tenant when asked (`--delete-tenant`) and nothing of it is left.

`--dry-run` (what the DAG runs unless the trigger confirms deletion) does 1-3 and lists what 4-5 would do.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pulsar_migration import rundir
from pulsar_migration.admin import NotFound, PulsarAdmin, seg
from pulsar_migration.lookup.client import LookupServiceError
from pulsar_migration.metadata.inventory import read_layout
from pulsar_migration.positions import Position
from pulsar_migration.replication import posmap
from pulsar_migration.replication.content import ContentHash
from pulsar_migration.replication.follows import CLEANUP_STARTED, continued_by, rolled_back
from pulsar_migration.replication.partition import (
    COPY_SOURCE_PROPERTY,
    COPY_TARGET_PROPERTY,
    only_undeliverable_after,
    target_properties,
)
from pulsar_migration.replication.reading import ReadError, read_range
from pulsar_migration.report import StepReport, stable_hash
from pulsar_migration.spec import MigrationSpec
from pulsar_migration.stepjob import BadInput, StepContext, StepFailed
from pulsar_migration.switch.step import connected_clients, partitions_of

log = logging.getLogger(__name__)

STEP = "cleanup_source"
# Force-deleted topics go away asynchronously: for a moment the broker may refuse to delete their namespace
# (seen: HTTP 422 right after the last topic's delete; HTTP 500 "Consumer connect fail" while a compaction of the
# namespace's __change_events topic races its deletion). Asked again for this long.
NAMESPACE_DELETE_WAIT_S = 30.0
NAMESPACE_DELETE_REFUSALS = frozenset({409, 412, 422, 500})


class CleanupError(StepFailed):
    """A precondition or a check refused the cleanup (one line)."""


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--delete-tenant", action="store_true",
                        help="also delete the tenant on the source once nothing of it is left there")


def run(ctx: StepContext) -> None:
    spec, report = ctx.spec, ctx.report
    src_admin, tgt_admin = spec.source_cluster.admin(), spec.target_cluster.admin()
    try:
        switched = preconditions(ctx)
        if switched and spec.tenant not in src_admin.get("/tenants"):
            # After a verified switch to the target, a source without the tenant is a finished cleanup (one
            # killed after deleting the tenant, before its report): nothing is left to do.
            log.info("tenant %s is no longer on the source %s: nothing left to clean", spec.tenant, spec.source)
            report.details["already_clean"] = True
            return
        # One reading of the source's topics serves the verification and the deletes: a topic or partition created
        # meanwhile (the verification can take hours) is refused below, not deleted unverified.
        layout = read_layout(src_admin, spec, must_exist=True)
        partitions = partitions_of(spec, src_admin, layout)
        report.counts["partitions"] = len(partitions)
        if switched:
            verify(ctx, src_admin, tgt_admin, partitions)
        else:  # a dry run of the whole migration: nothing was copied, so there is nothing to verify yet
            report.details["verified"] = False
            report.details["note"] = "the switch only planned: the source is verified before any real deletion"
        clients = connected_clients(src_admin, partitions)
        if clients:
            raise CleanupError(f"{len(clients)} client(s) still use the source (first: {clients[0]}): nothing deleted")
        # The whole tenant: every namespace it still has on the source, also those a cleanup stopped after
        # their topics were deleted (a re-run must finish them, and the tenant, not report ok around them).
        selected = spec.namespaces or [ns.split("/", 1)[1] for ns in src_admin.get(f"/namespaces/{seg(spec.tenant)}")]
        namespaces = sorted({ref.namespace for ref in layout.topics} | set(selected))
        replication = replication_changes(ctx, src_admin, tgt_admin, namespaces)
        topics = sorted({f"persistent://{spec.tenant}/{ref.namespace}/{ref.topic}": ref.partitioned
                         for ref in layout.topics}.items())
        report.details["plan"] = {"replication_to_source_only": replication, "topics": [t for t, _ in topics],
                                  "namespaces_if_empty": namespaces,
                                  "tenant": spec.tenant if getattr(ctx.args, "delete_tenant", False) else None}
        if ctx.dry_run:
            return
        before = target_fingerprint(tgt_admin, spec.tenant, namespaces)
        unchanged_since_verified(ctx, src_admin, layout, partitions)
        # From here on a rollback of this run is refused; one already under way flipped the route back by now, or
        # fails before its flip (the source's topics are gone). The route is asked again after the marker: a
        # rollback that flipped before it is seen here. A failure before the first topic is deleted (the route
        # check, an outage) removes the marker again: the way back is intact, and must stay open.
        rundir.write_text(ctx.run_dir, CLEANUP_STARTED, json.dumps({"started_at": time.time()}) + "\n")
        deleted: list[str] = []
        deleting = False
        try:
            check_route(spec)
            for ns in replication:
                src_admin.post(f"/namespaces/{seg(spec.tenant)}/{seg(ns)}/replication", [spec.source])
            for topic, partitioned in topics:
                path = src_admin.topic_path(topic) + ("/partitions" if partitioned else "")
                deleting = True  # from the first delete asked on, the source may be partly gone
                src_admin.delete(path, params={"force": "true"}, expect_json=False)
                deleted.append(topic)
        except BaseException:
            if not deleting:
                rundir.remove(ctx.run_dir, CLEANUP_STARTED)
            raise
        report.counts["topics_deleted"] = len(deleted)
        removed = []
        for ns in namespaces:
            left = src_admin.get(f"/namespaces/{seg(spec.tenant)}/{seg(ns)}/topics")
            if any("__change_events" not in t for t in left):
                log.info("namespace %s/%s keeps %d topic(s) not selected: left in place", spec.tenant, ns, len(left))
                continue
            delete_namespace(src_admin, spec.tenant, ns)
            removed.append(ns)
        report.details["namespaces_deleted"] = removed
        if getattr(ctx.args, "delete_tenant", False):
            kept = src_admin.get(f"/namespaces/{seg(spec.tenant)}")
            if kept:
                log.warning("tenant %s keeps %d namespace(s) on the source (first: %s): not deleted", spec.tenant,
                            len(kept), kept[0])
                report.details["tenant_kept_for"] = kept
            else:
                src_admin.delete(f"/tenants/{seg(spec.tenant)}", expect_json=False)
            report.details["tenant_deleted"] = not kept
        after = target_fingerprint(tgt_admin, spec.tenant, namespaces)
        report.hashes["target_topics_before"] = stable_hash(before)
        report.hashes["target_topics_after"] = stable_hash(after)
        shrunk = [t for t, n in before.items() if after.get(t, -1) < n]
        if shrunk:
            raise CleanupError(f"{len(shrunk)} target topic(s) lost entries or vanished during the cleanup (first: "
                               f"{shrunk[0]}): stop and investigate")
    finally:
        src_admin.close()
        tgt_admin.close()


def unchanged_since_verified(ctx: StepContext, admin: PulsarAdmin, layout: Any, partitions: list[str]) -> None:
    """CleanupError when the source's selected topics or partitions differ from those verified (created, deleted or
    repartitioned since): deleting them would remove what nothing verified."""
    now = read_layout(admin, ctx.spec, must_exist=True)
    now_partitions = partitions_of(ctx.spec, admin, now)
    topics = sorted((ref.namespace, ref.topic, ref.partitioned) for ref in layout.topics)
    if sorted((ref.namespace, ref.topic, ref.partitioned) for ref in now.topics) != topics or \
            now_partitions != partitions:
        added = sorted(set(now_partitions) - set(partitions))
        raise CleanupError(f"the source's topics changed since they were verified ({len(added)} partition(s) new, "
                           f"first: {added[0] if added else 'a topic gone or repartitioned'}): nothing deleted; "
                           "run the cleanup again")


def delete_namespace(admin: PulsarAdmin, tenant: str, ns: str) -> None:
    """Deletes a namespace whose topics were just deleted, asking again while the broker still refuses."""
    admin.force_delete(f"/namespaces/{seg(tenant)}/{seg(ns)}", NAMESPACE_DELETE_REFUSALS, NAMESPACE_DELETE_WAIT_S)


def preconditions(ctx: StepContext) -> bool:
    """True after a real, verified switch; False for a dry run after a planned one; BadInput after its rollback;
    CleanupError otherwise."""
    spec = ctx.spec
    try:
        switched = StepReport.read(ctx.run_dir, "switch_lookup")
    except (FileNotFoundError, OSError):
        raise CleanupError(f"no switch_lookup report in {ctx.run_dir}: the source is cleaned only after a verified "
                           "switch") from None
    if ctx.dry_run and switched.dry_run and switched.verdict == "planned":
        return False
    if switched.verdict != "ok" or switched.dry_run:
        raise CleanupError(f"switch_lookup in {ctx.run_dir} is {switched.verdict}: nothing is deleted before a "
                           "verified switch")
    back = rolled_back(ctx.run_dir, spec.source)
    if back is not None:
        later = continued_by(ctx.run_dir)
        raise BadInput(f"the switch in {ctx.run_dir} was rolled back ({back}): the clients went back to "
                       "the source; " + (f"clean up after the run that migrated again, {later}" if later else
                                         "migrate again (Continue from run) and clean up after that run"))
    check_route(spec)
    return True


def check_route(spec: MigrationSpec) -> None:
    """The lookup service routes the tenant to the target (asked again right before deleting: a rollback started
    meanwhile flips it back)."""
    if not spec.lookup_url:
        return
    lookup = spec.lookup_admin()
    try:
        route = lookup.route(spec.tenant)["cluster"]
    except LookupServiceError as exc:
        raise CleanupError(str(exc)) from None
    finally:
        lookup.close()
    if route != spec.target:
        raise CleanupError(f"the lookup service routes {spec.tenant} to {route}, not to the target {spec.target}")


@dataclass
class SourceRange:
    """What the source holds of one partition now: its content hash, its first message's entry (the map's key: a
    chunked message's last chunk) and its last entry (None: empty)."""

    content: ContentHash
    first: Position | None = None
    upper: Position | None = None


def verify(ctx: StepContext, src_admin: PulsarAdmin, tgt_admin: PulsarAdmin, partitions: list[str]) -> None:
    """The source's messages equal the target's copies of the same entries, in order (count and content hash).
    The target's copies start where the position map puts the source's first message: the broker trims a source's
    ledgers once every subscription consumed them (no retention), so the source may start later than the target.
    The target trims its own the same way (its clients consume them after the switch): see trimmed_on_target."""
    spec, report = ctx.spec, ctx.report
    src_client, tgt_client = spec.source_cluster.pulsar_client(), spec.target_cluster.pulsar_client()
    rows = []
    try:
        sources = {topic: read_source(src_admin, src_client, topic) for topic in partitions}
        # A reader of a topic the target lacks would create it there (brokers auto-create by default).
        missing = [topic for topic, r in sources.items() if r.content.messages and not exists(tgt_admin, topic)]
        if missing:
            raise CleanupError(f"{len(missing)} partition(s) holding messages on the source are not on the target "
                               f"{spec.target} (first: {missing[0]}; deleted there since, or created on the source "
                               "after the migration): nothing deleted")
        starts = target_starts(ctx, {topic: r.first for topic, r in sources.items() if r.first is not None})
        held_from: dict[str, Position | None] = {}  # partitions whose target lost the copy at `start`
        for topic, start in starts.items():
            held = first_held(tgt_client, topic, start)
            if held is None or held > start:
                held_from[topic] = held
        still_held = {topic: held for topic, held in held_from.items() if held is not None}
        cuts = first_copies_from(ctx, still_held)
        last_lost = last_copies_before(ctx, still_held)
        map_ends = mapped_ends(ctx, list(held_from)) if held_from else {}
        for topic in held_from:  # nothing held from there: every copy after the start is gone
            if topic not in still_held and topic in map_ends:
                last_lost[topic] = map_ends[topic].target
        for topic, r in sources.items():
            rows.append(f"{topic}|{r.content.messages}|{r.content.hexdigest}")
            source, start = r.content, starts.get(topic)
            if topic in held_from:
                end = map_ends.get(topic)
                source, start = trimmed_on_target(ctx, tgt_admin, topic, r, starts[topic], held_from[topic],
                                                  cuts.get(topic), end.source if end else None, last_lost.get(topic),
                                                  functools.partial(read_source, src_admin, src_client, topic,
                                                                    upper=r.upper))
            target = ContentHash()
            if source.messages:
                for message, info in read_range(tgt_client, topic, None, inclusive_start=start,
                                                cluster=tgt_admin.name):
                    target.add(message, new_entry=info.batch_index <= 0)
                    if target.messages == source.messages:
                        break
            if (target.messages, target.hexdigest) != (source.messages, source.hexdigest):
                where = f"from its copy of the source's entry at {start}" if start else "from its first message"
                raise CleanupError(f"{topic}: the target does not hold the source's {source.messages} message(s) "
                                   f"(read {where}: {target.messages} of hash {target.hexdigest[:12]}, source "
                                   f"{source.hexdigest[:12]}): nothing deleted")
            report.count("messages_verified", source.messages)
    except ReadError as exc:  # a broker port not answering, say: one line naming the cluster, not a traceback
        raise CleanupError(f"{exc}: nothing deleted") from None
    finally:
        src_client.close()
        tgt_client.close()
    report.hashes["source"] = stable_hash(rows)


def trimmed_on_target(ctx: StepContext, admin: PulsarAdmin, topic: str, r: SourceRange, start: Position,
                      held: Position | None, cut: tuple[Position, Position] | None, map_end: Position | None,
                      last_lost: Position | None,
                      read_from: Callable[[Position], SourceRange]) -> tuple[ContentHash, Position | None]:
    """The source messages still to compare, and where their copies start on the target, for a target partition
    that no longer holds the copy at `start` (`held`: its first entry from there; `cut`: the first map row at or
    after it, as (source, target) starts). The copies gone are counted (messages_trimmed_on_target), not compared:
    they were compared when copied. Refused unless the partition is the one copied into (either copy mark: one
    created again holds none of them), every durable subscription there consumed past them (trimmed, not lost), and
    (when nothing copied is left) the source holds nothing after the map's end (never copied)."""
    properties = target_properties(admin, topic)
    there = f"{topic}: the target no longer holds the copies from {start} (it holds " \
            f"{f'entries from {held}' if held else 'nothing'} from there)"
    if not {COPY_TARGET_PROPERTY, COPY_SOURCE_PROPERTY} & set(properties):
        raise CleanupError(f"{there} and lacks the {COPY_TARGET_PROPERTY} mark (deleted and created again since, "
                           "or copied before the marks existed): nothing deleted")
    cursors = admin.get(f"{admin.topic_path(topic)}/internalStats").get("cursors") or {}
    # A durable subscription consumed every copy gone only if its markDelete is at or past the last of them
    # (`last_lost`, the map's last target entry before `held`); the broker trims a ledger only then.
    consumed_to = last_lost or start
    behind = sorted(name for name, cursor in cursors.items()
                    if Position.parse(cursor.get("markDeletePosition") or "-1:-1") < consumed_to)
    if behind:
        raise CleanupError(f"{there} although subscription {behind[0]} there did not consume them (lost on the "
                           "target?): nothing deleted")
    if cut is None and (map_end is None or (r.upper is not None and r.upper > map_end)):
        raise CleanupError(f"{there}, and the source holds entries after the position map's end {map_end} (up to "
                           f"{r.upper}): never copied; nothing deleted")
    source = read_from(cut[0]).content if cut else ContentHash()
    ctx.report.count("messages_trimmed_on_target", r.content.messages - source.messages)
    return source, cut[1] if cut else None


def read_source(admin: PulsarAdmin, client: Any, topic: str, start: Position | None = None,
                upper: Position | None = None) -> SourceRange:
    """The source partition's messages from `start` (inclusive; None: its first) up to `upper` (None: its last
    entry now), hashed."""
    if upper is None:
        last = admin.last_message_id(topic)
        if int(last.get("entryId", -1)) < 0:
            return SourceRange(ContentHash())
        upper = Position(int(last["ledgerId"]), int(last["entryId"]))
    found = SourceRange(ContentHash(), upper=upper)
    last_read: Position | None = None
    for message, info in read_range(client, topic, None, upper, inclusive_start=start, cluster=admin.name):
        found.first = found.first or info.position
        found.content.add(message, new_entry=info.batch_index <= 0)
        last_read = info.position
    # A reader stops short of the last entry when the rest is not deliverable yet (messages behind an open
    # transaction) or took "no more" for the end: what it left would be deleted unverified.
    if (last_read is None or last_read < upper) and not only_undeliverable_after(
            admin, topic, last_read or Position(upper.ledger, -1), upper, reader_stopped=True):
        raise CleanupError(f"{topic}: the source read ended at {last_read or 'its start'}, before its last entry "
                           f"{upper}, and what lies between is not only transaction markers, aborted messages or "
                           "incomplete chunks (an open transaction holds messages back?): nothing deleted")
    return found


def exists(admin: PulsarAdmin, topic: str) -> bool:
    """Whether the cluster has the partition (asked without loading or creating it)."""
    try:
        admin.get(f"{admin.topic_path(topic)}/internalStats")
        return True
    except NotFound:
        return False


def first_held(client: Any, topic: str, start: Position) -> Position | None:
    """Where the first message a reader of the target partition is given from `start` on begins (None: none)."""
    for _, info in read_range(client, topic, None, inclusive_start=start):
        return info.first_chunk or info.position
    return None


def _start(frame: Any, side: str) -> list[Position]:
    """Per row, where its message begins on `side`: its first chunk's entry, or its entry."""
    return [Position.parse(chunk) if isinstance(chunk, str) and chunk else Position(int(ledger), int(entry))
            for chunk, ledger, entry in zip(frame[f"{side}_first_chunk"], frame[f"{side}_ledger"],
                                            frame[f"{side}_entry"], strict=True)]


def _rows_beside(ctx: StepContext, held_from: dict[str, Position], at_or_after: bool) -> Any | None:
    """The map rows of each partition in `held_from` whose target entry is at or after (else before) the one given
    there, in target order (None: no rows asked, or no map)."""
    ledger_cmp, entry_cmp = (">", ">=") if at_or_after else ("<", "<")
    frame = map_rows_joined(ctx, [(topic, p.ledger, p.entry) for topic, p in held_from.items()],
                            ["topic", "held_ledger", "held_entry"], on="topic",
                            spark_where=f"target_ledger {ledger_cmp} held_ledger OR (target_ledger = held_ledger AND "
                                        f"target_entry {entry_cmp} held_entry)")
    if frame is None:
        return None
    ledgers, entries = frame.target_ledger - frame.held_ledger, frame.target_entry - frame.held_entry
    beside = (ledgers > 0) | ((ledgers == 0) & (entries >= 0)) if at_or_after else \
        (ledgers < 0) | ((ledgers == 0) & (entries < 0))
    return frame[beside].sort_values(["topic", "target_ledger", "target_entry"])


def first_copies_from(ctx: StepContext, held_from: dict[str, Position]) -> dict[str, tuple[Position, Position]]:
    """Per partition, where the first mapped message whose target entry is at or after the one in `held_from`
    begins, as (source, target) (absent: none is)."""
    frame = _rows_beside(ctx, held_from, at_or_after=True)
    if frame is None:
        return {}
    first = frame.groupby("topic").head(1)
    return dict(zip(first["topic"], zip(_start(first, "source"), _start(first, "target"), strict=True), strict=True))


def target_starts(ctx: StepContext, firsts: dict[str, Position]) -> dict[str, Position]:
    """Per partition, where the target's copy of the source message keyed by the entry in `firsts` begins (absent:
    the map does not hold it; the target is then read from its first message)."""
    columns = ["topic", "source_ledger", "source_entry"]
    frame = map_rows_joined(ctx, [(topic, p.ledger, p.entry) for topic, p in firsts.items()], columns, on=columns)
    return {} if frame is None else dict(zip(frame["topic"], _start(frame, "target"), strict=True))


def map_rows_joined(ctx: StepContext, rows: list[tuple], columns: list[str], on: str | list[str],
                    spark_where: str | None = None) -> Any | None:
    """The position map's rows joined with `rows` (named `columns`, the topic first) on `on`, as a pandas frame
    (None: no rows asked, or no map). A local run dir is read in this process; another through Spark, filtered
    there by `spark_where` before the rows come to the driver."""
    if not rows:
        return None
    if rundir.is_local(ctx.run_dir):
        frame = posmap.read_local(ctx.run_dir, sorted({row[0] for row in rows}))
        if frame is None:
            return None
        import pandas as pd  # not at import: every step imports this package

        return frame.merge(pd.DataFrame(rows, columns=columns), on=on)
    position_map = posmap.read_map(ctx.spark, ctx.run_dir)
    if position_map is None:
        return None
    joined = position_map.join(ctx.spark.createDataFrame(rows, columns), on=on)
    return (joined.where(spark_where) if spark_where else joined).toPandas()


def mapped_ends(ctx: StepContext, topics: list[str]) -> dict[str, posmap.MapEnd]:
    """Per partition, the last entries the position map holds (source and target)."""
    if rundir.is_local(ctx.run_dir):
        ends = posmap.ends_of(posmap.read_local(ctx.run_dir, topics))
    else:
        ends = posmap.collect_ends(ctx.spark, ctx.run_dir)
    return {topic: end for topic, end in ends.items() if topic in topics}


def last_copies_before(ctx: StepContext, held_from: dict[str, Position]) -> dict[str, Position]:
    """Per partition, the target entry of the last mapped message before the one in `held_from` (absent: none)."""
    frame = _rows_beside(ctx, held_from, at_or_after=False)
    if frame is None:
        return {}
    last = frame.groupby("topic").tail(1)
    return {row.topic: Position(int(row.target_ledger), int(row.target_entry)) for row in last.itertuples()}


def replication_changes(ctx: StepContext, src: PulsarAdmin, tgt: PulsarAdmin, namespaces: list[str]) -> list[str]:
    """Namespaces whose source replication list names other clusters; refuses when the target shares it."""
    spec = ctx.spec
    changes = []
    for ns in namespaces:
        path = f"/namespaces/{seg(spec.tenant)}/{seg(ns)}/replication"
        clusters = sorted(src.get(path) or [])
        if clusters in ([], [spec.source]):
            continue
        try:
            target_view = sorted(tgt.get(path) or [])
        except NotFound:
            target_view = []
        if spec.source in target_view and target_view == clusters:
            raise CleanupError(f"namespace {spec.tenant}/{ns} has the same replication clusters {clusters} on both "
                               "clusters (a shared configuration store?): changing it would delete topics on the "
                               "target too; nothing deleted")
        changes.append(ns)
    return changes


def target_fingerprint(admin: PulsarAdmin, tenant: str, namespaces: list[str]) -> dict[str, int]:
    """Entries stored per target partition. Clients may write meanwhile, so a cleanup is judged by nothing
    vanishing or shrinking, not by equality."""
    entries: dict[str, int] = {}
    for ns in namespaces:
        try:
            topics = admin.get(f"/namespaces/{seg(tenant)}/{seg(ns)}/topics")
        except NotFound:
            continue
        for topic in sorted(t for t in topics if "__change_events" not in t):
            stats: dict[str, Any] = admin.get(f"{admin.topic_path(topic)}/internalStats")
            entries[topic] = int(stats.get("numberOfEntries") or 0)
    return entries
