// One chunked message stored in parts, as a producer does that sends a large message while other producers send
// theirs: `first` stores chunks 0..K-1, `rest` the others, so a caller can store other entries and run a copy in
// between; `A-B` stores chunks A..B (again, or with one left out: what a producer's resend or a lost chunk leaves).
// The chunks are what a chunking producer stores (uuid, chunk id, chunk count, total size in each chunk's
// metadata); a consumer puts them together into VALUE repeated to SIZE bytes. CLOCK_OFFSET_MS (optional) sets the
// producer's clock that far off (publish times are the producer's, not the broker's).
//   java -cp 'lib/*:classes' org.apache.pulsar.client.impl.SplitChunks first|rest|A-B URL TOPIC UUID CHUNKS K SIZE VALUE \
//       [CLOCK_OFFSET_MS]
// In the client's package to send a prepared message (ProducerImpl.internalSendAsync), as the copy engine does.
package org.apache.pulsar.client.impl;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Clock;
import java.time.Duration;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.Schema;
import org.apache.pulsar.common.api.proto.MessageMetadata;

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
        int chunkSize = (size + chunks - 1) / chunks;
        long clockOffsetMs = args.length > 8 ? Long.parseLong(args[8]) : 0;
        try (PulsarClient client = PulsarClient.builder().serviceUrl(args[1])
                     .clock(Clock.offset(Clock.systemUTC(), Duration.ofMillis(clockOffsetMs))).build();
             Producer<byte[]> producer = client.newProducer().topic(topic).producerName(uuid + "-producer")
                     .enableBatching(false).create()) {
            int from = part.equals("first") ? 0 : part.equals("rest") ? split : Integer.parseInt(part.split("-")[0]);
            int to = part.equals("first") ? split : part.equals("rest") ? chunks : Integer.parseInt(part.split("-")[1]) + 1;
            for (int id = from; id < to; id++) {
                int start = id * chunkSize;
                int end = Math.min(size, start + chunkSize);
                MessageMetadata md = new MessageMetadata();
                md.setUuid(uuid);
                md.setChunkId(id);
                md.setNumChunksFromMsg(chunks);
                md.setTotalChunkMsgSize(size);
                md.addProperty().setKey("kind").setValue("split");
                md.setPartitionKey("split-key");
                MessageImpl<byte[]> msg = MessageImpl.create(md, ByteBuffer.wrap(whole, start, end - start),
                        Schema.BYTES, topic);
                ((ProducerImpl<byte[]>) producer).internalSendAsync(msg).get();
            }
        }
    }
}
