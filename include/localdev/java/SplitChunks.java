// One chunked message stored in parts, as a producer does that sends a large message while other producers send
// theirs: `first` stores chunks 0..K-1, `rest` the others, so a caller can store other entries and run a copy in
// between; `A-B` stores chunks A..B (again, or with one left out: what a producer's resend or a lost chunk leaves).
// The chunks are what a chunking producer stores (uuid, chunk id, chunk count, total size in each chunk's
// metadata); a consumer puts them together into VALUE repeated to SIZE bytes. CLOCK_OFFSET_MS (optional) sets the
// producer's clock that far off (publish times are the producer's, not the broker's). COMPRESSION (optional, e.g.
// LZ4) compresses the whole message and chunks the compressed bytes, as a compressing producer does.
//   java -cp 'lib/*:classes' org.apache.pulsar.client.impl.SplitChunks first|rest|A-B URL TOPIC UUID CHUNKS K SIZE VALUE \
//       [CLOCK_OFFSET_MS [COMPRESSION]]
// In the client's package to send a prepared message (ProducerImpl.internalSendAsync), as the copy engine does.
package org.apache.pulsar.client.impl;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.Unpooled;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Clock;
import java.time.Duration;
import org.apache.pulsar.client.api.CompressionType;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.Schema;
import org.apache.pulsar.common.api.proto.MessageMetadata;
import org.apache.pulsar.common.compression.CompressionCodecProvider;

public final class SplitChunks {
    /** Several commands (pm.Commands), each with a client and producer of its own as if run alone. */
    public static void main(String[] all) throws Exception {
        pm.Commands.each(all, SplitChunks::run);
    }

    static void run(String[] args) throws Exception {
        String part = args[0];
        String topic = args[2];
        String uuid = args[3];
        int chunks = Integer.parseInt(args[4]);
        int split = Integer.parseInt(args[5]);
        int size = Integer.parseInt(args[6]);
        byte[] unit = args[7].getBytes(StandardCharsets.UTF_8);
        byte[] whole = new byte[size];
        for (int i = 0; i < size; i++) {
            whole[i] = unit[i % unit.length];
        }
        long clockOffsetMs = args.length > 8 ? Long.parseLong(args[8]) : 0;
        CompressionType compression = args.length > 9 ? CompressionType.valueOf(args[9]) : CompressionType.NONE;
        byte[] stored = whole;
        if (compression != CompressionType.NONE) {
            ByteBuf packed = CompressionCodecProvider.getCompressionCodec(compression).encode(Unpooled.wrappedBuffer(whole));
            stored = new byte[packed.readableBytes()];
            packed.readBytes(stored);
            packed.release();
        }
        int chunkSize = (stored.length + chunks - 1) / chunks;
        Clock clock = Clock.offset(Clock.systemUTC(), Duration.ofMillis(clockOffsetMs));
        try (PulsarClient client = PulsarClient.builder().serviceUrl(args[1]).clock(clock).build();
             Producer<byte[]> producer = client.newProducer().topic(topic).producerName(uuid + "-producer")
                     .enableBatching(false).create()) {
            int from = part.equals("first") ? 0 : part.equals("rest") ? split : Integer.parseInt(part.split("-")[0]);
            int to = part.equals("first") ? split : part.equals("rest") ? chunks : Integer.parseInt(part.split("-")[1]) + 1;
            for (int id = from; id < to; id++) {
                int start = id * chunkSize;
                int end = Math.min(stored.length, start + chunkSize);
                MessageMetadata md = new MessageMetadata();
                md.setUuid(uuid);
                md.setChunkId(id);
                md.setNumChunksFromMsg(chunks);
                md.setTotalChunkMsgSize(stored.length);
                if (compression != CompressionType.NONE) {
                    // The producer sets these only on a message without a publish time, and then the chunk's size
                    // as the uncompressed one (a consumer decompresses the whole to the message's size). It takes a
                    // message with a producer name only from a replicator: marked as one (the broker stores it).
                    md.setReplicatedFrom("split-chunks");
                    md.setPublishTime(clock.millis());
                    md.setProducerName(uuid + "-producer");
                    md.setCompression(CompressionCodecProvider.convertToWireProtocol(compression));
                    md.setUncompressedSize(size);
                }
                md.addProperty().setKey("kind").setValue("split");
                md.setPartitionKey("split-key");
                MessageImpl<byte[]> msg = MessageImpl.create(md, ByteBuffer.wrap(stored, start, end - start),
                        Schema.BYTES, topic);
                ((ProducerImpl<byte[]>) producer).internalSendAsync(msg).get();
            }
        }
    }
}
