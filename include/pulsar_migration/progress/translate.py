"""Acknowledged sets through the position map, as Spark joins (no loop per message).

A cursor acknowledges an entry when the entry is at or before its markDeletePosition or in one of its
individually acknowledged ranges. Over the map (one row per target entry, holding one source entry) each
subscription's state becomes one boolean per map row and side; the target's wanted cursor follows from the
source's booleans, and a sync is exact when both sides' booleans agree on every row. Source entries with no
row (markers, aborted transactions, entries not copied) are never asked about: they deliver nothing.
A chunked message spans entries from its first to its last chunk. On either side it counts as acknowledged when
either end is: a consumer assembles it only when it gets all of it (with other producers' entries between its
chunks, a cumulative acknowledgement of one of them acknowledges the message's first chunks alone).
"""

from __future__ import annotations

from collections.abc import Iterable

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pulsar_migration.progress.cursors import CursorState

CURSOR_SCHEMA = T.StructType([
    T.StructField("topic", T.StringType(), False),
    T.StructField("subscription", T.StringType(), False),
    T.StructField("md_ledger", T.LongType(), False),
    T.StructField("md_entry", T.LongType(), False),
    T.StructField("ranges", T.IntegerType(), False),
    T.StructField("sub_type", T.StringType(), False),
    T.StructField("consumers", T.IntegerType(), False),
    T.StructField("backlog", T.LongType(), False),
    T.StructField("read_at_ms", T.LongType(), False),
])
RANGE_SCHEMA = T.StructType([
    T.StructField("topic", T.StringType(), False),
    T.StructField("subscription", T.StringType(), False),
    T.StructField("ledger", T.LongType(), False),
    T.StructField("lower_entry", T.LongType(), False),  # exclusive
    T.StructField("upper_entry", T.LongType(), False),  # inclusive
])
SUB_KEYS = ["topic", "subscription"]


def cursor_frames(spark: SparkSession, states: Iterable[CursorState]) -> tuple[DataFrame, DataFrame]:
    """(cursors, ranges) DataFrames of cursor states read on one side."""
    cursors, ranges = [], []
    for s in states:
        cursors.append((s.topic, s.subscription, s.mark_delete.ledger, s.mark_delete.entry, len(s.ranges),
                        s.sub_type, s.consumers, s.backlog, s.read_at_ms))
        ranges.extend((s.topic, s.subscription, r.lower.ledger, r.lower.entry, r.upper.entry) for r in s.ranges)
    return spark.createDataFrame(cursors, CURSOR_SCHEMA), spark.createDataFrame(ranges, RANGE_SCHEMA)


def acked_entries(ranges: DataFrame) -> DataFrame:
    """One row (topic, subscription, ledger, entry) per entry the ranges hold."""
    return ranges.select(*SUB_KEYS, "ledger",
                         F.explode(F.sequence(F.col("lower_entry") + 1, F.col("upper_entry"))).alias("entry"))


def _at_or_before(ledger: Column, entry: Column, md_ledger: Column, md_entry: Column) -> Column:
    return (ledger < md_ledger) | ((ledger == md_ledger) & (entry <= md_entry))


def mark_acked(position_map: DataFrame, cursors: DataFrame, acked: DataFrame, side: str) -> DataFrame:
    """Every map row of every subscription of its topic, with `acked`: whether the `side` ("source" or
    "target") cursor has acknowledged the entry the row names on that side."""
    first = F.split(F.col(f"{side}_first_chunk"), ":")
    rows = (position_map.join(cursors.select(*SUB_KEYS, "md_ledger", "md_entry"), "topic")
            .withColumn("_l", F.col(f"{side}_ledger")).withColumn("_e", F.col(f"{side}_entry"))
            .withColumn("_fl", first.getItem(0).cast("long")).withColumn("_fe", first.getItem(1).cast("long")))
    hit_last = acked.select(*SUB_KEYS, F.col("ledger").alias("_l"), F.col("entry").alias("_e"),
                            F.lit(True).alias("_hit_last"))
    hit_first = acked.select(*SUB_KEYS, F.col("ledger").alias("_fl"), F.col("entry").alias("_fe"),
                             F.lit(True).alias("_hit_first"))
    rows = rows.join(hit_last, [*SUB_KEYS, "_l", "_e"], "left").join(hit_first, [*SUB_KEYS, "_fl", "_fe"], "left")
    md_l, md_e = F.col("md_ledger"), F.col("md_entry")
    last_acked = _at_or_before(F.col("_l"), F.col("_e"), md_l, md_e) | F.col("_hit_last").isNotNull()
    first_chunk_acked = F.col("_fl").isNotNull() & (_at_or_before(F.col("_fl"), F.col("_fe"), md_l, md_e)
                                                    | F.col("_hit_first").isNotNull())
    # Both sides are judged by what a consumer gets: a chunked message with its first or its last chunk
    # acknowledged is never assembled, so it counts as acknowledged (on the target, a cursor reset to its last
    # chunk loses it; on the source, a cumulative acknowledgement of an entry between its chunks does).
    acked = last_acked | first_chunk_acked
    return rows.select(*SUB_KEYS, "target_ledger", "target_entry", "target_first_chunk", "source_ledger",
                       "source_entry", "source_messages", "target_messages", acked.alias("acked"))


def _target_position() -> Column:
    return F.struct(F.col("target_ledger").alias("ledger"), F.col("target_entry").alias("entry"))


def target_plan(source_marked: DataFrame) -> tuple[DataFrame, DataFrame]:
    """What the target cursors must become: per subscription the cursor reset (`reset_ledger:reset_entry`,
    `excluded` true: markDelete there; false: the first unacknowledged entry, markDelete just before it;
    both null: no mapped entries) and the target entries to acknowledge individually after it (`acks`:
    topic, subscription, ledger, entry; a chunked message's chunk entries). A subscription whose map
    rows are all acknowledged is reset past its last mapped entry and needs no individual acks.

    The markDelete stops before the earliest *start* of an unacknowledged message (a chunked one starts at its
    first chunk, which may come before an acknowledged message's entry when producers' chunks interleave, as
    geo-replication keeps them), and a chunked message's acknowledgement skips every entry that may belong to an
    unacknowledged message between its chunks: those messages stay whole."""
    pos = _target_position()
    chunked = F.col("target_first_chunk").isNotNull()
    first = F.split(F.col("target_first_chunk"), ":")
    first_ledger, first_entry = first.getItem(0).cast("long"), first.getItem(1).cast("long")
    # Where the row's message starts: a chunked message at its first chunk (a cursor reset to its last chunk would
    # deliver that chunk alone, which consumers drop).
    start = F.when(~chunked, pos).otherwise(F.struct(first_ledger.alias("ledger"), first_entry.alias("entry")))
    cut = source_marked.groupBy(*SUB_KEYS).agg(F.min(F.when(~F.col("acked"), start)).alias("cut"))
    rows = source_marked.join(cut, SUB_KEYS).withColumn(
        "in_prefix", F.col("cut").isNull() | (pos < F.col("cut")))
    plan = rows.groupBy(*SUB_KEYS).agg(
        F.max(F.when(F.col("in_prefix"), pos)).alias("prefix_end"), F.first("cut").alias("cut"),
        F.sum(F.when(F.col("acked") & ~F.col("in_prefix"), 1).otherwise(0)).alias("individual_acks"))
    plan = plan.select(
        *SUB_KEYS,
        F.coalesce(F.col("prefix_end.ledger"), F.col("cut.ledger")).alias("reset_ledger"),
        F.coalesce(F.col("prefix_end.entry"), F.col("cut.entry")).alias("reset_entry"),
        F.col("prefix_end").isNotNull().alias("excluded"),
        F.col("individual_acks").cast("long").alias("individual_acks"))
    # A row's own entries: its last chunk back to its first when both are in one ledger (else the last alone).
    spans = chunked & (first_ledger == F.col("target_ledger"))
    entries = F.when(spans, F.sequence(first_entry, F.col("target_entry"))).otherwise(F.array(F.col("target_entry")))
    acks = (rows.where(F.col("acked") & ~F.col("in_prefix"))
            .select(*SUB_KEYS, F.col("target_ledger").alias("ledger"), spans.alias("_span"),
                    F.explode(entries).alias("entry")))
    return plan, _outside_unacked(acks, rows, first_ledger, first_entry)


def _outside_unacked(acks: DataFrame, rows: DataFrame, first_ledger: Column, first_entry: Column) -> DataFrame:
    """`acks` without the entries a chunked message's span shares with unacknowledged messages: their own entry,
    or any entry from their first chunk to their last but the first and last chunks of acknowledged messages (which
    of the entries between are whose the map does not say; an acknowledged message's chunk left out there is a
    lone chunk its consumer drops; a message whose chunks span two ledgers is kept from its first chunk on in the
    first and up to its last in the second). Only the ledgers where an acknowledged span lies are looked at."""
    spanned = acks.where("_span").groupBy(*SUB_KEYS, "ledger").agg(F.min("entry").alias("_lo"),
                                                                   F.max("entry").alias("_hi"))
    unacked = rows.where(~F.col("acked"))
    same = F.col("target_first_chunk").isNull() | (first_ledger == F.col("target_ledger"))
    kept = unacked.select(*SUB_KEYS, F.col("target_ledger").alias("ledger"),
                          F.when(same, F.coalesce(first_entry, F.col("target_entry"))).otherwise(F.lit(0))
                          .alias("_from"), F.col("target_entry").alias("_to")).unionByName(
        unacked.where(~same).select(*SUB_KEYS, first_ledger.alias("ledger"), first_entry.alias("_from"),
                                    F.lit(2**62).cast("long").alias("_to")))
    clipped = (kept.join(spanned, [*SUB_KEYS, "ledger"])
               .select(*SUB_KEYS, "ledger", F.greatest("_from", "_lo").alias("_from"),
                       F.least("_to", "_hi").alias("_to"))
               .where(F.col("_from") <= F.col("_to")))
    keys = [*SUB_KEYS, "ledger", "entry"]
    # An acknowledged message's first and last chunk are its own (the map says so), wherever they lie.
    acked = rows.where(F.col("acked"))
    known = acked.select(*SUB_KEYS, F.col("target_ledger").alias("ledger"), F.col("target_entry").alias("entry")
                         ).unionByName(acked.where(F.col("target_first_chunk").isNotNull())
                                       .select(*SUB_KEYS, first_ledger.alias("ledger"), first_entry.alias("entry")))
    protected = (clipped.select(*SUB_KEYS, "ledger", F.explode(F.sequence("_from", "_to")).alias("entry"))
                 .join(known, keys, "left_anti"))
    return acks.drop("_span").join(protected, keys, "left_anti")


def split_chunks(source_marked: DataFrame) -> int:
    """Acknowledged chunked target messages whose chunks span two ledgers (only their last chunk is acked)."""
    first_ledger = F.split(F.col("target_first_chunk"), ":").getItem(0).cast("long")
    return source_marked.where(F.col("acked") & (first_ledger != F.col("target_ledger"))).count()


def _set_digest(acked: Column) -> Column:
    """An order-free digest of the source entries a side acknowledged (xor of 64-bit hashes; rows are
    unique per subscription, so equal sets give equal digests and a differing entry changes it)."""
    return F.bit_xor(F.when(acked, F.xxhash64("source_ledger", "source_entry")))


def compare(cursors: DataFrame, source_marked: DataFrame, target_marked: DataFrame,
            target_cursors: DataFrame) -> DataFrame:
    """Per source subscription: mapped entries, entries acknowledged on each side, and the messages a
    drain would get twice (`duplicated`: acked on the source, not on the target) or never (`lost`: the
    reverse), the backlogs over the mapped range, whether the target has the subscription, and the first
    target entry where the two disagree."""
    both = source_marked.alias("s").join(
        target_marked.select(*SUB_KEYS, "target_ledger", "target_entry", F.col("acked").alias("target_acked")),
        [*SUB_KEYS, "target_ledger", "target_entry"], "left")
    src, tgt = F.col("acked"), F.coalesce(F.col("target_acked"), F.lit(False))
    msgs = F.col("source_messages")

    def total(condition: Column, value: Column | int = 1) -> Column:
        return F.sum(F.when(condition, value).otherwise(0)).cast("long")

    per_sub = both.groupBy(*SUB_KEYS).agg(
        F.count(F.lit(1)).alias("mapped_entries"),
        total(src).alias("source_acked_entries"), total(tgt).alias("target_acked_entries"),
        total(src & ~tgt, msgs).alias("duplicated"), total(~src & tgt, msgs).alias("lost"),
        total(src & ~tgt).alias("duplicated_entries"), total(~src & tgt).alias("lost_entries"),
        total(~src, msgs).alias("source_backlog"), total(~tgt, F.col("target_messages")).alias("target_backlog"),
        F.min(F.when(src != tgt, _target_position())).alias("first_difference"),
        _set_digest(src).alias("source_digest"), _set_digest(tgt).alias("target_digest"))
    zero = F.lit(0).cast("long")
    present = target_cursors.select(*SUB_KEYS, F.lit(True).alias("on_target"),
                                    F.col("backlog").alias("target_broker_backlog"),
                                    F.col("consumers").alias("target_consumers"))
    return (cursors.select(*SUB_KEYS, "sub_type", F.col("backlog").alias("source_broker_backlog"), "ranges",
                           "md_ledger", "md_entry", "read_at_ms")
            .join(per_sub, SUB_KEYS, "left").join(present, SUB_KEYS, "left")
            .select(*SUB_KEYS, "sub_type", "ranges", "md_ledger", "md_entry", "read_at_ms",
                    *(F.coalesce(F.col(c), zero).alias(c) for c in (
                        "mapped_entries", "source_acked_entries", "target_acked_entries", "duplicated", "lost",
                        "duplicated_entries", "lost_entries", "source_backlog", "target_backlog",
                        "source_digest", "target_digest")),
                    F.coalesce(F.col("on_target"), F.lit(False)).alias("on_target"),
                    "source_broker_backlog", "target_broker_backlog", "target_consumers",
                    F.when(F.col("first_difference").isNotNull(),
                           F.concat_ws(":", F.col("first_difference.ledger"), F.col("first_difference.entry")))
                    .alias("first_difference")))
