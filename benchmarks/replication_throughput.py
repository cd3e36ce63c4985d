"""Replication throughput: the replicate_topics copy vs. native geo-replication, a naive loop and the raw client limit.

    .venv/bin/python -m benchmarks.replication_throughput [--mb 48] [--sizes 256,1024,16384]
        [--shapes batched,unbatched] [--partitions 4] [--master local[4]] [--lookup-mb 4]

Against the local cluster pair (cluster-a -> cluster-b), for every data set (message size x batched or
unbatched source, on one partitioned topic), side by side:

* raw: the Python client's limit on one cluster. `produce`: the data set sent as fast as possible (one
  partitioned producer, send_async, flush); `consume`: a reader on the partitioned topic draining it;
  `pipeline`: a producer and a reader running at the same time on a fresh topic, timed until the reader has
  every message (the raw figure the ratios use: a copy reads and writes every message at the same time).
* geo: native geo-replication catching up on a backlog. A fresh tenant (allowedClusters = both clusters on
  both sides) gets the data set on cluster-a first; then the replicator cursor `pulsar.repl.<target>` is
  created at the earliest entry on every partition, the target is added to the namespace's replication
  clusters and the partitions are unloaded. Timed from that policy change until the *target* holds as many
  entries as the source on every partition (the replicator keeps entries 1:1; source stats can lie).
* copy: the replicate_topics step in copy mode, in-process on a warm SparkSession, after sync_metadata
  (not timed in the ratio). Reported twice: its copy phase (the partitions' `copy_s`, all partitions
  running at once when the master has a slot per partition) and the step's whole wall time (inventory,
  deduplication switch-on, copy, read-back verification of both sides, position map, report).
  `delayed_delivery_horizon_s` is 0 here; one extra, smaller unbatched data set (`--lookup-mb`) runs with
  the default -1, where every unbatched entry's delivery time is looked up through the admin API.
* naive: one Python process, one thread: a reader per source partition, a producer per target partition
  (batching as the source had it), send_async, flush at the end; no verification.
* bare: one JVM, a thread per partition, each stored entry received whole and sent as stored
  (benchmarks/java/BareEntryCopy.java): the copy engine without the added properties, the hashes, the
  read-back, deduplication or Spark. The floor of any copy through a third process on this machine.

It writes `benchmarks/results/replication_throughput-<UTC time>.json` and a PNG plot next to it, prints a
markdown table, and deletes every tenant it created (and only those) on both clusters. Throughput is
payload bytes (10^6 bytes per MB) and messages per second of wall time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import struct
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localdev.paths import var_dir
from pulsar_migration.admin import NotFound, PulsarAdmin, seg
from pulsar_migration.replication.geo import StallWatch

from benchmarks import cpu_split, disk_room
from benchmarks.cpu_by_process import process_cpu_seconds
from benchmarks.metadata_scale import Cluster, git_revision, machine

if TYPE_CHECKING:
    import pulsar
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"
METHODS = ("raw", "geo", "copy", "naive", "bare")
NAMESPACE = "ns"
TOPIC = "data"
MAX_PENDING = 5000  # producers' queue; the same as the copy's default messages in flight per partition
RECEIVER_QUEUE = 2000  # readers' queue; the same as the copy's reader
READ_TIMEOUT_MS = 30_000
GEO_POLL_S = 0.1
RETENTION = {"retentionTimeInMinutes": 120, "retentionSizeInMB": 4096}
CLEANUP_WAIT_S = 30.0
MB = 1e6

SOURCE = Cluster("cluster-a", "http://127.0.0.1:8081", "pulsar://127.0.0.1:6651")
TARGET = Cluster("cluster-b", "http://127.0.0.1:8082", "pulsar://127.0.0.1:6652")


class BenchmarkError(RuntimeError):
    """A method did not move the data set completely (one line)."""


@dataclass(frozen=True)
class DataSet:
    size: int  # payload bytes per message
    batched: bool  # the source producer batches (client defaults: 1000 messages, 128 KiB, 10 ms)
    messages: int

    @property
    def name(self) -> str:
        return f"{self.size}B-{'batched' if self.batched else 'unbatched'}"

    @property
    def bytes(self) -> int:
        return self.size * self.messages

    def payloads(self) -> list[bytes]:
        """Distinct payloads of exactly `size` bytes (an 8-byte counter, then random bytes), built before
        any timing starts."""
        block = os.urandom(max(self.size - 8, 0))
        return [(struct.pack(">Q", i) + block)[: self.size] for i in range(self.messages)]


def rate(messages: int, nbytes: int, seconds: float) -> dict[str, Any]:
    return {"s": round(seconds, 3), "msgs_per_s": round(messages / seconds, 1) if seconds > 0 else None,
            "mb_per_s": round(nbytes / MB / seconds, 3) if seconds > 0 else None}


# Before each timed method the harness waits (up to SETTLE_MAX_S, set by --settle) until both brokers are nearly
# idle: what a broker spends right after a data set was written (its bookie flushing it) otherwise lands in the next
# method's window, e.g. geo's, whose backlog is written just before it is timed.
SETTLE_MAX_S = 0.0
SETTLE_IDLE_CORES = 0.25  # both brokers together, over each of two consecutive half-seconds


def settle() -> float:
    """Waits until the local brokers are idle (or SETTLE_MAX_S passed); returns the seconds waited."""
    if SETTLE_MAX_S <= 0:
        return 0.0
    pids = list(cpu_split.broker_pids().values())

    def used() -> float:
        total = 0.0
        for pid in pids:
            with contextlib.suppress(OSError):  # a broker gone meanwhile
                total += process_cpu_seconds(pid)
        return total

    started = time.monotonic()
    quiet, before = 0, used()
    while quiet < 2 and time.monotonic() - started < SETTLE_MAX_S:
        time.sleep(0.5)
        now = used()
        quiet = quiet + 1 if (now - before) / 0.5 < SETTLE_IDLE_CORES else 0
        before = now
    waited = round(time.monotonic() - started, 2)
    log.info("brokers settled in %.1fs%s", waited, "" if quiet >= 2 else " (still busy: gave up)")
    return waited


def load1() -> float:
    return round(os.getloadavg()[0], 2)


# -- tenants ----------------------------------------------------------------------------------------

class Tenants:
    """The tenants this run created, per cluster; geo tenants are un-replicated before deletion."""

    def __init__(self, source: PulsarAdmin, target: PulsarAdmin) -> None:
        self.source, self.target = source, target
        self.created: list[tuple[str, bool, bool, bool]] = []  # (tenant, on source, on target, geo)

    def create(self, tenant: str, *, on_source: bool, on_target: bool, allowed: list[str], partitions: int,
               geo: bool = False) -> str:
        self.created.append((tenant, on_source, on_target, geo))
        for admin, wanted in ((self.source, on_source), (self.target, on_target)):
            if not wanted:
                continue
            admin.put(f"/tenants/{seg(tenant)}", {"adminRoles": [], "allowedClusters": allowed})
            admin.put(f"/namespaces/{seg(tenant)}/{NAMESPACE}")
            if admin is self.source:
                # No subscription holds the data sets (readers and the replicator cursor come later): without
                # retention a ledger roll could trim them first.
                admin.post(f"/namespaces/{seg(tenant)}/{NAMESPACE}/retention", RETENTION)
            admin.put(f"/persistent/{seg(tenant)}/{NAMESPACE}/{TOPIC}/partitions", partitions)
        return tenant

    def cleanup(self) -> float:
        started = time.monotonic()
        for tenant, on_source, on_target, geo in reversed(self.created):
            if geo and on_source:
                self._unreplicate(tenant)
            for admin, present in ((self.source, on_source), (self.target, on_target)):
                if present:
                    self._delete(admin, tenant)
        self.created.clear()
        return round(time.monotonic() - started, 3)

    def _unreplicate(self, tenant: str) -> None:
        """Deliberate, for benchmark tenants only: taking the target out of the namespace's replication
        clusters deletes the topics on the target by cascade (a replicated namespace cannot be deleted).
        Then waits until the source's replicators are gone: a force delete racing their termination left
        topics fenced for good on 4.0.8 ("Topic is already fenced"; the namespace stays marked deleted)."""
        base = f"/persistent/{seg(tenant)}/{NAMESPACE}/{TOPIC}"
        try:
            self.source.post(f"/namespaces/{seg(tenant)}/{NAMESPACE}/replication", [SOURCE.name])
            count = int(self.source.get(f"{base}/partitions")["partitions"])
            deadline = time.monotonic() + CLEANUP_WAIT_S
            while time.monotonic() < deadline:
                stats = self.source.get(f"{base}/partitioned-stats", params={"perPartition": "true"})
                if not any((p.get("replication") or {}) for p in (stats.get("partitions") or {}).values()):
                    break
                time.sleep(0.5)
            else:
                log.warning("replicators of %s still running %.0fs after un-replicating", tenant, CLEANUP_WAIT_S)
            time.sleep(1.0)
            self.source.delete(f"{base}/partitions", params={"force": "true"}, expect_json=False)
            log.debug("deleted %s (%d partitions) on %s", base, count, SOURCE.name)
        except NotFound:
            pass
        except Exception as exc:
            log.warning("could not un-replicate %s/%s on %s: %s", tenant, NAMESPACE, SOURCE.name, exc)

    def _delete(self, admin: PulsarAdmin, tenant: str) -> None:
        for attempt in range(3):
            try:
                admin.delete(f"/tenants/{seg(tenant)}", params={"force": "true"}, expect_json=False)
                return
            except NotFound:
                return
            except Exception as exc:  # keep deleting the rest
                if attempt == 2:
                    log.warning("could not delete tenant %s on %s: %s", tenant, admin.name,
                                str(exc).splitlines()[0])
                time.sleep(2.0)


def topic_name(tenant: str) -> str:
    return f"persistent://{tenant}/{NAMESPACE}/{TOPIC}"


def partition_entries(admin: PulsarAdmin, tenant: str) -> list[int]:
    """Entries stored per partition (internalStats numberOfEntries; survives unloads, unlike counters)."""
    stats = admin.get(f"/persistent/{seg(tenant)}/{NAMESPACE}/{TOPIC}/partitioned-internalStats")
    parts = stats["partitions"]
    return [int(parts[name]["numberOfEntries"]) for name in sorted(parts, key=lambda n: int(n.rsplit("-", 1)[1]))]


# -- the Python client ------------------------------------------------------------------------------

def client(cluster: Cluster) -> pulsar.Client:
    import pulsar

    return pulsar.Client(cluster.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn),
                         operation_timeout_seconds=60)


def producer_for(c: pulsar.Client, topic: str, batched: bool) -> pulsar.Producer:
    return c.create_producer(topic, batching_enabled=batched, block_if_queue_full=True,
                             max_pending_messages=MAX_PENDING, send_timeout_millis=60_000)


def produce(c: pulsar.Client, topic: str, ds: DataSet, payloads: list[bytes]) -> float:
    """Sends the data set through one producer on the partitioned topic as fast as it goes; seconds."""
    producer = producer_for(c, topic, ds.batched)
    try:
        started = time.monotonic()
        for payload in payloads:
            producer.send_async(payload, None)
        producer.flush()
        return time.monotonic() - started
    finally:
        producer.close()


def drain(c: pulsar.Client, topic: str, expected: int, reader: Any = None) -> float:
    """Reads `expected` messages of the (partitioned) topic from the earliest with one reader; seconds."""
    import pulsar

    reader = reader or c.create_reader(topic, pulsar.MessageId.earliest, receiver_queue_size=RECEIVER_QUEUE)
    try:
        started = time.monotonic()
        for got in range(expected):
            try:
                reader.read_next(READ_TIMEOUT_MS)
            except pulsar.Timeout:
                raise BenchmarkError(f"{topic}: only {got} of {expected} message(s) arrived") from None
        return time.monotonic() - started
    finally:
        reader.close()


# -- the four methods -------------------------------------------------------------------------------

def method_raw(ds: DataSet, payloads: list[bytes], src_tenant: str, raw_tenant: str) -> dict[str, Any]:
    """produce (builds the copy's source topic) + consume of it, then the concurrent pipeline on raw_tenant."""
    import pulsar

    c, reading = client(SOURCE), client(SOURCE)
    try:
        out: dict[str, Any] = {"load1": load1()}
        out["produce"] = rate(ds.messages, ds.bytes, produce(c, topic_name(src_tenant), ds, payloads))
        out["consume"] = rate(ds.messages, ds.bytes, drain(reading, topic_name(src_tenant), ds.messages))
        topic = topic_name(raw_tenant)
        # Two clients (two connections), as the copy has one for its source and one for its target.
        reader = reading.create_reader(topic, pulsar.MessageId.earliest, receiver_queue_size=RECEIVER_QUEUE)
        errors: list[BaseException] = []

        def read_all() -> None:
            try:
                drain(reading, topic, ds.messages, reader)
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=read_all, name="raw-pipeline-reader")
        started = time.monotonic()
        thread.start()
        produce_s = produce(c, topic, ds, payloads)
        thread.join()
        elapsed = time.monotonic() - started
        if errors:
            raise errors[0]
        out["pipeline"] = {**rate(ds.messages, ds.bytes, elapsed), "produce_s": round(produce_s, 3)}
        out.update({k: out["pipeline"][k] for k in ("msgs_per_s", "mb_per_s")})
        return out
    finally:
        c.close()
        reading.close()


def method_geo(ds: DataSet, payloads: list[bytes], tenant: str, src: PulsarAdmin, tgt: PulsarAdmin,
               timeout_s: float) -> dict[str, Any]:
    """Backlog on the source first, then replication turned on (seed recipe); timed on the target."""
    c = client(SOURCE)
    try:
        produce_s = produce(c, topic_name(tenant), ds, payloads)
    finally:
        c.close()
    want = partition_entries(src, tenant)
    out: dict[str, Any] = {"produce": rate(ds.messages, ds.bytes, produce_s), "source_entries": sum(want),
                           "settle_s": settle(), "load1": load1()}
    cursor = f"pulsar.repl.{TARGET.name}"
    base = f"/persistent/{seg(tenant)}/{NAMESPACE}/{TOPIC}"
    for i in range(len(want)):
        src.put(f"{base}-partition-{i}/subscription/{seg(cursor)}", {"ledgerId": -1, "entryId": -1})
    started = time.monotonic()
    src.post(f"/namespaces/{seg(tenant)}/{NAMESPACE}/replication", [SOURCE.name, TARGET.name])
    for i in range(len(want)):
        src.put(f"{base}-partition-{i}/unload")
    # An unloaded partition stays unloaded until something looks it up, and without a loaded topic there is
    # no replicator: with no clients attached (a backlog only), nothing would ever be replicated. Load each
    # partition again through the admin API (what a reconnecting client does by itself).
    for i in range(len(want)):
        src.get(f"{base}-partition-{i}/stats")
    out["enable_s"] = round(time.monotonic() - started, 3)
    first: float | None = None
    have = [0] * len(want)
    # The step's rule for a replicator stuck after a failed read (seen here on 768 MB of 128 KiB batches:
    # the source broker ran out of direct memory): restart it by an unload once nothing moved for 30 s.
    stalls = StallWatch()
    while True:
        have = partition_entries(tgt, tenant)
        now = time.monotonic()
        if first is None and any(have):
            first = now
        if all(h >= w for h, w in zip(have, want, strict=True)):
            break
        if now - started > timeout_s:
            raise BenchmarkError(f"geo: target holds {sum(have)} of {sum(want)} entries after {timeout_s:.0f}s")
        for i, (h, w) in enumerate(zip(have, want, strict=True)):
            if h >= w:
                stalls.forget(str(i))
            elif stalls.stalled(str(i), h, now):
                log.warning("geo: partition %d stuck at %d of %d entries: unloading it", i, h, w)
                src.put(f"{base}-partition-{i}/unload")
                src.get(f"{base}-partition-{i}/stats")
        time.sleep(GEO_POLL_S)
    out["stalled_replicators_restarted"] = stalls.restarts
    done = time.monotonic()
    first = first or done
    # What the source's replicator stats said at that moment (they can lag behind the target).
    stats = src.get(f"{base}/partitioned-stats", params={"perPartition": "true"})
    out["source_replicator_at_done"] = {
        name.rsplit("-", 1)[1]: {k: (p.get("replication") or {}).get(TARGET.name, {}).get(k)
                                 for k in ("replicationBacklog", "connected")}
        for name, p in sorted((stats.get("partitions") or {}).items())}
    out["target_entries"] = sum(have)
    out["first_entry_s"] = round(first - started, 3)
    out["catch_up"] = rate(ds.messages, ds.bytes, done - started)
    # From the first replicated entry on: the replicator's rate without its start-up delay.
    out["after_first_entry"] = rate(ds.messages, ds.bytes, done - first) if done > first else None
    out.update({k: out["catch_up"][k] for k in ("msgs_per_s", "mb_per_s")})
    return out


def write_spec(path: Path, tenant: str, options: dict[str, Any]) -> Path:
    spec = {
        "tenant": tenant, "source": SOURCE.name, "target": TARGET.name,
        "clusters": {c.name: {"admin_url": c.admin_url, "service_url": c.service_url, "token_env": None,
                              "tls": None} for c in (SOURCE, TARGET)},
        "options": options,
    }
    path.write_text(json.dumps(spec))
    return path


def copy_step(spec: Path, run_dir: Path, messages: int) -> tuple[float, float, float, dict[str, Any]]:
    """sync_metadata, then replicate_topics timed, in-process: (sync seconds, seconds waited for idle brokers
    before the step, step seconds, the step's report).
    BenchmarkError unless the step succeeded and copied exactly `messages`, all of them on the target."""
    from pulsar_migration.metadata.step import run as meta_run
    from pulsar_migration.replication.step import STEP, run
    from pulsar_migration.stepjob import run_step

    started = time.monotonic()
    if run_step("sync_metadata", meta_run, ["--spec", str(spec), "--run-dir", str(run_dir)]) != 0:
        raise BenchmarkError(f"sync_metadata failed (run dir {run_dir})")
    sync_s = time.monotonic() - started
    settle_s = settle()
    started = time.monotonic()
    code = run_step(STEP, run, ["--spec", str(spec), "--run-dir", str(run_dir)])
    wall = time.monotonic() - started
    report = json.loads((run_dir / f"{STEP}.json").read_text())
    if code != 0 or report.get("verdict") != "ok":
        raise BenchmarkError(f"replicate_topics exited {code}, verdict {report.get('verdict')} (run dir {run_dir})")
    counts = report["counts"]
    if counts["copied_messages"] != messages or counts["target_messages"] != messages:
        raise BenchmarkError(f"copy: {counts['copied_messages']} copied, {counts['target_messages']} on the target, "
                             f"{messages} expected")
    return sync_s, settle_s, wall, report


def method_copy(ds: DataSet, tenant: str, work: Path, slots: int, options: dict[str, Any]) -> dict[str, Any]:
    """sync_metadata, then replicate_topics in-process; the source topic must hold the data set already."""
    spec = write_spec(work / f"spec-{tenant}.json", tenant, options)
    run_dir = work / f"run-{tenant}"
    sync_s, settle_s, wall, report = copy_step(spec, run_dir, ds.messages)
    out: dict[str, Any] = {"load1": load1(), "options": options, "sync_metadata_s": round(sync_s, 3),
                           "settle_s": settle_s}
    counts, details = report["counts"], report["details"]
    parts = details["partitions"]
    copy_s = [p["copy_s"] for p in parts]
    verify_s = [p["verify_s"] for p in parts]
    # Tasks run at once when there is a slot per partition: then the copy phase ends with the slowest
    # partition's copy. With fewer slots the tasks run in waves: the copying time summed over slots.
    concurrent = slots >= len(parts)
    engines = sorted({p.get("copy_engine") or "python" for p in parts})
    engine_s = details.get("engine_phase_s") if any(e.startswith("java") for e in engines) else None
    # The engine's read-back of each partition's target, right after that partition's copy, in the same job.
    scans = [(p.get("engine_times") or {}).get("partition_scan_s") or 0 for p in parts]
    if engine_s:  # the Java engine copied every partition in one Spark job: its wall time is the copy phase
        phase = engine_s - max(scans)
        basis = ("the engine phase's Spark job, wall (tasks, JVM start and resume reads included), less its "
                 "slowest partition's read-back of the target (the job's judging and map rows stay in)")
    elif concurrent:
        phase, basis = max(copy_s), "max partition copy_s (all partitions at once)"
    else:
        phase, basis = sum(copy_s) / max(slots, 1), f"sum of partition copy_s / {slots} slots (estimate: waves)"
    out.update({
        "step_wall": rate(ds.messages, ds.bytes, wall),
        "copy_phase": rate(ds.messages, ds.bytes, phase),
        "copy_phase_basis": basis, "copy_engine": "+".join(engines), "engine_phase_s": engine_s,
        "replicate_s": details.get("replicate_s"), "inventory_s": details.get("inventory_s"),
        "prepare_s": details.get("prepare_s"), "partition_copy_s": copy_s, "partition_verify_s": verify_s,
        "partition_engine_scan_s": scans, "verified_by": sorted({p.get("verified_by") or "-" for p in parts}),
        "copied_messages": counts["copied_messages"], "copied_entries": counts["copied_entries"],
        "target_entries": counts["target_entries"], "delivery_time_lookups": counts.get("delivery_time_lookups"),
        "run_dir": str(run_dir),
    })
    out["other_s"] = round(wall - sum(v or 0 for v in (out["replicate_s"], out["inventory_s"], out["prepare_s"])), 3)
    out.update({k: out["copy_phase"][k] for k in ("msgs_per_s", "mb_per_s")})
    return out


def method_naive(ds: DataSet, src_tenant: str, tgt_tenant: str, partitions: int) -> dict[str, Any]:
    """Reader -> producer, partition after partition, in one thread; flush at the end, nothing verified."""
    import pulsar

    src_c, tgt_c = client(SOURCE), client(TARGET)
    producers = []
    try:
        out: dict[str, Any] = {"load1": load1()}
        copied = 0
        started = time.monotonic()
        for i in range(partitions):
            reader = src_c.create_reader(f"{topic_name(src_tenant)}-partition-{i}", pulsar.MessageId.earliest,
                                         receiver_queue_size=RECEIVER_QUEUE)
            producer = producer_for(tgt_c, f"{topic_name(tgt_tenant)}-partition-{i}", ds.batched)
            producers.append(producer)
            try:
                while reader.has_message_available():
                    message = reader.read_next(READ_TIMEOUT_MS)
                    producer.send_async(message.data(), None, properties=message.properties(),
                                        partition_key=message.partition_key() or None,
                                        event_timestamp=message.event_timestamp() or None)
                    copied += 1
            finally:
                reader.close()
        for producer in producers:
            producer.flush()
        elapsed = time.monotonic() - started
        if copied != ds.messages:
            raise BenchmarkError(f"naive: read {copied} of {ds.messages} message(s)")
        out["loop"] = rate(ds.messages, ds.bytes, elapsed)
        out.update({k: out["loop"][k] for k in ("msgs_per_s", "mb_per_s")})
        return out
    finally:
        for producer in producers:
            producer.close()
        src_c.close()
        tgt_c.close()


def method_bare(ds: DataSet, src_tenant: str, tgt_tenant: str, src: PulsarAdmin, tgt: PulsarAdmin,
                adds: tuple[str, ...] = ()) -> dict[str, Any]:
    """The bare entry copy of every partition at once (with `adds` of the engine's work); the target must then
    hold the source's entries."""
    from benchmarks import bare_entry_copy

    entries = partition_entries(src, src_tenant)
    parts = [bare_entry_copy.Partition(f"{topic_name(src_tenant)}-partition-{i}",
                                       f"{topic_name(tgt_tenant)}-partition-{i}", n) for i, n in enumerate(entries)]
    out: dict[str, Any] = {"settle_s": settle(), "load1": load1(), "adds": list(adds)}
    started = time.monotonic()
    figures = bare_entry_copy.run(SOURCE.service_url, TARGET.service_url, parts, adds)
    process_s = time.monotonic() - started
    stored = partition_entries(tgt, tgt_tenant)
    if stored != entries or figures["messages"] != ds.messages:
        raise BenchmarkError(f"bare: target holds {stored} entries per partition, source {entries}; "
                             f"{figures['messages']} of {ds.messages} message(s) sent")
    out.update({"figures": figures, "process": rate(ds.messages, ds.bytes, process_s),
                "copy": rate(ds.messages, ds.bytes, figures["copy_ms"] / 1000)})
    out.update({k: out["copy"][k] for k in ("msgs_per_s", "mb_per_s")})
    return out


# -- one data set -----------------------------------------------------------------------------------

# The copy's spec options (--copy-engine adds copy_engine).
COPY_OPTIONS: dict[str, Any] = {"delayed_delivery_horizon_s": 0}


def copy_option(text: str) -> tuple[str, Any]:
    """KEY=VALUE, VALUE read as JSON (a bare word stays text)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"{text!r} is not KEY=VALUE")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def run_dataset(ds: DataSet, methods: list[str], partitions: int, slots: int, work: Path, tenants: Tenants,
                geo_timeout_s: float, bare_also: tuple[str, ...] = ()) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:6]
    a, b = SOURCE.name, TARGET.name
    log.info("data set %s: %d messages, %.1f MB on %d partitions", ds.name, ds.messages, ds.bytes / MB, partitions)
    payloads = ds.payloads()
    result: dict[str, Any] = {"name": ds.name, "size": ds.size, "batched": ds.batched, "messages": ds.messages,
                              "bytes": ds.bytes, "partitions": partitions, "methods": {}}
    res = result["methods"]
    # The copy's source topic is the raw method's produce target (or built untimed without it).
    src = tenants.create(f"bench-rt-copy-{tag}", on_source=True, on_target=False, allowed=[a], partitions=partitions)
    if "raw" in methods:
        raw = tenants.create(f"bench-rt-raw-{tag}", on_source=True, on_target=False, allowed=[a],
                             partitions=partitions)
        res["raw"] = method_raw(ds, payloads, src, raw)
        log.info("%s raw: produce %.1f MB/s, consume %.1f MB/s, pipeline %.1f MB/s", ds.name,
                 res["raw"]["produce"]["mb_per_s"], res["raw"]["consume"]["mb_per_s"], res["raw"]["mb_per_s"])
    elif {"copy", "naive", "bare"} & set(methods):
        c = client(SOURCE)
        try:
            produce(c, topic_name(src), ds, payloads)
        finally:
            c.close()
    if "naive" in methods:
        tgt = tenants.create(f"bench-rt-naive-{tag}", on_source=False, on_target=True, allowed=[b],
                             partitions=partitions)
        res["naive"] = method_naive(ds, src, tgt, partitions)
        log.info("%s naive: %.1f MB/s", ds.name, res["naive"]["mb_per_s"])
    if "bare" in methods:
        # The bare copy, then each variant with some of the engine's work added back ("tags+hash": both).
        for number, variant in enumerate(("", *bare_also)):
            tgt = tenants.create(f"bench-rt-bare{number}-{tag}", on_source=False, on_target=True, allowed=[b],
                                 partitions=partitions)
            name = f"bare+{variant}" if variant else "bare"
            res[name] = method_bare(ds, src, tgt, tenants.source, tenants.target,
                                    tuple(variant.split("+")) if variant else ())
            log.info("%s %s: %.1f MB/s (process %.1f MB/s)", ds.name, name, res[name]["mb_per_s"],
                     res[name]["process"]["mb_per_s"])
    if "copy" in methods:
        tenants.created.append((src, False, True, False))  # sync_metadata creates it on the target
        res["copy"] = method_copy(ds, src, work, slots, dict(COPY_OPTIONS))
        log.info("%s copy: copy phase %.1f MB/s, step wall %.1f MB/s", ds.name, res["copy"]["mb_per_s"],
                 res["copy"]["step_wall"]["mb_per_s"])
    if "geo" in methods:
        geo = tenants.create(f"bench-rt-geo-{tag}", on_source=True, on_target=True, allowed=[a, b],
                             partitions=partitions, geo=True)
        res["geo"] = method_geo(ds, payloads, geo, tenants.source, tenants.target, geo_timeout_s)
        log.info("%s geo: %.1f MB/s (first entry after %.1fs)", ds.name, res["geo"]["mb_per_s"],
                 res["geo"]["first_entry_s"])
    copy, geo_r, raw_r = res.get("copy"), res.get("geo"), res.get("raw")
    result["ratios"] = {
        "copy_phase_vs_geo": ratio(copy and copy["mb_per_s"], geo_r and geo_r["mb_per_s"]),
        "copy_wall_vs_geo": ratio(copy and copy["step_wall"]["mb_per_s"], geo_r and geo_r["mb_per_s"]),
        "copy_phase_vs_raw_pipeline": ratio(copy and copy["mb_per_s"], raw_r and raw_r["mb_per_s"]),
        "copy_wall_vs_raw_pipeline": ratio(copy and copy["step_wall"]["mb_per_s"], raw_r and raw_r["mb_per_s"]),
        "copy_phase_vs_raw_produce": ratio(copy and copy["mb_per_s"], raw_r and raw_r["produce"]["mb_per_s"]),
        "copy_phase_vs_naive": ratio(copy and copy["mb_per_s"], res.get("naive") and res["naive"]["mb_per_s"]),
        "bare_vs_geo": ratio(res.get("bare") and res["bare"]["mb_per_s"], geo_r and geo_r["mb_per_s"]),
        "copy_wall_vs_bare": ratio(copy and copy["step_wall"]["mb_per_s"],
                                   res.get("bare") and res["bare"]["mb_per_s"]),
    }
    return result


def run_lookup(size: int, messages: int, partitions: int, slots: int, work: Path, tenants: Tenants) -> dict[str, Any]:
    """The Python path's copy of an unbatched data set with the default delayed_delivery_horizon_s (-1): one
    admin-API entry read per unbatched message for its delivery time (the engine reads it from the entry, so
    under copy_engine auto this set made no lookups at all since the engine took unbatched partitions)."""
    ds = DataSet(size, False, messages)
    tag = uuid.uuid4().hex[:6]
    src = tenants.create(f"bench-rt-lookup-{tag}", on_source=True, on_target=False, allowed=[SOURCE.name],
                         partitions=partitions)
    c = client(SOURCE)
    try:
        produce(c, topic_name(src), ds, ds.payloads())
    finally:
        c.close()
    tenants.created.append((src, False, True, False))
    out = method_copy(ds, src, work, slots, {"copy_engine": "python"})
    log.info("%s copy with delivery-time lookups: copy phase %.2f MB/s, %d lookups", ds.name, out["mb_per_s"],
             out["delivery_time_lookups"] or 0)
    return {"name": ds.name, "size": size, "batched": False, "messages": messages, "bytes": ds.bytes, "copy": out}


# -- output -----------------------------------------------------------------------------------------

def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def table(result: dict[str, Any]) -> list[str]:
    lines = [
        "| data set | messages | raw produce MB/s | raw consume MB/s | raw pipeline MB/s (msg/s) | native geo MB/s "
        "(msg/s) | geo first entry (s) | copy phase MB/s (msg/s) | copy step wall MB/s | naive loop MB/s | "
        "copy phase / geo | copy wall / geo | copy phase / raw pipeline | copy wall / raw pipeline | bare entry copy "
        "MB/s | bare / geo | copy wall / bare |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for ds in result["datasets"]:
        m, r = ds["methods"], ds["ratios"]
        raw, geo, copy, naive = m.get("raw"), m.get("geo"), m.get("copy"), m.get("naive")
        lines.append(
            f"| {ds['name']} | {ds['messages']:,} "
            f"| {_fmt(raw and raw['produce']['mb_per_s'])} | {_fmt(raw and raw['consume']['mb_per_s'])} "
            f"| {_fmt(raw and raw['mb_per_s'])} ({_fmt(raw and raw['msgs_per_s'], 0)}) "
            f"| {_fmt(geo and geo['mb_per_s'])} ({_fmt(geo and geo['msgs_per_s'], 0)}) "
            f"| {_fmt(geo and geo['first_entry_s'])} "
            f"| {_fmt(copy and copy['mb_per_s'])} ({_fmt(copy and copy['msgs_per_s'], 0)}) "
            f"| {_fmt(copy and copy['step_wall']['mb_per_s'])} | {_fmt(naive and naive['mb_per_s'])} "
            f"| {_x(r['copy_phase_vs_geo'])} | {_x(r['copy_wall_vs_geo'])} | {_x(r['copy_phase_vs_raw_pipeline'])} "
            f"| {_x(r['copy_wall_vs_raw_pipeline'])} | {_fmt(m.get('bare') and m['bare']['mb_per_s'])} "
            f"| {_x(r.get('bare_vs_geo'))} | {_x(r.get('copy_wall_vs_bare'))} |"
        )
    variants = [(ds["name"], name, method) for ds in result["datasets"] for name, method in ds["methods"].items()
                 if name.startswith("bare+")]
    if variants:
        lines.append("\nThe bare entry copy with some of the engine's work added back:")
        lines += [f"- {ds_name}, {name}: {_fmt(method['mb_per_s'])} MB/s" for ds_name, name, method in variants]
    split = result.get("cpu_split")
    if split:
        lines.append(f"\nCPU split: both brokers on CPUs {split['brokers']}, the benchmark and everything it started "
                     f"(Spark, the engine, the raw, naive and bare clients) on CPUs {split['clients']}.")
    lookup = result.get("lookup")
    if lookup:
        cp = lookup["copy"]
        lines.append(f"\nCopy with delivery-time lookups (default delayed_delivery_horizon_s -1), {lookup['name']}, "
                     f"{lookup['messages']:,} messages: copy phase {_fmt(cp['mb_per_s'], 2)} MB/s "
                     f"({_fmt(cp['msgs_per_s'], 0)} msg/s), step wall {_fmt(cp['step_wall']['mb_per_s'], 2)} MB/s, "
                     f"{cp['delivery_time_lookups']:,} lookups")
    return lines


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = {"raw pipeline": ("raw", lambda m: m), "native geo": ("geo", lambda m: m),
              "copy phase": ("copy", lambda m: m), "copy step wall": ("copy", lambda m: m["step_wall"]),
              "naive loop": ("naive", lambda m: m), "bare entry copy": ("bare", lambda m: m)}
    colors = dict(zip(series, ("black", "tab:blue", "tab:red", "tab:orange", "tab:green", "tab:purple"),
                      strict=True))
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2))
    for ax, key, label in ((axes[0], "mb_per_s", "MB/s (payload)"), (axes[1], "msgs_per_s", "messages/s")):
        for name, (method, pick) in series.items():
            for batched, style in ((True, "-"), (False, "--")):
                points = sorted((ds["size"], pick(ds["methods"][method])[key]) for ds in result["datasets"]
                                if ds["batched"] == batched and method in ds["methods"])
                if points:
                    ax.plot([p[0] for p in points], [p[1] for p in points], style, marker="o", color=colors[name],
                            label=f"{name}, {'batched' if batched else 'unbatched'} source")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        sizes = sorted({ds["size"] for ds in result["datasets"]})
        ax.set_xticks(sizes, [f"{s} B" if s < 1024 else f"{s // 1024} KiB" for s in sizes])
        ax.set_xlabel("message size")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7, loc="best")
    split = result.get("cpu_split")
    pinned = f", brokers on CPUs {split['brokers']}, clients on {split['clients']}" if split else ""
    fig.suptitle(f"Replication throughput, cluster-a -> cluster-b, {result['partitions']} partitions, "
                 f"Spark {result['master']}{pinned}, {result['started']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- main -------------------------------------------------------------------------------------------

def start_spark(master: str) -> tuple[SparkSession, bool, float]:
    """A warm session for the in-process steps: an already active one is reused (and not stopped later)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    owned = SparkContext._active_spark_context is None
    started = time.monotonic()
    spark = (SparkSession.builder.master(master).appName("replication-throughput-benchmark")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "8").config("spark.sql.session.timeZone", "UTC").getOrCreate())
    if owned:
        spark.sparkContext.setLogLevel("WARN")
    spark.sparkContext.parallelize(range(4), 2).map(lambda x: x).collect()
    return spark, owned, round(time.monotonic() - started, 3)


def _csv(kind: type, allowed: tuple[Any, ...] | None = None) -> Any:
    def parse(text: str) -> list[Any]:
        values = [kind(v.strip()) for v in text.split(",") if v.strip()]
        bad = [v for v in values if allowed is not None and v not in allowed]
        if not values or bad:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {allowed or kind.__name__}")
        return values
    return parse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.replication_throughput",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=48.0, help="payload MB (10^6 bytes) per data set (default 48)")
    parser.add_argument("--messages", type=int, default=None, help="messages per data set (overrides --mb)")
    parser.add_argument("--sizes", type=_csv(int), default=[256, 1024, 16384],
                        help="message sizes in bytes, >= 8 (default 256,1024,16384)")
    parser.add_argument("--shapes", type=_csv(str, ("batched", "unbatched")), default=["batched", "unbatched"],
                        help="source producer batching (default batched,unbatched)")
    parser.add_argument("--methods", type=_csv(str, METHODS), default=list(METHODS),
                        help=f"methods to run (default {','.join(METHODS)})")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of the topic (default 4)")
    parser.add_argument("--master", default="local[4]",
                        help="Spark master of the in-process session (default local[4]: one task slot per partition)")
    parser.add_argument("--lookup-size", type=int, default=1024,
                        help="message size of the unbatched data set copied with delivery-time lookups (default 1024)")
    parser.add_argument("--lookup-mb", type=float, default=4.0,
                        help="its payload MB (default 4; 0 = skip; --messages applies too)")
    parser.add_argument("--geo-timeout", type=float, default=600.0, help="seconds to wait for geo catch-up")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR, help="where the JSON and PNG go")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="where specs and step run dirs go (default: a new temporary directory, kept)")
    parser.add_argument("--copy-engine", choices=("auto", "java", "python"), default=None,
                        help="the copy's options.copy_engine (default: the spec default, auto)")
    parser.add_argument("--copy-option", action="append", default=[], metavar="KEY=VALUE",
                        help="another spec option of the copy, VALUE as JSON (e.g. copy_max_in_flight=20000); "
                             "repeatable")
    parser.add_argument("--bare-also", type=_csv(str, ("tags", "hash", "tags+hash")), default=[],
                        help="after the bare copy, variants with some of the engine's work added back: tags (the two "
                             "properties), hash, tags+hash (default none)")
    parser.add_argument("--cpu-split", default=None, metavar="BROKERS/CLIENTS",
                        help="e.g. 0/1: both brokers pinned to the first CPU list, this process and everything it "
                             "starts (Spark, the engine, the raw, naive and bare clients) to the second, as when "
                             "the clusters and the Spark executors run on hosts of their own (benchmarks/cpu_split.py)")
    parser.add_argument("--settle", type=float, default=20.0, metavar="SECONDS",
                        help="before each timed copy, bare copy and geo catch-up, wait up to this long for both "
                             "brokers to be idle (default 20; 0 = no wait)")
    parser.add_argument("--skip-disk-check", action="store_true",
                        help="start even when the local clusters' disk looks too full for the run's data")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    parser.add_argument("--keep", action="store_true", help="do not delete the benchmark tenants")
    args = parser.parse_args(argv)
    if min(args.sizes) < 8 or args.partitions < 1:
        parser.error("sizes must be >= 8 bytes and partitions >= 1")
    try:
        args.copy_options = dict(copy_option(text) for text in args.copy_option)
    except ValueError as error:
        parser.error(f"--copy-option: {error}")
    pinned: tuple[set[int], set[int]] | None = None
    if args.cpu_split:
        try:
            brokers, _, clients = args.cpu_split.partition("/")
            pinned = (cpu_split.parse_cpus(brokers), cpu_split.parse_cpus(clients))
        except ValueError as error:
            parser.error(f"--cpu-split {args.cpu_split!r}: {error}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for chatty in ("py4j", "urllib3"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    with contextlib.ExitStack() as stack:
        split = stack.enter_context(cpu_split.split(*pinned)) if pinned else None
        return run(args, split)


def run(args: argparse.Namespace, split: dict[str, object] | None) -> int:
    """The benchmark proper; `split` is what --cpu-split pinned (None: nothing)."""
    src_admin = PulsarAdmin(SOURCE.admin_url, name=SOURCE.name, timeout_s=120.0)
    tgt_admin = PulsarAdmin(TARGET.admin_url, name=TARGET.name, timeout_s=120.0)
    for admin in (src_admin, tgt_admin):
        if not admin.healthy():
            print(f"error: cluster {admin.name} at {admin.admin_url} is not healthy", file=sys.stderr)
            return 1

    global SETTLE_MAX_S
    SETTLE_MAX_S = max(0.0, args.settle)
    COPY_OPTIONS.update(args.copy_options)
    if args.copy_engine:
        COPY_OPTIONS["copy_engine"] = args.copy_engine

    def count(size: int, mb: float) -> int:
        return args.messages if args.messages else max(1, round(mb * MB / size))

    datasets = [DataSet(size, shape == "batched", count(size, args.mb)) for shape in args.shapes
                for size in args.sizes]
    lookup_messages = count(args.lookup_size, args.lookup_mb) if "copy" in args.methods and args.lookup_mb > 0 else 0
    if not args.skip_disk_check:  # before anything is built or written
        payload = sum(ds.bytes for ds in datasets) + args.lookup_size * lookup_messages
        short = disk_room.shortage(var_dir() / "pulsar", disk_room.bytes_needed(payload, len(args.methods)))
        if short:
            print(f"error: {short}", file=sys.stderr)
            return 1
    engine_build_s = None
    if {"copy", "bare"} & set(args.methods):  # the engine is built on first use: not inside a timed copy
        from pulsar_migration.replication import engine

        if engine.unavailable_reason() is None:
            started = time.monotonic()
            engine.compiled(engine.pulsar_lib())  # type: ignore[arg-type]
            if "bare" in args.methods:
                from benchmarks import bare_entry_copy

                bare_entry_copy.compiled()
            engine_build_s = round(time.monotonic() - started, 3)

    stamp = datetime.now(UTC)
    result: dict[str, Any] = {
        "benchmark": "replication_throughput", "started": stamp.isoformat(timespec="seconds"),
        "mb_per_dataset": None if args.messages else args.mb, "partitions": args.partitions,
        "methods": args.methods, "master": args.master, "machine": machine(), "git": git_revision(),
        "producer": {"max_pending_messages": MAX_PENDING, "block_if_queue_full": True,
                     "batching": "client defaults (1000 messages, 128 KiB, 10 ms) when batched"},
        "reader_receiver_queue": RECEIVER_QUEUE, "loadavg_start": os.getloadavg(), "datasets": [],
        "engine_build_s": engine_build_s, "cpu_split": split, "settle_max_s": SETTLE_MAX_S,
    }
    tenants = Tenants(src_admin, tgt_admin)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="replication-throughput-"))
    work.mkdir(parents=True, exist_ok=True)
    spark, owned = None, False
    try:
        if "copy" in args.methods:
            spark, owned, result["spark_start_s"] = start_spark(args.master)
            result["master"] = spark.sparkContext.master
            slots = spark.sparkContext.defaultParallelism
        else:
            slots = args.partitions
        result["spark_slots"] = slots
        for ds in datasets:
            result["datasets"].append(run_dataset(ds, args.methods, args.partitions, slots, work, tenants,
                                                  args.geo_timeout, tuple(args.bare_also)))
        if lookup_messages:
            result["lookup"] = run_lookup(args.lookup_size, lookup_messages, args.partitions, slots, work, tenants)
    finally:
        if spark is not None and owned:
            spark.stop()
        result["tenants"] = sorted({created[0] for created in tenants.created})
        if not args.keep:
            result["cleanup_s"] = tenants.cleanup()
        src_admin.close()
        tgt_admin.close()
        log.info("run dirs kept in %s", work)

    result["loadavg_end"] = os.getloadavg()
    result["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
    result["table"] = table(result)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    name = f"replication_throughput-{stamp.strftime('%Y-%m-%dT%H%M%SZ')}"
    out = args.out_dir / f"{name}.json"
    if not args.no_plot:
        png = args.out_dir / f"{name}.png"
        plot(result, png)
        result["plot"] = png.name
    out.write_text(json.dumps(result, indent=2) + "\n")
    print("\n".join(result["table"]))
    print(f"\nresult: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
