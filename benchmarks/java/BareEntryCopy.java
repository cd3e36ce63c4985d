/*
 * A benchmark anchor, not part of the product: the least a copy through a third process can cost on a machine.
 *
 * One JVM, a thread per partition: each source entry is received whole (the copy engine's EntryConsumer) and sent
 * to the target as one entry exactly as stored. No added properties (a batch's message metadata is not rewritten),
 * no hash, no read-back of the target, no deduplication, no Spark. What the copy engine does on top of this is what
 * the issue asks of it; this measures what is left when all of that is taken away.
 *
 * Two parts of the engine's work can be added back, to see what each costs: -Dbare.tags=true gives every message
 * the copy's two properties (a batch's message metadata parsed and written again, as the engine does), and
 * -Dbare.hash=true hashes every source message with the engine's ContentHash.
 *
 * Arguments: source service URL, target service URL, then per partition: source topic, target topic, entries.
 * Prints one JSON line: setup_ms (JVM to every reader and producer ready), copy_ms (the first read to the last
 * receipt of all partitions), entries, messages, bytes (payload bytes of the stored entries as sent).
 */
package org.apache.pulsar.client.impl;

import io.netty.buffer.ByteBuf;
import java.lang.management.ManagementFactory;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.Schema;
import org.apache.pulsar.common.api.proto.CompressionType;
import org.apache.pulsar.common.api.proto.MessageMetadata;
import org.apache.pulsar.common.api.proto.SingleMessageMetadata;
import org.apache.pulsar.common.protocol.Commands;

public final class BareEntryCopy {
    static final int IN_FLIGHT = 5000;  // messages per partition, as the copy's default max_in_flight
    static final long STALL_MS = 60_000;
    static final boolean TAGS = Boolean.getBoolean("bare.tags");
    static final boolean HASH = Boolean.getBoolean("bare.hash");

    final String sourceTopic;
    final String targetTopic;
    final long expected;
    final Semaphore inFlight = new Semaphore(IN_FLIGHT);
    final AtomicReference<Throwable> error = new AtomicReference<>();
    final AtomicLong receipts = new AtomicLong();
    final EntryCopy.ContentHash hash = new EntryCopy.ContentHash();
    EntryCopy.EntryConsumer consumer;
    Producer<byte[]> producer;
    long entries;
    long messages;
    long bytes;

    BareEntryCopy(String sourceTopic, String targetTopic, long expected) {
        this.sourceTopic = sourceTopic;
        this.targetTopic = targetTopic;
        this.expected = expected;
    }

    void open(PulsarClientImpl src, PulsarClient tgt) throws Exception {
        consumer = EntryCopy.openReader(src, sourceTopic, null, "the source", 5000);
        producer = tgt.newProducer(Schema.BYTES).topic(targetTopic).enableBatching(false).enableChunking(false)
                .sendTimeout(30, TimeUnit.SECONDS).maxPendingMessages(2 * IN_FLIGHT).blockIfQueueFull(true).create();
    }

    void copy() throws Exception {
        long idleSince = System.currentTimeMillis();
        while (entries < expected) {
            if (error.get() != null) {
                throw new IllegalStateException("send failed", error.get());
            }
            EntryCopy.Raw raw = consumer.entries.poll(200, TimeUnit.MILLISECONDS);
            if (raw == null) {
                if (System.currentTimeMillis() - idleSince > STALL_MS) {
                    throw new IllegalStateException(sourceTopic + ": stalled after " + entries + " entries");
                }
                continue;
            }
            idleSince = System.currentTimeMillis();
            consumer.consumed(raw);
            try {
                send(raw);
            } finally {
                raw.data().release();
            }
        }
        producer.flush();
        inFlight.acquire(IN_FLIGHT);  // every receipt is in
        if (error.get() != null) {
            throw new IllegalStateException("send failed", error.get());
        }
    }

    void send(EntryCopy.Raw raw) throws Exception {
        ByteBuf buf = raw.data().duplicate();
        Commands.skipBrokerEntryMetadataIfExist(buf);
        MessageMetadata md = new MessageMetadata();
        Commands.parseMessageMetadata(buf, md);
        if (md.hasCompression() && md.getCompression() != CompressionType.NONE) {
            throw new IllegalStateException("compressed entries are not part of this benchmark");
        }
        MessageMetadata out = new MessageMetadata().copyFrom(md);
        out.clearProducerName();
        out.clearPublishTime();
        out.clearSequenceId();  // the producer numbers them
        out.clearHighestSequenceId();
        int count = md.hasNumMessagesInBatch() ? md.getNumMessagesInBatch() : 1;
        ByteBuffer body = TAGS || HASH ? work(raw, md, out, buf, count) : null;
        if (body == null) {
            // A heap copy of the stored body, as the engine makes one (the source entry is released after the send).
            byte[] copy = new byte[buf.readableBytes()];
            buf.readBytes(copy);
            body = ByteBuffer.wrap(copy);
        }
        entries++;
        messages += count;
        bytes += body.remaining();
        int permits = Math.min(count, IN_FLIGHT);
        inFlight.acquire(permits);
        MessageImpl<byte[]> msg = MessageImpl.create(out, body, Schema.BYTES, targetTopic);
        ((ProducerImpl<byte[]>) producer).internalSendAsync(msg).whenComplete((id, e) -> {
            if (e != null) {
                error.compareAndSet(null, e);
            } else {
                receipts.incrementAndGet();
            }
            inFlight.release(permits);
        });
    }

    /** The engine's per-message work that -Dbare.tags and -Dbare.hash add back (as EntryCopy.send does it); the
     * body to send when the messages were written again (tags), else null. */
    ByteBuffer work(EntryCopy.Raw raw, MessageMetadata md, MessageMetadata out, ByteBuf payload, int count) {
        long version = EntryCopy.ContentHash.hashedVersion(EntryCopy.schemaVersion(md));
        String pos = raw.ledger() + ":" + raw.entry();
        String publishTime = Long.toString(md.getPublishTime());
        if (!md.hasNumMessagesInBatch()) {
            if (HASH) {
                hash.add(md, payload, version);
            }
            if (!TAGS) {
                return null;
            }
            out.addProperty().setKey(EntryCopy.SOURCE_TAG).setValue(pos + ":-1:0");
            out.addProperty().setKey(EntryCopy.SOURCE_PUBLISH_TIME).setValue(publishTime);
            return ByteBuffer.wrap(io.netty.buffer.ByteBufUtil.getBytes(payload));
        }
        ByteBuf batch = payload.duplicate();
        String tagPrefix = pos + ":";
        String tagSuffix = ":" + count;
        ByteBuf body = TAGS ? io.netty.buffer.Unpooled.buffer(payload.readableBytes() + count
                * EntryCopy.addedBytesPerMessage(tagPrefix.length() + String.valueOf(count).length()
                + tagSuffix.length(), publishTime)) : null;
        SingleMessageMetadata single = new SingleMessageMetadata();
        for (int i = 0; i < count; i++) {
            ByteBuf message;
            try {
                message = Commands.deSerializeSingleMessageInBatch(batch, single, i, count);
            } catch (java.io.IOException e) {
                throw new IllegalStateException(e);
            }
            try {
                if (HASH) {
                    hash.add(single, message, version);
                }
                if (TAGS) {
                    single.addProperty().setKey(EntryCopy.SOURCE_TAG).setValue(tagPrefix + i + tagSuffix);
                    single.addProperty().setKey(EntryCopy.SOURCE_PUBLISH_TIME).setValue(publishTime);
                    body.ensureWritable(4 + single.getSerializedSize() + message.readableBytes());
                    Commands.serializeSingleMessageInBatchWithPayload(single, message, body);
                }
            } finally {
                message.release();
            }
        }
        return TAGS ? ByteBuffer.wrap(body.array(), body.arrayOffset() + body.readerIndex(), body.readableBytes())
                : null;
    }

    public static void main(String[] args) throws Exception {
        List<BareEntryCopy> copies = new ArrayList<>();
        for (int i = 2; i + 2 < args.length; i += 3) {
            copies.add(new BareEntryCopy(args[i], args[i + 1], Long.parseLong(args[i + 2])));
        }
        // The engine's own clients (threads, stats off, memory limit): the anchor moves with them.
        PulsarClientImpl src = (PulsarClientImpl) EntryCopy.client(
                EntryCopy.JSON.createObjectNode().put("service_url", args[0]), "PM_SOURCE_TOKEN");
        PulsarClientImpl tgt = (PulsarClientImpl) EntryCopy.client(
                EntryCopy.JSON.createObjectNode().put("service_url", args[1]), "PM_TARGET_TOKEN");
        for (BareEntryCopy copy : copies) {
            copy.open(src, tgt);
        }
        long setupMs = System.currentTimeMillis() - ManagementFactory.getRuntimeMXBean().getStartTime();
        long started = System.nanoTime();
        List<Thread> threads = new ArrayList<>();
        AtomicReference<Throwable> failed = new AtomicReference<>();
        for (BareEntryCopy copy : copies) {
            Thread t = new Thread(() -> {
                try {
                    copy.copy();
                } catch (Throwable e) {
                    failed.compareAndSet(null, e);
                }
            }, "bare-" + copy.sourceTopic);
            t.start();
            threads.add(t);
        }
        for (Thread t : threads) {
            t.join();
        }
        long copyMs = (System.nanoTime() - started) / 1_000_000;
        if (failed.get() != null) {
            failed.get().printStackTrace();
            System.out.println("{\"error\": \"" + String.valueOf(failed.get().getMessage()).replace('"', '\'') + "\"}");
            System.out.flush();
            Runtime.getRuntime().halt(1);
        }
        long entries = 0, messages = 0, bytes = 0, receipts = 0;
        for (BareEntryCopy copy : copies) {
            entries += copy.entries;
            messages += copy.messages;
            bytes += copy.bytes;
            receipts += copy.receipts.get();
        }
        System.out.println("{\"setup_ms\": " + setupMs + ", \"copy_ms\": " + copyMs + ", \"entries\": " + entries
                + ", \"messages\": " + messages + ", \"bytes\": " + bytes + ", \"receipts\": " + receipts + "}");
        System.out.flush();
        Runtime.getRuntime().halt(0);  // the clients' threads would hold the JVM: nothing is left to close cleanly
    }
}
