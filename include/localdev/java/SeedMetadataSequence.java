// Sets the sequential-id counter of a new standalone's RocksDB metadata store before its first start.
// Ledger ids come from that counter, so two fresh clusters would otherwise hand out the same ids
// (5, 6, 7, ...) and a switch between them would find the same ledger id on both sides of a topic.
// Run with the distribution's lib/ on the class path:  java -cp 'lib/*' SeedMetadataSequence.java DIR START
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import org.rocksdb.Options;
import org.rocksdb.RocksDB;

public class SeedMetadataSequence {
    // RocksdbMetadataStore.SEQUENTIAL_ID_KEY; the value is a big-endian long.
    private static final byte[] KEY = "__metadata_sequentialId_key".getBytes(StandardCharsets.UTF_8);

    public static void main(String[] args) throws Exception {
        long start = Long.parseLong(args[1]);
        RocksDB.loadLibrary();
        try (Options options = new Options().setCreateIfMissing(true);
             RocksDB db = RocksDB.open(options, args[0])) {
            byte[] current = db.get(KEY);
            if (current != null && ByteBuffer.wrap(current).getLong() >= start) {
                return;  // already at or past the start: never move a counter back
            }
            db.put(KEY, ByteBuffer.allocate(8).putLong(start).array());
        }
    }
}
