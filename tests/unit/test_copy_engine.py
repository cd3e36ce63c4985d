"""The copy engine's Python side without brokers: choosing it, building it, parsing what it prints, and a real
start of the engine (javac, jar, class archive, JVM) on an empty job list, which needs no cluster."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from pulsar_migration.positions import Position
from pulsar_migration.replication import engine
from pulsar_migration.spec import MigrationSpec


def spec_with(options: dict[str, Any]) -> MigrationSpec:
    return MigrationSpec.from_dict({
        "tenant": "t", "source": "a", "target": "b",
        "clusters": {"a": {"admin_url": "http://127.0.0.1:1", "service_url": "pulsar://127.0.0.1:1"},
                     "b": {"admin_url": "http://127.0.0.1:2", "service_url": "pulsar://127.0.0.1:2"}},
        "options": options,
    })


def test_result_lines_parse_into_positions_and_times() -> None:
    line = {"topic": "persistent://t/ns/x", "source_messages": 3, "source_entries": 2, "source_bytes": 30,
            "source_hash": "ab" * 32, "copied_messages": 2, "copied_entries": 1, "copied_bytes": 20,
            "skipped_messages": 1, "deduplicated": 1, "delayed_messages": 0, "receipts": 1,
            "receipts_digest": "cd" * 32, "deduplicated_sources": ["7:3"], "fallback_at": "7:9", "copy_ms": 1500,
            "read_wait_ms": 3, "send_wait_ms": 4}
    result = engine.EngineResult.parse(line)
    assert result.deduplicated_sources == frozenset({Position(7, 3)})
    assert result.fallback_at == Position(7, 9) and result.copy_s == 1.5
    assert (result.source_messages, result.copied_messages, result.skipped_messages) == (3, 2, 1)
    assert engine.EngineResult.parse({**line, "fallback_at": None}).fallback_at is None


def test_python_choice_never_looks_for_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "unavailable_reason", lambda: pytest.fail("looked for the engine"))
    assert engine.wanted(spec_with({"copy_engine": "python"})) is False


def test_java_choice_without_a_jdk_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "unavailable_reason", lambda: "no JDK (java and javac) on PATH")
    with pytest.raises(engine.EngineError, match="copy_engine is java but no JDK"):
        engine.wanted(spec_with({"copy_engine": "java"}))
    assert engine.wanted(spec_with({})) is False  # auto falls back to the Python path


def test_a_missing_jdk_is_noticed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert engine.unavailable_reason() == "no JDK (java and javac) on PATH"


def test_the_engine_builds_once_and_starts_on_an_empty_job_list(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A real javac, jar and JVM: the build leaves a jar and a class archive, a second call reuses them, and a
    start with no partitions prints its closing line (no cluster is contacted: clients connect lazily)."""
    if engine.unavailable_reason() is not None:
        pytest.skip(engine.unavailable_reason())
    lib = engine.pulsar_lib()
    assert lib is not None
    monkeypatch.setenv("PULSAR_HOME", str(lib.parent))  # the distribution stays found under another cache dir
    monkeypatch.setenv("PM_CACHE_DIR", str(tmp_path))
    build = engine.compiled(lib)
    assert build.jar.is_file() and build.archive is not None and build.archive.is_file()
    assert engine.compiled(lib) == build
    assert [p.name for p in (tmp_path / "engine").iterdir() if p.is_dir()] == [build.jar.parent.name]
    results, timings = engine.copy_many(spec_with({}), [], max_in_flight=10)
    assert results == {} and set(timings) == {"jvm_start_ms", "clients_ms", "waited_for_jobs_ms", "jobs_ms", "round"}
    assert json.dumps(timings)  # plain numbers
    # Rounds in one process (the cutover's driver deltas): each answered, the process there until closed.
    process = engine.EngineProcess(spec_with({}), max_in_flight=10, may_record=False)
    first, second = process.run_round([])[1], process.run_round([])[1]
    assert (first["round"], second["round"]) == (1, 2) and "jvm_start_ms" not in second and process.alive()
    process.close()
    assert not process.alive() and process._process.returncode == 0
    process.abandon()  # after close: nothing more to do
    assert os.environ.get("PM_SOURCE_TOKEN") is None  # nothing leaked into this process
    # The archive is valid for the class path the engine starts with: -Xshare:on refuses to start otherwise.
    monkeypatch.setenv("PM_ENGINE_JAVA_OPTIONS", "-Xshare:on")
    assert engine.copy_many(spec_with({}), [], max_in_flight=10)[1], "the class archive was not used"


def test_a_scan_line_parses_and_the_rows_file_becomes_map_rows_and_a_map_part(tmp_path: Path) -> None:
    """The engine's read-back (EngineScan) and its rows file: the same rows through both ways into the map (Python
    rows for a remote run dir, an Arrow table for a local one), with a retried part replacing its first attempt."""
    import struct

    from pulsar_migration.replication import posmap
    from pulsar_migration.replication.partition import EngineCopy, PartitionJob, PartitionOutcome, engine_rows_to_map

    scan = {"messages": 6, "entries": 3, "bytes": 60, "hash": "ef" * 32, "pairs": 3, "pairs_digest": "01" * 32,
            "shape_errors": 0, "first_shape_errors": [], "rows": 3, "scan_ms": 250}
    parsed = engine.EngineScan.parse(scan)
    assert parsed is not None and parsed.scan_s == 0.25 and parsed.rows == 3
    assert engine.EngineScan.parse({"fallback_at": "3:4"}) is None  # left to the Python client's read-back
    rows_file = tmp_path / "0.rows"
    rows_file.write_bytes(struct.pack(">13q", 7, 1, 4, 1, 9, 0, 4, 1, 1_700_000_000_000, -1, -1, -1, -1)
                          + struct.pack(">13q", 7, 2, 1, 0, 9, 1, 1, 0, 1_700_000_000_001, -1, -1, -1, -1)
                          + struct.pack(">13q", 7, 6, 1, 0, 9, 4, 1, 0, 1_700_000_000_002, 7, 3, 9, 2))
    topic = "persistent://t/ns/x-partition-1"
    job = PartitionJob(topic, "ns/x", 1, Position(7, 2),
                       engine=EngineCopy(None, "unused", 1.0, rows_file=str(rows_file)))
    outcome = PartitionOutcome(topic, "ns/x", 1, mapped_entries=3)
    rows = engine_rows_to_map("s3a://bucket/run", job, outcome)  # not local: the rows go to Spark's write
    assert outcome.status == "ok"
    assert [r.as_tuple() for r in rows] == [
        (topic, 1, 7, 1, 4, True, None, 9, 0, 4, True, None, 1_700_000_000_000, "copy"),
        (topic, 1, 7, 2, 1, False, None, 9, 1, 1, False, None, 1_700_000_000_001, "copy"),
        (topic, 1, 7, 6, 1, False, "7:3", 9, 4, 1, False, "9:2", 1_700_000_000_002, "copy")]  # a chunked message
    table = posmap.engine_rows_table(str(rows_file), topic, 1)
    assert [tuple(r.values()) for r in table.to_pylist()] == [r.as_tuple() for r in rows]
    run_dir = str(tmp_path / "run")
    for _ in range(2):  # a retried task writes the same part again: replaced, not added
        posmap.write_part(run_dir, table, "part-engine-x-9.0-9.1.parquet")
    frame = posmap.read_local(run_dir)
    assert frame is not None and len(frame) == 3
    assert [p.name for p in Path(posmap.location(run_dir)).iterdir()] == ["part-engine-x-9.0-9.1.parquet"]
    short = PartitionOutcome(topic, "ns/x", 1, mapped_entries=4)  # the read-back reported a row more than written
    assert engine_rows_to_map("s3a://bucket/run", job, short) == [] and short.status == "failed"
    assert "wrote 3 map rows of 4" in (short.error or "")


def test_readers_queues_hold_about_16_mib_whatever_the_message_size() -> None:
    assert engine.receiver_queue_for(None) == engine.receiver_queue_for(0) == engine.RECEIVER_QUEUE
    assert engine.receiver_queue_for(256) == engine.RECEIVER_QUEUE  # small messages: the count is the bound
    assert engine.receiver_queue_for(16_384) == 1024
    assert engine.receiver_queue_for(5_000_000) == engine.MIN_RECEIVER_QUEUE


PAIR_PROBE = """
package org.apache.pulsar.client.impl;

public final class PairProbe {
    public static void main(String[] args) {
        EntryCopy.PairDigest digest = new EntryCopy.PairDigest();
        for (int i = 0; i < args.length; i += 3) {
            if (args[i].equals("add")) {
                digest.add(args[i + 1], args[i + 2]);
            } else {
                digest.remove(args[i + 1], args[i + 2]);
            }
        }
        System.out.println(digest.hex() + " " + digest.count);
    }
}
"""

HASH_PROBE = """
package org.apache.pulsar.client.impl;

import io.netty.buffer.Unpooled;
import java.nio.charset.StandardCharsets;
import org.apache.pulsar.common.api.proto.MessageMetadata;

public final class HashProbe {
    public static void main(String[] args) {
        EntryCopy.ContentHash hash = new EntryCopy.ContentHash();
        // Per message: key, payload, then property key and value pairs, each as its UTF-8 bytes in hex (an
        // argument cannot hold a NUL), then "--".
        for (int i = 0; i < args.length; ) {
            MessageMetadata md = new MessageMetadata();
            md.setPartitionKey(text(args[i++]));
            byte[] payload = text(args[i++]).getBytes(StandardCharsets.UTF_8);
            while (!args[i].equals("--")) {
                md.addProperty().setKey(text(args[i++])).setValue(text(args[i++]));
            }
            i++;
            hash.add(md, Unpooled.wrappedBuffer(payload), -1);
            System.out.println(java.util.HexFormat.of().formatHex(hash.chain));
        }
    }

    static String text(String hex) {
        return new String(java.util.HexFormat.of().parseHex(hex), StandardCharsets.UTF_8);
    }
}
"""

CHUNK_PROBE = """
package org.apache.pulsar.client.impl;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.Unpooled;
import java.nio.charset.StandardCharsets;
import org.apache.pulsar.common.api.proto.CompressionType;
import org.apache.pulsar.common.api.proto.MessageMetadata;
import org.apache.pulsar.common.compression.CompressionCodecProvider;

public final class ChunkProbe {
    static EntryCopy.Chunks chunks;
    static long entry;

    /** Feeds chunk `id` of `uuid` (of `count`, `total` bytes as stored) at the next position; prints the outcome. */
    static void feed(String uuid, int id, int count, int total, byte[] part, CompressionType codec, int size)
            throws Exception {
        feed(uuid, id, count, total, part, codec, size, "p-" + uuid);
    }

    /** As above, stored by `producer` (a producer stores one message's chunks before its next message). */
    static void feed(String uuid, int id, int count, int total, byte[] part, CompressionType codec, int size,
                     String producer) throws Exception {
        MessageMetadata md = new MessageMetadata();
        md.setUuid(uuid).setChunkId(id).setNumChunksFromMsg(count).setTotalChunkMsgSize(total);
        md.setProducerName(producer).setSequenceId(1).setPublishTime(1);
        if (codec != CompressionType.NONE) {
            md.setCompression(codec).setUncompressedSize(size);
        }
        EntryCopy.Raw raw = new EntryCopy.Raw(7, entry++, null, null, 1);
        EntryCopy.Chunks.Whole whole = chunks.take(raw, md, Unpooled.wrappedBuffer(part));
        String shown = whole == null ? "-" : whole == EntryCopy.Chunks.IRREGULAR ? "irregular"
                : whole == EntryCopy.Chunks.ORPHAN ? "orphan"
                : whole.payload().toString(StandardCharsets.UTF_8).length() > 20
                ? "whole:" + whole.payload().readableBytes() + "@" + whole.firstChunk() + ":" + whole.md().hasUuid()
                : "whole:" + whole.payload().toString(StandardCharsets.UTF_8) + "@" + whole.firstChunk();
        System.out.println(uuid + "/" + id + " " + shown);
    }

    static void feed(String uuid, int id, int count, String part) throws Exception {
        byte[] bytes = part.getBytes(StandardCharsets.UTF_8);
        feed(uuid, id, count, 2 * count, bytes, CompressionType.NONE, 0);
    }

    public static void main(String[] args) throws Exception {
        System.setProperty("pm.maxChunkedBytes", "1000");
        chunks = new EntryCopy.Chunks();
        feed("plain", 0, 3, "ab"); feed("plain", 1, 3, "cd"); feed("plain", 2, 3, "ef");
        feed("over", 0, 3, "ab"); feed("over", 1, 3, "cd"); feed("over", 0, 3, "AB"); feed("over", 1, 3, "CD");
        feed("over", 2, 3, "EF");
        feed("again", 0, 3, "ab"); feed("again", 1, 3, "cd"); feed("again", 1, 3, "cd"); feed("again", 2, 3, "ef");
        feed("gap", 0, 4, "ab"); feed("gap", 2, 4, "ef"); feed("gap", 3, 4, "gh");
        feed("orphan", 1, 2, "cd");
        feed("gap2", 0, 3, "ab"); feed("gap2", 2, 3, "ef"); feed("gap2", 0, 3, "ab");  // lost, then sent over
        feed("x", 0, 2, "x1"); feed("y", 0, 2, "y1"); feed("x", 1, 2, "x2"); feed("y", 1, 2, "y2");
        byte[] text = "hello chunks ".repeat(50).getBytes(StandardCharsets.UTF_8);
        ByteBuf packed = CompressionCodecProvider.getCompressionCodec(CompressionType.LZ4).encode(
                Unpooled.wrappedBuffer(text));
        byte[] lz4 = new byte[packed.readableBytes()];
        packed.readBytes(lz4);
        int half = lz4.length / 2;
        feed("lz4", 0, 2, lz4.length, java.util.Arrays.copyOfRange(lz4, 0, half), CompressionType.LZ4, text.length);
        feed("lz4", 1, 2, lz4.length, java.util.Arrays.copyOfRange(lz4, half, lz4.length), CompressionType.LZ4,
                text.length);
        feed("big", 0, 2, 5000, new byte[10], CompressionType.NONE, 0);
        // A producer killed inside a message: its next message (a first chunk, or an entry of its own) gives it up,
        // and its bytes no longer hold back a later message's.
        byte[][] two = {"n1".getBytes(StandardCharsets.UTF_8), "n2".getBytes(StandardCharsets.UTF_8)};
        feed("dead", 0, 3, 900, two[0], CompressionType.NONE, 0, "k");
        feed("next", 0, 2, 900, two[0], CompressionType.NONE, 0, "k");
        feed("next", 1, 2, 900, two[1], CompressionType.NONE, 0, "k");
        feed("dead2", 0, 3, 900, two[0], CompressionType.NONE, 0, "k");
        MessageMetadata plain = new MessageMetadata().setProducerName("k").setSequenceId(2).setPublishTime(1);
        chunks.movedOn(EntryCopy.Chunks.producerOf(plain), null);
        feed("after", 0, 2, 900, two[0], CompressionType.NONE, 0, "m");
        feed("after", 1, 2, 900, two[1], CompressionType.NONE, 0, "m");
        System.out.println("lost " + new java.util.TreeSet<>(chunks.lost) + " pending "
                + new java.util.TreeSet<>(chunks.pending.keySet()) + " bytes "
                + chunks.gatheredBytes);
    }
}
"""

TEXT_PROBE = """
package org.apache.pulsar.client.impl;

import java.nio.charset.StandardCharsets;
import org.apache.pulsar.common.api.proto.MessageMetadata;
import org.apache.pulsar.common.api.proto.SingleMessageMetadata;

public final class TextProbe {
    /** Stored metadata whose key (or a property value) holds `raw` where "KEY1" was written. */
    static byte[] stored(byte[] serialized, byte[] raw) {
        byte[] marker = "KEY1".getBytes(StandardCharsets.UTF_8);
        for (int i = 0; i + marker.length <= serialized.length; i++) {
            if (java.util.Arrays.equals(serialized, i, i + marker.length, marker, 0, marker.length)) {
                System.arraycopy(raw, 0, serialized, i, raw.length);
                return serialized;
            }
        }
        throw new IllegalStateException("no marker");
    }

    static String check(byte[] raw, boolean inProperty, boolean batched) {
        try {
            if (batched) {
                SingleMessageMetadata single = new SingleMessageMetadata().setPayloadSize(0);
                if (inProperty) {
                    single.addProperty().setKey("k").setValue("KEY1");
                } else {
                    single.setPartitionKey("KEY1");
                }
                SingleMessageMetadata parsed = new SingleMessageMetadata();
                parsed.parseFrom(stored(single.toByteArray(), raw));
                EntryCopy.checkText(parsed.hasPartitionKey() ? parsed.getPartitionKey() : null,
                        parsed.getPropertiesList(), () -> !java.util.Arrays.equals(parsed.toByteArray(),
                                new SingleMessageMetadata().copyFrom(parsed).toByteArray()), "m");
            } else {
                MessageMetadata md = new MessageMetadata().setProducerName("p").setSequenceId(1).setPublishTime(1);
                if (inProperty) {
                    md.addProperty().setKey("k").setValue("KEY1");
                } else {
                    md.setPartitionKey("KEY1");
                }
                MessageMetadata parsed = new MessageMetadata();
                parsed.parseFrom(stored(md.toByteArray(), raw));
                EntryCopy.checkText(parsed.hasPartitionKey() ? parsed.getPartitionKey() : null,
                        parsed.getPropertiesList(), () -> !java.util.Arrays.equals(parsed.toByteArray(),
                                new MessageMetadata().copyFrom(parsed).toByteArray()), "m");
            }
            return "ok";
        } catch (IllegalStateException e) {
            return e.getMessage().contains("not UTF-8") ? "refused" : e.getMessage();
        }
    }

    public static void main(String[] args) {
        byte[] invalid = {(byte) 0xff, 0x01, 0x41, 0x42};  // 0xff is never UTF-8
        // A 4-byte sequence cut short: one U+FFFD of 3 bytes in its place, the same length (sizes cannot tell).
        byte[] truncated = {(byte) 0xf0, (byte) 0x9f, (byte) 0x98, 0x31};
        byte[] replacement = "\uFFFD1".getBytes(StandardCharsets.UTF_8);  // 4 bytes: a U+FFFD the producer sent
        byte[] plain = "ABCD".getBytes(StandardCharsets.UTF_8);
        for (boolean batched : new boolean[] {false, true}) {
            for (boolean inProperty : new boolean[] {false, true}) {
                System.out.println(check(invalid, inProperty, batched) + " " + check(replacement, inProperty, batched)
                        + " " + check(plain, inProperty, batched) + " " + check(truncated, inProperty, batched));
            }
        }
    }
}
"""

TAG_PROBE = """
package org.apache.pulsar.client.impl;

public final class TagProbe {
    public static void main(String[] args) {
        for (String text : args) {
            EntryCopy.Tag tag = EntryCopy.Tag.parse(text);
            System.out.println(tag == null ? "none" : tag.ledger() + "," + tag.entry() + "," + tag.index() + ","
                    + tag.size() + "," + tag.firstLedger() + "," + tag.firstEntry());
        }
    }
}
"""

# A probe's copy of one partition and the read-back following it (no cluster: clients connect lazily).
FOLLOWED_COPY = """        ObjectMapper json = new ObjectMapper();
        EntryCopy copy = new EntryCopy(json.readTree("{\\"target_name\\": \\"b\\", \\"source_name\\": \\"a\\", "
                + "\\"max_in_flight\\": 10, \\"source\\": {\\"admin_url\\": \\"http://127.0.0.1:1\\"}}"),
                json.readTree("{\\"topic\\": \\"persistent://t/ns/x\\", \\"base_topic\\": \\"persistent://t/ns/x\\"}"));
        EntryCopy.TargetScan scan = new EntryCopy.TargetScan(copy);
        copy.follower = scan;"""

# A probe's copy waiting for its read-back on a thread of its own (keepReadBackClose).
WAITING = """    static Thread waiting(EntryCopy copy) {
        Thread copying = new Thread(() -> {
            try {
                copy.keepReadBackClose();
            } catch (InterruptedException e) {
                throw new IllegalStateException(e);
            }
        });
        copying.start();
        return copying;
    }"""


def probe_source(template: str) -> str:
    return template.replace("$FOLLOWED_COPY", FOLLOWED_COPY).replace("$WAITING", WAITING)

LAG_PROBE = """
package org.apache.pulsar.client.impl;

import com.fasterxml.jackson.databind.ObjectMapper;

public final class LagProbe {
    public static void main(String[] args) throws Exception {
$FOLLOWED_COPY
        for (int i = 0; i < EntryCopy.MAX_READ_BACK_LAG + 5; i++) {
            copy.sent(0);
        }
        java.util.Arrays.fill(copy.sentAt, System.nanoTime() + 60_000_000_000L);  // young, however slow this runs
        copy.keepReadBackClose();  // past the count, but the oldest entry not read back is young: no wait
        System.out.println("young-goes " + copy.readBackWaitNanos);
        java.util.Arrays.fill(copy.sentAt, System.nanoTime() - 60_000_000_000L);  // sent a minute ago
        Thread copying = waiting(copy);
        copying.join(300);
        System.out.println("old-waits " + copying.isAlive());
        scan.sentRead = 4;  // the oldest not read back is still old, and 1,001 entries are
        copying.join(300);
        System.out.println("one-short-waits " + copying.isAlive());
        scan.sentRead = 5;
        copying.join(5000);
        System.out.println("within-count-goes " + !copying.isAlive() + " " + (copy.readBackWaitNanos >= 500_000_000L));
        java.util.Arrays.fill(copy.sentAt, System.nanoTime() + 60_000_000_000L);
        copy.copiedEntries = scan.sentRead + EntryCopy.SENT_TIMES;  // no send time kept that far back: wait
        copying = waiting(copy);
        copying.join(300);
        System.out.println("ring-full-waits " + copying.isAlive());
        scan.ended = true;  // a read-back that ended (or failed) holds nothing back
        copying.join(5000);
        System.out.println("ended-goes " + !copying.isAlive());
    }

$WAITING
}
"""

SEQUENCE_PROBE = """
package org.apache.pulsar.client.impl;

public final class SequenceProbe {
    public static void main(String[] args) {
        for (int i = 0; i < args.length; i += 2) {
            try {
                System.out.println(EntryCopy.sequenceId(Long.parseLong(args[i]), Long.parseLong(args[i + 1])));
            } catch (IllegalStateException e) {
                System.out.println("refused");
            }
        }
    }
}
"""


STALL_PROBE = """
package org.apache.pulsar.client.impl;

import com.fasterxml.jackson.databind.ObjectMapper;

public final class StallProbe {
    public static void main(String[] args) throws Exception {
        System.setProperty("pm.readBackStallMs", "1000");  // before EntryCopy's class is initialised
$FOLLOWED_COPY
        for (int i = 0; i < 3 * EntryCopy.MAX_READ_BACK_LAG; i++) {
            copy.sent(0);
        }
        java.util.Arrays.fill(copy.sentAt, System.nanoTime() - 60_000_000_000L);  // sent a minute ago: it waits
        String[] failure = new String[1];
        Thread copying = new Thread(() -> {
            try {
                copy.keepReadBackClose();
            } catch (IllegalStateException e) {
                failure[0] = e.getMessage();
            } catch (InterruptedException e) {
                throw new IllegalStateException(e);
            }
        });
        long start = System.nanoTime();
        copying.start();
        for (int i = 0; i < 10; i++) {  // a slow read-back: one entry every 300 ms for 3 s, then nothing
            Thread.sleep(300);
            scan.sentRead++;
        }
        System.out.println("slow-waits " + copying.isAlive());
        copying.join(10_000);
        long tookMs = (System.nanoTime() - start) / 1_000_000;
        System.out.println("stalled-fails " + !copying.isAlive() + " " + (tookMs >= 3_900));
        System.out.println(failure[0]);
    }
}
"""


def test_the_copy_fails_on_a_read_back_that_takes_nothing_while_it_waits(probes: tuple[Path, str]) -> None:
    """keepReadBackClose waits for a slow read-back as long as it takes something, and fails with one line on one
    that takes nothing for pm.readBackStallMs (it waited for ever)."""
    stdout = run_probe(probes, "StallProbe", []).splitlines()
    assert stdout == ["slow-waits true", "stalled-fails true true",
                      "the read-back of persistent://t/ns/x in cluster b took nothing for 1s while the copy waited for "
                      "it (2990 entries sent and not read back)"]


# EntryCopy.Gaps over a job's ledgers and tolerance; args: tolerance, then (last ledger, last entry, ledger, entry)
# quadruples (a last ledger of -1: the range's start); prints per quadruple the stored entries between and whether
# the entry is taken (a second look at the same jump is taken: the broker skipped the same entries again).
GAPS_PROBE = """
package org.apache.pulsar.client.impl;

import com.fasterxml.jackson.databind.ObjectMapper;

public final class GapsProbe {
    public static void main(String[] args) throws Exception {
        ObjectMapper json = new ObjectMapper();
        EntryCopy copy = new EntryCopy(json.readTree("{\\"target_name\\": \\"b\\", \\"source_name\\": \\"a\\", "
                + "\\"max_in_flight\\": 10, \\"source\\": {\\"admin_url\\": \\"http://127.0.0.1:1\\"}}"),
                json.readTree("{\\"topic\\": \\"persistent://t/ns/x\\", \\"base_topic\\": \\"persistent://t/ns/x\\", "
                        + "\\"ledgers\\": [[10, 3], [11, 0], [12, 2], [14, 5]], "
                        + "\\"gap_tolerance\\": " + args[0] + "}"));
        EntryCopy.Gaps gaps = copy.new Gaps(copy.ledgers, copy.gapTolerance);
        for (int i = 1; i + 3 < args.length; i += 4) {
            long[] last = Long.parseLong(args[i]) < 0 ? null
                    : new long[] {Long.parseLong(args[i]), Long.parseLong(args[i + 1])};
            long ledger = Long.parseLong(args[i + 2]);
            long entry = Long.parseLong(args[i + 3]);
            System.out.println(gaps.storedBetween(last, ledger, entry) + " " + gaps.follows(last, ledger, entry));
        }
        System.out.println("rereads " + copy.rereads);
    }
}
"""


def test_the_engines_reader_guard_judges_jumps_as_the_python_one_does(probes: tuple[Path, str]) -> None:
    """EntryCopy.Gaps and reading.EntryGaps on the same ledgers, strict and with a marker's tolerance."""
    from pulsar_migration.positions import Position
    from pulsar_migration.replication.reading import EntryGaps

    cases = [(10, 0, 10, 1), (10, 0, 10, 2), (10, 1, 12, 0), (10, 2, 12, 1), (10, 1, 12, 1), (10, 0, 14, 1),
             (-1, 0, 10, 2), (14, 4, 20, 5)]
    for tolerance in (0, 1):
        python = EntryGaps([(10, 3), (11, 0), (12, 2), (14, 5)], tolerance=tolerance)
        expected = []
        for last_ledger, last_entry, ledger, entry in cases:
            last = None if last_ledger < 0 else Position(last_ledger, last_entry)
            expected.append(f"{python.stored_between(last, Position(ledger, entry))} "
                            f"{str(python.follows(last, Position(ledger, entry))).lower()}")
        expected.append(f"rereads {python.rereads}")
        out = run_probe(probes, "GapsProbe", [str(tolerance), *(str(n) for case in cases for n in case)])
        assert out.splitlines() == expected, (tolerance, out)
    assert expected[3] == "1 true" and expected[4] == "2 false"  # tolerance 1: a marker's entry goes, two do not


def probe_sources() -> dict[str, str]:
    """Every probe of this module by class name (compiled together: one javac costs about 3 s of CPU)."""
    return {"StallProbe": probe_source(STALL_PROBE), "SequenceProbe": SEQUENCE_PROBE, "PairProbe": PAIR_PROBE,
            "HashProbe": HASH_PROBE, "ChunkProbe": CHUNK_PROBE, "TagProbe": TAG_PROBE,
            "LagProbe": probe_source(LAG_PROBE), "ByteLagProbe": probe_source(BYTE_LAG_PROBE),
            "GapsProbe": GAPS_PROBE, "TextProbe": TEXT_PROBE}


@pytest.fixture(scope="module")
def probes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The probes compiled against the engine jar in one javac: (classes dir, class path)."""
    import subprocess

    if engine.unavailable_reason() is not None:
        pytest.skip(engine.unavailable_reason())
    lib = engine.pulsar_lib()
    assert lib is not None
    classpath = engine._classpath(engine.compiled(lib).jar, lib)
    classes = tmp_path_factory.mktemp("probes")
    sources = []
    for name, text in probe_sources().items():
        sources.append(classes / f"{name}.java")
        sources[-1].write_text(text)
    subprocess.run(["javac", "-nowarn", "-cp", classpath, "-d", str(classes), *map(str, sources)], check=True)
    return classes, classpath


def run_probe(probes: tuple[Path, str], name: str, args: list[str]) -> str:
    """Runs probe `name` (a class in the engine's package) with `args`; its stdout."""
    import subprocess

    classes, classpath = probes
    return subprocess.run(["java", "-cp", f"{classes}:{classpath}", f"org.apache.pulsar.client.impl.{name}", *args],
                          capture_output=True, text=True, check=True, timeout=120).stdout


def test_the_engine_encodes_sequence_ids_as_positions_does_and_refuses_the_same_positions(
        probes: tuple[Path, str]) -> None:
    """Either path's re-send must be dropped by the other's deduplication, so both derive the same sequence id
    from a position; both refuse the positions the 63 bits cannot hold (a real javac and JVM)."""
    from pulsar_migration.positions import MAX_ENTRY, MAX_LEDGER, PositionError, sequence_id

    cases = [(0, 0), (1, 0), (7, 3), (MAX_LEDGER, MAX_ENTRY), (MAX_LEDGER + 1, 0), (0, MAX_ENTRY + 1), (-1, 0)]
    stdout = run_probe(probes, "SequenceProbe", [str(n) for case in cases for n in case])

    def python(ledger: int, entry: int) -> str:
        try:
            return str(sequence_id(Position(ledger, entry)))
        except PositionError:
            return "refused"

    assert stdout.split() == [python(*case) for case in cases]
    assert stdout.split()[3] == str(2**62) and stdout.split()[4:] == ["refused"] * 3


def test_the_engines_pair_digest_is_the_python_one_and_a_removal_undoes_an_addition(probes: tuple[Path, str]) -> None:
    """The engine's receipts digest is compared with the Python read-back's: the same sums mod 2^256, carries
    across all four words, and a removal (a re-send the target dropped) exactly undoing its addition."""
    import random

    from pulsar_migration.replication.content import PairDigest

    rng = random.Random(7)
    pairs = [(f"{rng.randrange(1 << 40)}:{rng.randrange(1 << 20)}", f"{rng.randrange(1 << 40)}:{rng.randrange(9)}")
             for _ in range(300)]
    removed = pairs[::3]
    args = [word for s, t in pairs for word in ("add", s, t)] + [word for s, t in removed for word in ("remove", s, t)]
    expected = PairDigest()
    for s, t in pairs:
        if (s, t) not in removed:
            expected.add(s, t)
    assert run_probe(probes, "PairProbe", args).split() == [expected.hexdigest, str(expected.count)]
    # Removing everything leaves zero: the subtraction borrows across every word.
    everything = args + [word for s, t in pairs if (s, t) not in removed for word in ("remove", s, t)]
    assert run_probe(probes, "PairProbe", everything).split() == ["0" * 64, "0"]


class FakeMessage:
    """What content.message_digest reads of a client's message."""

    def __init__(self, key: str, payload: str, properties: dict[str, str]) -> None:
        self.key, self.payload, self.props = key, payload.encode(), properties

    def partition_key(self) -> str:
        return self.key

    def ordering_key(self) -> str:
        return ""

    def data(self) -> bytes:
        return self.payload

    def properties(self) -> dict[str, str]:
        return dict(self.props)

    def event_timestamp(self) -> int:
        return 0

    def int_schema_version(self) -> int:
        return -1

    def has_null_value(self) -> bool:
        return False

    def length(self) -> int:
        return len(self.payload)


def test_the_engines_content_hash_is_the_python_one_and_tells_apart_properties_a_separator_would_join(
        probes: tuple[Path, str]) -> None:
    """Both sides of a copy are hashed by different code (the engine in Java, the read-back or the Python path in
    Python): the same chain, message by message. Properties are sorted by their keys' code points (Java's String
    order differs past U+FFFF) and each key and value is length-prefixed: joined by separators, the second and
    third messages' properties had the same text."""
    from pulsar_migration.replication.content import ContentHash, message_digest

    messages = [
        ("", "plain", {}),
        ("k", "same", {"a": "b\x00c\x01d"}),
        ("k", "same", {"a": "b", "c": "d"}),
        ("\u00e9", "unicode", {"\uffff": "x", "\U0001f600": "y", "z": "", "": "empty key"}),
        ("k", "added", {"__pm_source": "1:2:-1:0", "__pm_source_publish_time": "5", "u": "v"}),
    ]
    assert message_digest(FakeMessage(*messages[1])) != message_digest(FakeMessage(*messages[2]))
    expected = ContentHash()
    chains = []
    for message in messages:
        expected.add(FakeMessage(*message), new_entry=True)
        chains.append(expected.hexdigest)
    args = [word for key, payload, props in messages
            for word in (*[x.encode().hex() for x in (key, payload, *[x for kv in props.items() for x in kv])], "--")]
    assert run_probe(probes, "HashProbe", args).split() == chains


def test_chunks_are_put_together_as_the_java_consumer_does(probes: tuple[Path, str]) -> None:
    """EntryCopy.Chunks on chunk metadata as producers store it: in order; sent over from its first chunk (the last
    sending counts, placed at its first chunk); a chunk stored twice (skipped); one missing (the message lost, its
    later chunks ignored); a later chunk without its first (an orphan, for the copy to look back); two messages
    interleaved; an LZ4 message split mid-block (decompressed whole, the chunk fields gone); one past the byte
    bound (irregular). A message lost and then sent over is pending again, not lost. Positions are 7:0, 7:1, ... in
    feeding order."""
    stdout = run_probe(probes, "ChunkProbe", []).splitlines()
    assert stdout == [
        "plain/0 -", "plain/1 -", "plain/2 whole:abcdef@7:0",
        "over/0 -", "over/1 -", "over/0 -", "over/1 -", "over/2 whole:ABCDEF@7:5",
        "again/0 -", "again/1 -", "again/1 -", "again/2 whole:abcdef@7:8",
        "gap/0 -", "gap/2 -", "gap/3 -",
        "orphan/1 orphan",
        "gap2/0 -", "gap2/2 -", "gap2/0 -",
        "x/0 -", "y/0 -", "x/1 whole:x1x2@7:19", "y/1 whole:y1y2@7:20",
        "lz4/0 -", "lz4/1 whole:650@7:23:false",
        "big/0 irregular",
        "dead/0 -", "next/0 -", "next/1 whole:n1n2@7:27", "dead2/0 -", "after/0 -", "after/1 whole:n1n2@7:30",
        "lost [dead, dead2, gap] pending [gap2] bytes 6",
    ]


def test_the_engine_refuses_keys_and_properties_that_are_not_utf8_and_keeps_a_replacement_character_sent(
        probes: tuple[Path, str]) -> None:
    """A Go or C++ producer can store key or property bytes that are not UTF-8; the clients decode them as text, so
    the engine's copy stored U+FFFD in their place and both hashes (from the decoded text) agreed (found by a review
    on 2026-11-29). Such a message is refused now, unbatched and in a batch; a U+FFFD the producer itself sent, and
    plain text, pass."""
    assert run_probe(probes, "TextProbe", []).split("\n")[:4] == ["refused ok ok refused"] * 4


def test_the_engines_source_tags_parse_as_written_and_anything_else_is_no_tag(probes: tuple[Path, str]) -> None:
    """The read-back judges entry shapes by each message's source tag (positions.SourceTag): four numbers, the
    index -1 for an unbatched message, and for a chunked (unbatched) message two more, its first chunk; anything
    malformed is no tag."""
    from pulsar_migration.positions import SourceTag

    written = [SourceTag(Position(12, 3), 5, 10), SourceTag(Position(2**38 - 1, 2**24 - 1), -1, 0),
               SourceTag(Position(0, 0), 0, 1), SourceTag(Position(7, 9), -1, 0, Position(7, 5))]
    texts = [t.encode() for t in written]
    malformed = ["", "1:2:3", "1:2:3:4:5", "a:2:3:4", "1::3:4", "1:2:3:", "1:2:3:4x", "1:2:--3:4", "1:2:3-:4",
                 "99999999999999999999:1:0:1", "1:2:4294967296:1", "1:2:0:1:3:4", "1:2:-1:0:-3:4", "1:2:-1:0:3:4:5"]
    stdout = run_probe(probes, "TagProbe", texts + malformed).split()
    first = [t.first_chunk or Position(-1, -1) for t in written]
    assert stdout[:4] == [f"{t.position.ledger},{t.position.entry},{t.batch_index},{t.batch_size},"
                          f"{f.ledger},{f.entry}" for t, f in zip(written, first, strict=True)]
    assert stdout[4:] == ["none"] * len(malformed)


def test_the_copy_waits_while_its_read_back_is_too_far_behind(probes: tuple[Path, str]) -> None:
    """keepReadBackClose: the copy runs past MAX_READ_BACK_LAG entries ahead of its read-back only while the oldest
    entry not read back is younger than MAX_READ_BACK_AGE_MS, never further than the send times it keeps, and never
    waits for a read-back that has ended."""
    stdout = run_probe(probes, "LagProbe", []).splitlines()
    assert stdout == ["young-goes 0", "old-waits true", "one-short-waits true", "within-count-goes true true",
                      "ring-full-waits true", "ended-goes true"]


BYTE_LAG_PROBE = """
package org.apache.pulsar.client.impl;

import com.fasterxml.jackson.databind.ObjectMapper;

public final class ByteLagProbe {
    public static void main(String[] args) throws Exception {
$FOLLOWED_COPY
        int half = (int) (EntryCopy.MAX_READ_BACK_BYTES / 2);
        copy.sent(half);
        copy.sent(half);
        java.util.Arrays.fill(copy.sentAt, System.nanoTime() - 60_000_000_000L);  // sent a minute ago
        copy.keepReadBackClose();  // two entries, the bound's bytes exactly: no wait
        System.out.println("at-bytes-goes " + copy.readBackWaitNanos);
        copy.sent(1);
        java.util.Arrays.fill(copy.sentAt, System.nanoTime() - 60_000_000_000L);
        Thread copying = waiting(copy);
        copying.join(300);
        System.out.println("byte-past-waits " + copying.isAlive());  // three entries, far within the count
        scan.sentRead = 1;  // the first half read back: half and a byte ahead
        copying.join(5000);
        System.out.println("within-bytes-goes " + !copying.isAlive());
        java.util.Arrays.fill(copy.sentAt, System.nanoTime() + 60_000_000_000L);  // young, however slow this runs
        copy.sent(2 * half);
        long waited = copy.readBackWaitNanos;
        copy.keepReadBackClose();  // past the bytes, but the oldest entry not read back is young: no wait
        System.out.println("young-goes " + (copy.readBackWaitNanos == waited));
    }

$WAITING
}
"""


def test_the_copy_waits_while_its_read_back_is_too_many_bytes_behind(probes: tuple[Path, str]) -> None:
    """keepReadBackClose: within the entry count, the copy runs past MAX_READ_BACK_BYTES ahead of its read-back
    only while the oldest entry not read back is younger than MAX_READ_BACK_AGE_MS (1,000 batches of 128 KiB let a
    read-back trail by most of a large copy)."""
    stdout = run_probe(probes, "ByteLagProbe", []).splitlines()
    assert stdout == ["at-bytes-goes 0", "byte-past-waits true", "within-bytes-goes true", "young-goes true"]


def test_one_start_claims_the_full_archive_a_stale_claim_is_taken_over_and_a_failed_recording_is_not_retried(
        tmp_path: Path) -> None:
    build = engine.Build(tmp_path / "engine.jar", tmp_path / "engine.jsa")
    first = build.claim_full_archive()
    assert first is not None and build.claim_full_archive() is None  # a second start while it records
    first.settle(False)  # killed, or no jobs: the claim is freed, nothing kept
    second = build.claim_full_archive()
    assert second is not None and not second.final.exists()
    second.partial.write_bytes(b"archive")
    second.settle(True)
    assert second.final.read_bytes() == b"archive" and not second.claim.exists()
    assert build.claim_full_archive() is None  # recorded: nobody records again

    other = engine.Build(tmp_path / "other" / "engine.jar", None)
    other.jar.parent.mkdir()
    stale = other.jar.parent / engine.FULL_ARCHIVE_CLAIM
    stale.touch()
    os.utime(stale, (0, 0))  # a recorder killed long ago
    taken = other.claim_full_archive()
    assert taken is not None
    taken.settle(True)  # a normal exit that wrote nothing: remembered, not tried at every start
    assert (other.jar.parent / engine.FULL_ARCHIVE_FAILED).exists() and other.claim_full_archive() is None


def test_a_new_build_deletes_builds_unused_for_two_weeks_and_keeps_the_rest(tmp_path: Path) -> None:
    def build(name: str, age_days: float | None) -> Path:
        directory = tmp_path / name
        directory.mkdir()
        (directory / "engine.jar").write_bytes(b"jar")
        if age_days is not None:  # None: still being built (no done marker)
            (directory / "done").touch()
            old = time.time() - age_days * 86_400
            os.utime(directory / "done", (old, old))
        (tmp_path / f"{name}.lock").touch()
        return directory

    current = build("current", 0)
    build("stale", engine.UNUSED_BUILD_DAYS + 1)
    build("recent", engine.UNUSED_BUILD_DAYS - 1)
    build("building", None)
    assert engine.prune_unused_builds(current) == ["stale"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "building", "building.lock", "current", "current.lock", "recent", "recent.lock"]


def test_the_build_key_follows_the_source_the_client_the_distribution_and_the_jdk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A class archive is valid only for the JVM and class path that made it: an upgraded JDK or a distribution
    elsewhere gets a build of its own instead of a build whose archive every start would ignore."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "org.apache.pulsar-pulsar-client-original-4.0.8.jar").touch()
    monkeypatch.setattr(engine, "jdk_identity", lambda: b"/usr/lib/jvm/a/bin/java\0JAVA_VERSION=17.0.15")
    key = engine.build_key(lib, b"class EntryCopy {}")
    assert key == engine.build_key(lib, b"class EntryCopy {}") and len(key) == 16
    assert engine.build_key(lib, b"class EntryCopy { }") != key
    monkeypatch.setattr(engine, "jdk_identity", lambda: b"/usr/lib/jvm/a/bin/java\0JAVA_VERSION=17.0.16")
    assert engine.build_key(lib, b"class EntryCopy {}") != key
    other = tmp_path / "other" / "lib"
    other.mkdir(parents=True)
    (other / "org.apache.pulsar-pulsar-client-original-4.0.8.jar").touch()
    assert engine.build_key(other, b"x") != engine.build_key(lib, b"x")
    before = engine.build_key(lib, b"x")
    (lib / "org.apache.pulsar-pulsar-client-original-4.0.9.jar").touch()  # the newest client names the build
    assert engine.build_key(lib, b"x") != before


def test_the_jdk_identity_is_the_release_file_of_the_java_on_path(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text("#!/bin/sh\n")
    java.chmod(0o755)
    monkeypatch.setenv("PATH", str(home / "bin"))
    without_release = engine.jdk_identity()
    assert without_release.startswith(str(java).encode() + b"\0")
    (home / "release").write_text('JAVA_VERSION="17.0.16"\n')
    assert engine.jdk_identity() == str(java).encode() + b'\0JAVA_VERSION="17.0.16"\n'
    monkeypatch.setenv("PATH", "/nonexistent")
    assert engine.jdk_identity() == b""
