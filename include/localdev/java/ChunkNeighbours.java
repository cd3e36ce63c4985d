// Chunked messages and their neighbours through the Java client, the outside judge of a copy that puts chunked
// messages together (the copy engine) and must keep every other message's metadata as it is.
//   produce URL TOPIC ROUND: on one topic, through Java producers:
//     - a 1 MB LZ4-compressed message chunked at 10 KB, one chunk in flight at a time, while a producer on a client
//       of its own sends 300 small messages one by one (their entries come between the chunks);
//     - a 6 MB message over the broker's 5 MB limit, chunked by it;
//     - around them: binary keys (base64 flag), an empty key, an empty and a binary ordering key, event times,
//       properties, a null value, batched and unbatched.
//   read URL TOPIC: every message from the earliest, one line each ("MSG " and the rest: the client logs to stdout
//     too): its message id (a chunked message: "first;last"), then what a consumer sees of it. read-compacted: the
//     same through the topic's compacted view.
// Several commands, separated by ";" arguments, run one after the other in one JVM (pm.Commands); each read ends
// with "END TOPIC".
// Run with the distribution's lib/ on the class path:  java -cp 'lib/*' ChunkNeighbours.java MODE URL TOPIC [ROUND]
import java.nio.charset.StandardCharsets;
import java.util.HexFormat;
import java.util.Map;
import java.util.Random;
import java.util.TreeMap;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.CompressionType;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.MessageId;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.Reader;
import org.apache.pulsar.client.api.Schema;

public class ChunkNeighbours {
    public static void main(String[] all) throws Exception {
        pm.Commands.each(all, ChunkNeighbours::run);
    }

    static void run(String[] args) throws Exception {
        try (PulsarClient client = PulsarClient.builder().serviceUrl(args[1]).build()) {
            if (args[0].equals("produce")) {
                try (PulsarClient other = PulsarClient.builder().serviceUrl(args[1]).build()) {
                    produce(client, other, args[2], args[3]);
                }
            } else {
                read(client, args[2], args[0].equals("read-compacted"));
                System.out.println("END " + args[2]);
            }
        }
    }

    static void produce(PulsarClient client, PulsarClient other, String topic, String round) throws Exception {
        try (Producer<byte[]> plain = client.newProducer().topic(topic).enableBatching(false).create();
             Producer<byte[]> batched = client.newProducer().topic(topic).enableBatching(true)
                     .batchingMaxMessages(5).batchingMaxPublishDelay(1, TimeUnit.SECONDS).create();
             Producer<byte[]> small = client.newProducer().topic(topic).enableBatching(false).enableChunking(true)
                     .chunkMaxMessageSize(10 * 1024).compressionType(CompressionType.LZ4).maxPendingMessages(1)
                     .blockIfQueueFull(true).create();
             Producer<byte[]> large = client.newProducer().topic(topic).enableBatching(false).enableChunking(true)
                     .create();
             Producer<byte[]> between = other.newProducer().topic(topic).enableBatching(false).create()) {
            neighbours(plain, batched, round + "-before");
            // Half-compressible: LZ4 keeps it above the chunk size.
            Random random = new Random(round.hashCode());
            byte[] text = new byte[1_000_000];
            for (int i = 0; i < text.length; i++) {
                text[i] = (byte) ('a' + random.nextInt(16));
            }
            CompletableFuture<Void> sent = CompletableFuture.runAsync(() -> {
                for (int i = 0; i < 300; i++) {
                    try {
                        between.newMessage().key("between-" + i).value(("between-" + round + "-" + i)
                                .getBytes(StandardCharsets.UTF_8)).send();
                    } catch (Exception e) {
                        throw new IllegalStateException(e);
                    }
                }
            });
            Thread.sleep(20);
            // One chunk at a time (a pending queue of 1): the other producer's sends land between them.
            small.newMessage().keyBytes(new byte[] {(byte) 0xfe, 0, 1})
                    .orderingKey(new byte[] {(byte) 0x80, (byte) 0xff}).property("kind", "chunked-small")
                    .eventTime(1_700_000_000_123L).value(text).send();
            sent.get(60, TimeUnit.SECONDS);
            neighbours(plain, batched, round + "-middle");
            byte[] big = new byte[6 * 1024 * 1024];
            random.nextBytes(big);
            large.newMessage().key("").property("kind", "chunked-large").value(big).send();
            neighbours(plain, batched, round + "-after");
        }
    }

    /** Messages whose metadata the Python path could not carry: binary keys, empty keys and ordering keys. */
    static void neighbours(Producer<byte[]> plain, Producer<byte[]> batched, String label) throws Exception {
        for (Producer<byte[]> producer : java.util.List.of(plain, batched)) {
            String kind = producer == plain ? "unbatched" : "batched";
            CompletableFuture<?>[] sent = {
                producer.newMessage().keyBytes(new byte[] {(byte) 0xff, 0, (byte) 0x80}).value(bytes(label, kind, 0))
                        .sendAsync(),
                producer.newMessage().key("").value(bytes(label, kind, 1)).sendAsync(),
                producer.newMessage().key("k").orderingKey(new byte[0]).value(bytes(label, kind, 2)).sendAsync(),
                producer.newMessage().orderingKey(new byte[] {(byte) 0xc3, 0x28}).property("p", "v")
                        .eventTime(42).value(bytes(label, kind, 3)).sendAsync(),
                producer.newMessage().key("null").value(null).sendAsync(),
            };
            producer.flush();
            CompletableFuture.allOf(sent).get(60, TimeUnit.SECONDS);
        }
    }

    static byte[] bytes(String label, String kind, int i) {
        return (label + "-" + kind + "-" + i).getBytes(StandardCharsets.UTF_8);
    }

    static void read(PulsarClient client, String topic, boolean compacted) throws Exception {
        try (Reader<byte[]> reader = client.newReader(Schema.BYTES).topic(topic).startMessageId(MessageId.earliest)
                .readCompacted(compacted).create()) {
            while (reader.hasMessageAvailable()) {
                Message<byte[]> m = reader.readNext(30, TimeUnit.SECONDS);
                if (m == null) {
                    break;
                }
                Map<String, String> properties = new TreeMap<>(m.getProperties());
                properties.keySet().removeIf(k -> k.startsWith("__pm_"));
                byte[] value = m.getValue();
                String shown = value == null ? "null"
                        : value.length > 64 ? value.length + "#" + java.util.Arrays.hashCode(value)
                        : new String(value, StandardCharsets.UTF_8);
                HexFormat hex = HexFormat.of();
                System.out.println("MSG " + m.getMessageId() + " key=" + (m.hasKey() ? m.hasBase64EncodedKey()
                        + ":" + hex.formatHex(m.getKeyBytes()) : "-")
                        + " ordering=" + (m.hasOrderingKey() ? hex.formatHex(m.getOrderingKey()) : "-")
                        + " event=" + m.getEventTime() + " props=" + properties
                        + " value=" + shown);
            }
        }
    }
}
