"""The position map: for every target entry, the source entry it holds (RUN_DIR/position_map, Parquet).

One row per target entry, built by reading the target after the copy (so it describes exactly what the
target holds, including entries a killed run left unmapped) and checked against the send receipts.
`sync_progress` joins source cursors with it. Each run appends only entries after the map's end per
partition, so rows never repeat; readers still drop duplicates defensively (and compaction relies on it).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pulsar_migration import rundir
from pulsar_migration.positions import Position

log = logging.getLogger(__name__)

POSITION_MAP_DATASET = "position_map"

MAP_SCHEMA = T.StructType([
    T.StructField("topic", T.StringType(), False),             # persistent://t/ns/name[-partition-N]
    T.StructField("partition", T.IntegerType(), False),        # -1: non-partitioned
    T.StructField("source_ledger", T.LongType(), False),
    T.StructField("source_entry", T.LongType(), False),        # a chunked message: its last chunk
    T.StructField("source_messages", T.IntegerType(), False),  # messages in the entry
    T.StructField("source_batched", T.BooleanType(), False),
    T.StructField("source_first_chunk", T.StringType(), True),  # "L:E" of a chunked message's first chunk
    T.StructField("target_ledger", T.LongType(), False),
    T.StructField("target_entry", T.LongType(), False),
    T.StructField("target_messages", T.IntegerType(), False),
    T.StructField("target_batched", T.BooleanType(), False),
    T.StructField("target_first_chunk", T.StringType(), True),
    T.StructField("source_publish_time", T.LongType(), False),  # ms, of the entry's first message
    T.StructField("mode", T.StringType(), False),              # copy | geo
])
KEY_COLUMNS = ("topic", "target_ledger", "target_entry")


@dataclass(frozen=True)
class MapRow:
    topic: str
    partition: int
    source_ledger: int
    source_entry: int
    source_messages: int
    source_batched: bool
    source_first_chunk: str | None
    target_ledger: int
    target_entry: int
    target_messages: int
    target_batched: bool
    target_first_chunk: str | None
    source_publish_time: int
    mode: str

    @property
    def source(self) -> Position:
        return Position(self.source_ledger, self.source_entry)

    @property
    def target(self) -> Position:
        return Position(self.target_ledger, self.target_entry)

    def as_tuple(self) -> tuple:
        # Field by field: dataclasses.astuple deep-copies every value, seconds over a million rows.
        return (self.topic, self.partition, self.source_ledger, self.source_entry, self.source_messages,
                self.source_batched, self.source_first_chunk, self.target_ledger, self.target_entry,
                self.target_messages, self.target_batched, self.target_first_chunk, self.source_publish_time,
                self.mode)


@dataclass(frozen=True)
class MapEnd:
    """The last mapped entry of one partition on both sides, and the lowest target ledger the map holds entries
    of (-1: not read), which the target must still have unless something consumed them (trim_risk)."""

    target: Position
    source: Position
    first_target_ledger: int = -1


def location(run_dir: str) -> str:
    return rundir.join(run_dir, POSITION_MAP_DATASET)


def read_map(spark: SparkSession, run_dir: str) -> DataFrame | None:
    """The map so far (duplicates dropped), or None when this run dir has none yet."""
    path = location(run_dir)
    if not rundir.exists(run_dir, POSITION_MAP_DATASET, spark if not rundir.is_local(run_dir) else None):
        return None
    try:
        return spark.read.schema(MAP_SCHEMA).parquet(path).dropDuplicates(list(KEY_COLUMNS))
    except Exception as exc:  # an empty directory left by a killed first write
        if "Unable to infer schema" in str(exc) or "PATH_NOT_FOUND" in str(exc):
            return None
        raise


def map_ends(position_map: DataFrame) -> DataFrame:
    """Per topic, the last target entry and the source entry it holds (max by target position), and the lowest
    target ledger mapped."""
    last = F.max(F.struct("target_ledger", "target_entry", "source_ledger", "source_entry")).alias("last")
    first = F.min("target_ledger").alias("first_target_ledger")
    return position_map.groupBy("topic").agg(last, first).select(
        "topic",
        F.col("last.target_ledger").alias("target_ledger"), F.col("last.target_entry").alias("target_entry"),
        F.col("last.source_ledger").alias("source_ledger"), F.col("last.source_entry").alias("source_entry"),
        "first_target_ledger",
    )


def collect_ends(spark: SparkSession, run_dir: str) -> dict[str, MapEnd]:
    position_map = read_map(spark, run_dir)
    if position_map is None:
        return {}
    return {row.topic: MapEnd(Position(row.target_ledger, row.target_entry),
                              Position(row.source_ledger, row.source_entry), row.first_target_ledger)
            for row in map_ends(position_map).collect()}


def append(spark: SparkSession, run_dir: str, rows: DataFrame) -> None:
    rows.select(*MAP_SCHEMA.fieldNames()).write.mode("append").parquet(location(run_dir))


# -- in the driver, without Spark jobs (the cutover's final delta: seconds count) ----------------------

def _arrow_schema() -> Any:
    import pyarrow as pa

    kinds = {T.StringType: pa.string(), T.IntegerType: pa.int32(), T.LongType: pa.int64(), T.BooleanType: pa.bool_()}
    return pa.schema([pa.field(f.name, kinds[type(f.dataType)], nullable=f.nullable) for f in MAP_SCHEMA.fields])


def append_local(run_dir: str, rows: Iterable[MapRow]) -> int:
    """Appends rows as one Parquet file written in this process (a local run dir only); returns the count."""
    import pyarrow as pa

    batch = [row.as_tuple() for row in rows]
    schema = _arrow_schema()
    columns = list(zip(*batch, strict=True)) if batch else [() for _ in schema]
    table = pa.Table.from_arrays([pa.array(list(col), type=f.type) for col, f in zip(columns, schema, strict=True)],
                                 schema=schema)
    write_part(run_dir, table, f"part-driver-{uuid.uuid4().hex}.parquet")
    return len(batch)


def write_part(run_dir: str, table: Any, name: str) -> None:
    """Writes one Parquet part file of the map (a local run dir only) under a hidden name, then renames it: a
    reader never sees half a file (readers skip "." names), and a task retried under the same name replaces its
    first attempt's file instead of adding to it."""
    import pyarrow.parquet as pq

    directory = Path(rundir.local_path(location(run_dir)))
    directory.mkdir(parents=True, exist_ok=True)
    staging = directory / f".{name}.{uuid.uuid4().hex}.tmp"
    pq.write_table(table, staging)
    staging.rename(directory / name)


def engine_rows_table(rows_file: str, topic: str, partition: int) -> Any:
    """The copy engine's rows file (replication.engine.ROW_FIELDS and CHUNK_FIELDS, big-endian int64 each) as the
    map's Arrow table, column by column: no Python object per row (an unbatched partition has one row per
    message); only a chunked message's first chunks become strings."""
    import numpy as np
    import pyarrow as pa

    from pulsar_migration.replication.engine import CHUNK_FIELDS, ROW_FIELDS, ROW_LONGS

    values = np.fromfile(rows_file, dtype=">i8").reshape(-1, ROW_LONGS).astype(np.int64)
    count = len(values)
    column = {name: values[:, index] for index, name in enumerate(ROW_FIELDS)}
    schema = _arrow_schema()
    arrays = {
        "topic": pa.array(np.full(count, topic, dtype=object), type=pa.string()),
        "partition": pa.array(np.full(count, partition, dtype=np.int32)),
        "mode": pa.array(np.full(count, "copy", dtype=object), type=pa.string()),
    }
    for index, name in enumerate(CHUNK_FIELDS):
        ledgers, entries = values[:, len(ROW_FIELDS) + 2 * index], values[:, len(ROW_FIELDS) + 2 * index + 1]
        chunked = np.flatnonzero(ledgers >= 0)
        if not len(chunked):
            arrays[name] = pa.nulls(count, type=pa.string())
            continue
        texts = np.full(count, None, dtype=object)
        texts[chunked] = [f"{ledgers[i]}:{entries[i]}" for i in chunked]
        arrays[name] = pa.array(texts, type=pa.string())
    for name in ROW_FIELDS:
        kind = schema.field(name).type
        data = column[name]
        arrays[name] = pa.array(data != 0 if kind == pa.bool_() else data.astype(kind.to_pandas_dtype()), type=kind)
    return pa.Table.from_arrays([arrays[f.name] for f in schema], schema=schema)


def read_local(run_dir: str, topics: Iterable[str] | None = None) -> Any | None:
    """The map rows (of `topics`, or all) as a pandas DataFrame (duplicates dropped), read in this process; None
    when the run dir has no map yet."""
    import pyarrow.dataset as ds

    if not part_files(run_dir):
        return None
    dataset = ds.dataset(rundir.local_path(location(run_dir)), format="parquet", schema=_arrow_schema())
    wanted = None if topics is None else ds.field("topic").isin(list(topics))
    frame = dataset.to_table(filter=wanted).to_pandas()
    return frame.drop_duplicates(list(KEY_COLUMNS))


def ends_local(run_dir: str) -> dict[str, MapEnd]:
    """collect_ends without Spark: per topic, the last mapped entry on both sides."""
    return ends_of(read_local(run_dir))


def ends_of(frame: Any | None) -> dict[str, MapEnd]:
    """Per topic, the last mapped entry on both sides of map rows read by read_local (None: no map)."""
    if frame is None or frame.empty:
        return {}
    by_topic = frame.sort_values(["topic", "target_ledger", "target_entry"]).groupby("topic")
    last, first = by_topic.tail(1), by_topic["target_ledger"].first()  # sorted: the first is the lowest
    return {row.topic: MapEnd(Position(int(row.target_ledger), int(row.target_entry)),
                              Position(int(row.source_ledger), int(row.source_entry)), int(first[row.topic]))
            for row in last.itertuples(index=False)}


SWAPPED_COLUMNS = ("ledger", "entry", "messages", "batched", "first_chunk")


def swap_sides(frame: Any) -> Any:
    """Map rows read by read_local with source and target exchanged: the map of the same entries for a copy
    the other way (a rollback's, or a migration after it)."""
    renames = {}
    for column in SWAPPED_COLUMNS:
        renames[f"source_{column}"], renames[f"target_{column}"] = f"target_{column}", f"source_{column}"
    return frame.rename(columns=renames)


def append_frame_local(run_dir: str, frame: Any) -> int:
    """Appends map rows read by read_local (a pandas DataFrame) as one Parquet file written in this process (a
    local run dir only), without a Python object per row; returns the count."""
    import pyarrow as pa

    table = pa.Table.from_pandas(frame[[f.name for f in MAP_SCHEMA.fields]], schema=_arrow_schema(),
                                 preserve_index=False)
    write_part(run_dir, table, f"part-driver-{uuid.uuid4().hex}.parquet")
    return table.num_rows


# -- compaction (a local run dir) --------------------------------------------------------------------------

# Every run adds a part file per partition it mapped (the engine's and the driver path's parts, Spark's tasks'),
# and reading costs about 1.4 ms a file whatever its size: 1,339 parts of a 1,214-partition tenant took 1.9 s to
# read (ends_local) and 0.07 s once merged into one. The cutover's final delta reads the map inside its hold, so
# small parts are merged at the end of a run once there are this many; larger ones are left as they are (merging
# them again each time would rewrite the bulk of a big map on every run).
COMPACT_MIN_FILES = 16
SMALL_PART_BYTES = 8 * 1024 * 1024


def part_files(run_dir: str) -> list[Path]:
    """The map's part files as readers see them (hidden and underscore names are not data)."""
    directory = Path(rundir.local_path(location(run_dir)))
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir()
                  if p.suffix == ".parquet" and not p.name.startswith((".", "_")) and p.is_file())


def compact_local(run_dir: str, *, min_files: int = COMPACT_MIN_FILES,
                  small_bytes: int = SMALL_PART_BYTES) -> dict[str, Any] | None:
    """Merges the map's small part files into one when there are at least `min_files` of them (a local run dir;
    nothing else may write the map meanwhile). None when there was nothing to do, else what was merged.

    Safe to kill at any point: the merged file appears whole (write_part) before any part it replaces is deleted,
    so a kill in between leaves rows twice, which every reader drops, and the next compaction merges again."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    if not rundir.is_local(run_dir):
        return None
    small = [p for p in part_files(run_dir) if p.stat().st_size < small_bytes]
    if len(small) < min_files:
        return None
    started = time.monotonic()
    table = ds.dataset([str(p) for p in small], format="parquet", schema=_arrow_schema()).to_table()
    frame = table.to_pandas().drop_duplicates(list(KEY_COLUMNS))
    frame = frame.sort_values(["topic", "target_ledger", "target_entry"], kind="stable")
    merged = pa.Table.from_pandas(frame, schema=_arrow_schema(), preserve_index=False)
    write_part(run_dir, merged, f"part-compact-{uuid.uuid4().hex}.parquet")
    for part in small:
        part.unlink(missing_ok=True)
        part.with_name(f".{part.name}.crc").unlink(missing_ok=True)  # Spark's local-filesystem checksum
    done = {"files_merged": len(small), "rows": merged.num_rows, "duplicates_dropped": table.num_rows - len(frame),
            "seconds": round(time.monotonic() - started, 3)}
    log.info("position map: %d small part file(s) merged into one (%d rows, %.2fs)", len(small), merged.num_rows,
             done["seconds"])
    return done
