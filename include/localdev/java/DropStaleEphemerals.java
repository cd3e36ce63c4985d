// Deletes every ephemeral node from a stopped standalone's RocksDB metadata store before it starts again.
// The store has no sessions: a SIGKILLed standalone leaves its ephemeral nodes (the bookie's registration
// under /ledgers/available, the broker's locks) owned by a dead instance, and the restarted bookie's
// registration lock can then loop deleting and re-creating its own node for ever (BookieServiceInfo has no
// equals() before BookKeeper 4.18, so the lock never sees its value as unchanged). With no stale node the
// registration succeeds at once. After a clean stop there is nothing to delete.
// Run with the distribution's lib/ on the class path:  java -cp 'lib/*' DropStaleEphemerals.java DIR
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import org.rocksdb.Options;
import org.rocksdb.RocksDB;
import org.rocksdb.RocksIterator;
import org.rocksdb.WriteBatch;
import org.rocksdb.WriteOptions;

public class DropStaleEphemerals {
    // RocksdbMetadataStore.MetaValue: int headerSize, int format, long version, long owner, long created,
    // long modified, byte ephemeral (at offset 40), then the data.
    private static final int EPHEMERAL_OFFSET = 40;

    public static void main(String[] args) throws Exception {
        RocksDB.loadLibrary();
        int dropped = 0;
        try (Options options = new Options();
             RocksDB db = RocksDB.open(options, args[0]);  // fails while a live standalone holds the LOCK
             RocksIterator it = db.newIterator();
             WriteBatch batch = new WriteBatch();
             WriteOptions sync = new WriteOptions().setSync(true)) {
            for (it.seek("/".getBytes(StandardCharsets.UTF_8)); it.isValid(); it.next()) {
                byte[] key = it.key();
                byte[] value = it.value();
                if (key.length == 0 || key[0] != '/') {
                    break;  // node paths start with '/'; the store's own __metadata_* keys sort after them
                }
                if (value.length <= EPHEMERAL_OFFSET) {
                    continue;
                }
                ByteBuffer header = ByteBuffer.wrap(value);
                if (header.getInt() > EPHEMERAL_OFFSET && header.getInt() >= 1 && value[EPHEMERAL_OFFSET] != 0) {
                    batch.delete(key);
                    dropped++;
                }
            }
            db.write(sync, batch);
        }
        System.out.println("dropped " + dropped + " ephemeral nodes");
    }
}
