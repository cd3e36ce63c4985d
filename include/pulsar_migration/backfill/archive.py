"""The Parquet archive of backfill windows: one row per message, partitioned
`tenant=/namespace=/topic=/date=/window=` under the archive root.

Writing a window replaces exactly that window's partitions (Spark's dynamic partition overwrite), so a re-run
writes the same rows again and changes nothing. Every row carries `digest`, a sha256 of what identifies and
makes up the message; it is computed by one Spark SQL expression both before the write and on the rows read
back, so verification compares like with like (counts, digest sums, and each row's stored digest).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from pulsar_migration.backfill.window import Window, WindowRange
from pulsar_migration.positions import Position
from pulsar_migration.replication.content import schema_version_of
from pulsar_migration.replication.reading import EntryGaps, read_range
from pulsar_migration.replication.skipped import check_chunked_delivered, guide_restarts, ledger_entries
from pulsar_migration.replication.source_ttl import client_gap_tolerance
from pulsar_migration.spec import MigrationSpec
from pulsar_migration.throttle import Caps, throttle

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger(__name__)

PARTITION_COLUMNS = ("tenant", "namespace", "topic", "date", "window")
SORT_COLUMNS = ("partition", "ledger_id", "entry_id", "batch_index")
# Where in the row digest the fields go; "\u0001" never occurs in the decimal numbers and is escaped by to_json.
_DIGEST_FIELDS = ("partition", "ledger_id", "entry_id", "batch_index", "publish_time_ms", "event_time_ms")


def archive_schema() -> Any:
    from pyspark.sql import types as T

    return T.StructType([
        T.StructField("tenant", T.StringType(), False),
        T.StructField("namespace", T.StringType(), False),
        T.StructField("topic", T.StringType(), False),
        T.StructField("partition", T.IntegerType(), False),
        T.StructField("ledger_id", T.LongType(), False),
        T.StructField("entry_id", T.LongType(), False),
        T.StructField("batch_index", T.IntegerType(), False),
        T.StructField("publish_time_ms", T.LongType(), False),
        T.StructField("event_time_ms", T.LongType(), False),
        T.StructField("key", T.StringType(), True),
        T.StructField("properties", T.MapType(T.StringType(), T.StringType()), False),
        T.StructField("payload", T.BinaryType(), False),
        T.StructField("producer_name", T.StringType(), True),
        T.StructField("schema_version", T.LongType(), True),
        T.StructField("date", T.StringType(), False),
        T.StructField("window", T.StringType(), False),
    ])


def digest_column() -> Column:
    """sha256 (hex) of a row's position, times, key, properties (sorted) and payload hash."""
    from pyspark.sql import functions as F

    parts = [F.col(c).cast("string") for c in _DIGEST_FIELDS]
    parts += [F.coalesce(F.to_json(F.array(F.col("key"))), F.lit("null")),
              F.to_json(F.array_sort(F.map_entries(F.col("properties")))),
              F.sha2(F.col("payload"), 256)]
    return F.sha2(F.concat_ws("\u0001", *parts), 256)


def read_window_rows(spec: MigrationSpec, window: Window, caps: Caps | None = None, held_back: Any = None,
                     guards: dict[str, tuple[int, int]] | None = None) -> Any:
    """mapPartitions function: WindowRange -> archive rows (tuples in archive_schema order), read in order, at most
    `caps` per task (its part of the run's rate caps; the seconds they held the reads back are added to the Spark
    accumulator `held_back`). Partitions of topics in `guards` (message TTL, gap tolerance: replication.
    check_source_readers) are read with EntryGaps."""
    from datetime import UTC, datetime

    def rows(ranges: Iterable[WindowRange]) -> Iterator[tuple[Any, ...]]:
        limit = throttle(caps)
        client = spec.source_cluster.pulsar_client()
        admin = spec.source_cluster.admin() if guards else None
        try:
            for wr in ranges:
                if wr.empty:
                    continue
                namespace, topic = wr.local.split("/", 1)
                gaps = EntryGaps(ledger_entries(admin, wr.topic), first=wr.first,
                                 tolerance=client_gap_tolerance(guards[wr.base_topic])) \
                    if admin is not None and wr.base_topic in guards else None
                # A reader started again must not drop a chunked message begun before (replication.skipped).
                passed = guide_restarts(admin, wr.topic, gaps, Position(wr.first.ledger, wr.first.entry - 1)) \
                    if admin is not None and gaps is not None and wr.first is not None else None
                for message, info in read_range(client, wr.topic, None, wr.upper, inclusive_start=wr.first,
                                                gaps=gaps):
                    published = int(message.publish_timestamp())
                    version = schema_version_of(message)
                    payload = bytes(message.data())
                    if limit is not None:
                        waited = limit.take(len(payload))
                        if held_back is not None and waited:
                            held_back.add(waited)
                    yield (spec.tenant, namespace, topic, wr.partition, info.ledger, info.entry, info.batch_index,
                           published, int(message.event_timestamp() or 0), message.partition_key() or None,
                           dict(sorted(message.properties().items())), payload,
                           message.producer_name() or None, version,
                           datetime.fromtimestamp(published / 1000, UTC).strftime("%Y-%m-%d"), window.label)
                if passed is not None and gaps is not None and gaps.rereads and wr.upper is not None:
                    passed.finish(wr.upper)
                    check_chunked_delivered(admin, wr.topic, passed, begun_before=False, restarted=True)
        finally:
            client.close()
            if admin is not None:
                admin.close()

    return rows


def window_frame(spark: SparkSession, spec: MigrationSpec, window: Window, ranges: list[WindowRange],
                 held_back: Any = None, guards: dict[str, tuple[int, int]] | None = None) -> DataFrame:
    """The window's messages as archive rows with their digest (lazy: reading happens when it is evaluated).
    Partitions are read in a few tasks per Spark slot, each on one client: a task and a client per partition took
    the reads of a 300-topic window from 2-9 s to 20-39 s. The archive's order comes from its sort, not the reads."""
    from pulsar_migration.replication.step import task_caps, task_groups

    slots = spark.sparkContext.defaultParallelism
    groups = task_groups([wr for wr in ranges if not wr.empty], slots)
    read = read_window_rows(spec, window, task_caps(spec.copy_caps, len(groups), slots), held_back, guards)
    rdd = (spark.sparkContext.parallelize(groups, max(1, len(groups)))
           .mapPartitions(lambda tasks: read(wr for group in tasks for wr in group)))
    return spark.createDataFrame(rdd, archive_schema()).withColumn("digest", digest_column())


def partition_totals(frame: DataFrame) -> dict[tuple[str, str, int], dict[str, Any]]:
    """Per (namespace, topic, partition): rows, sum of the digests' first 48 bits, last (ledger, entry)."""
    from pyspark.sql import functions as F

    digest_bits = F.conv(F.substring(F.col("digest"), 1, 12), 16, 10).cast("decimal(38,0)")
    rows = (frame.groupBy("namespace", "topic", "partition")
            .agg(F.count(F.lit(1)).alias("rows"), F.sum(digest_bits).alias("digest_sum"),
                 F.max(F.struct("ledger_id", "entry_id")).alias("last"))
            .collect())
    return {(r["namespace"], r["topic"], r["partition"]): {
        "rows": int(r["rows"]), "digest_sum": str(r["digest_sum"]),
        "last": (int(r["last"]["ledger_id"]), int(r["last"]["entry_id"]))} for r in rows}


def write_window(frame: DataFrame, archive: str) -> None:
    """Replaces the window's partitions under the archive root (only those: dynamic partition overwrite)."""
    spark = frame.sparkSession
    previous = spark.conf.get("spark.sql.sources.partitionOverwriteMode")
    spark.conf.set("spark.sql.sources.partitionOverwriteMode", "dynamic")
    try:
        (frame.repartition(*PARTITION_COLUMNS).sortWithinPartitions(*PARTITION_COLUMNS, *SORT_COLUMNS)
         .write.mode("overwrite").partitionBy(*PARTITION_COLUMNS).parquet(archive))
    finally:
        spark.conf.set("spark.sql.sources.partitionOverwriteMode", previous)


def read_archived(spark: SparkSession, archive: str, tenant: str, window: Window) -> DataFrame | None:
    """The archived rows of one tenant's window (None: the archive holds nothing yet)."""
    from pyspark.sql import functions as F
    from pyspark.sql.utils import AnalysisException

    try:
        frame = spark.read.schema(_read_schema()).option("basePath", archive).parquet(archive)
    except AnalysisException:
        return None
    return frame.where((F.col("tenant") == tenant) & (F.col("window") == window.label))


def _read_schema() -> Any:
    from pyspark.sql import types as T

    schema = archive_schema()
    return T.StructType([*schema.fields, T.StructField("digest", T.StringType(), False)])
