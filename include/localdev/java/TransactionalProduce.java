// Produces ROUNDS rounds on TOPIC through the Java client with transactions: per round one message outside any
// transaction, one in a transaction that commits and one in a transaction that aborts (so the topic ends with an
// abort marker). Payloads: plain-<i>, committed-<i>, aborted-<i>. For tests of what a copy leaves out.
// With a fourth argument `open`: then one message (open-0) in a transaction left open and one outside it after it
// (after-open), "READY" printed, and the process waits to be killed (the transaction times out in 5 minutes).
// Run with the distribution's lib/ on the class path:  java -cp 'lib/*' TransactionalProduce.java URL TOPIC ROUNDS
import java.nio.charset.StandardCharsets;
import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.transaction.Transaction;

public class TransactionalProduce {
    public static void main(String[] args) throws Exception {
        int rounds = Integer.parseInt(args[2]);
        try (PulsarClient client = PulsarClient.builder().serviceUrl(args[0]).enableTransaction(true).build();
             Producer<byte[]> producer = client.newProducer().topic(args[1]).enableBatching(false)
                     .sendTimeout(0, TimeUnit.SECONDS).create()) {
            for (int i = 0; i < rounds; i++) {
                producer.send(bytes("plain-" + i));
                Transaction committed = client.newTransaction().withTransactionTimeout(5, TimeUnit.MINUTES).build().get();
                producer.newMessage(committed).value(bytes("committed-" + i)).send();
                committed.commit().get();
                Transaction aborted = client.newTransaction().withTransactionTimeout(5, TimeUnit.MINUTES).build().get();
                producer.newMessage(aborted).value(bytes("aborted-" + i)).send();
                aborted.abort().get();
            }
            if (args.length > 3 && args[3].equals("open")) {
                Transaction open = client.newTransaction().withTransactionTimeout(5, TimeUnit.MINUTES).build().get();
                producer.newMessage(open).value(bytes("open-0")).send();
                producer.send(bytes("after-open"));
                System.out.println("READY");
                System.out.flush();
                Thread.sleep(TimeUnit.MINUTES.toMillis(10));
            }
        }
    }

    private static byte[] bytes(String text) {
        return text.getBytes(StandardCharsets.UTF_8);
    }
}
