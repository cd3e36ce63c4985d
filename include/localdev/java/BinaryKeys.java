// Binary message keys through the Java client, the outside judge of whether a copy keeps them.
//   produce URL TOPIC N [PAD]: N messages with binary keys (bytes that are not UTF-8), in batches of 10, then N
//                        unbatched; one message with a plain string key after each half. PAD: that many more
//                        bytes in every value (large messages).
//   read URL TOPIC:      every message from the earliest, one line each ("MSG " and the rest: the client logs to
//                        stdout too): whether the key is binary (base64 flag), the key's bytes in hex, the value
//                        (past 64 characters: its first 32, its length and its hash code); then "END TOPIC".
// Several commands, separated by ";" arguments, run one after the other in one JVM (pm.Commands).
// Run with the distribution's lib/ on the class path:  java -cp 'lib/*' BinaryKeys.java MODE URL TOPIC [N [PAD]]
import java.nio.charset.StandardCharsets;
import java.util.HexFormat;
import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.MessageId;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.Reader;

public class BinaryKeys {
    public static void main(String[] all) throws Exception {
        pm.Commands.each(all, BinaryKeys::run);
    }

    static void run(String[] args) throws Exception {
        try (PulsarClient client = PulsarClient.builder().serviceUrl(args[1]).build()) {
            if (args[0].equals("produce")) {
                produce(client, args[2], Integer.parseInt(args[3]), args.length > 4 ? "x".repeat(
                        Integer.parseInt(args[4])) : "");
            } else {
                read(client, args[2]);
                System.out.println("END " + args[2]);
            }
        }
    }

    static void produce(PulsarClient client, String topic, int n, String pad) throws Exception {
        try (Producer<byte[]> batched = client.newProducer().topic(topic).enableBatching(true)
                .batchingMaxMessages(10).batchingMaxPublishDelay(1, TimeUnit.SECONDS).create()) {
            for (int i = 0; i < n; i++) {
                batched.newMessage().keyBytes(key(i)).value(("batched-" + i + pad).getBytes(StandardCharsets.UTF_8))
                        .sendAsync();
            }
            batched.flush();
            batched.newMessage().key("plain-key").value("plain-batched".getBytes(StandardCharsets.UTF_8)).send();
        }
        try (Producer<byte[]> unbatched = client.newProducer().topic(topic).enableBatching(false).create()) {
            for (int i = 0; i < n; i++) {
                unbatched.newMessage().keyBytes(key(n + i)).value(("unbatched-" + i + pad).getBytes(StandardCharsets.UTF_8))
                        .send();
            }
            unbatched.newMessage().key("plain-key").value("plain-unbatched".getBytes(StandardCharsets.UTF_8)).send();
        }
    }

    static byte[] key(int i) {
        return new byte[] {(byte) 0xff, (byte) 0xfe, 0, (byte) i, (byte) (i >> 8), (byte) 0x80};
    }

    static void read(PulsarClient client, String topic) throws Exception {
        try (Reader<byte[]> reader = client.newReader().topic(topic).startMessageId(MessageId.earliest).create()) {
            while (reader.hasMessageAvailable()) {
                Message<byte[]> m = reader.readNext(10, TimeUnit.SECONDS);
                if (m == null) {
                    break;
                }
                String key = m.hasKey() ? HexFormat.of().formatHex(m.getKeyBytes()) : "-";
                String value = new String(m.getValue(), StandardCharsets.UTF_8);
                if (value.length() > 64) {
                    value = value.substring(0, 32) + "..." + value.length() + "#" + value.hashCode();
                }
                System.out.println("MSG " + m.hasBase64EncodedKey() + " " + key + " " + value);
            }
        }
    }
}
