// Broker entry filters (PIP-105) for the tests, each packed into a NAR of its own by
// localdev.java_programs.entry_filter_nar. RejectTaggedEntries rejects every entry whose metadata carries the
// property `hidden` for any subscription whose name does not start with `sees-hidden`: like a filter that routes
// messages to some subscriptions only, it rejects them for readers too, so a copy through readers would lose
// them. RejectTaggedEntries$ExceptCopies also lets them through to the migration's readers (`pm-copy-reader-*`).
import org.apache.bookkeeper.mledger.Entry;
import org.apache.pulsar.broker.service.Subscription;
import org.apache.pulsar.broker.service.plugin.EntryFilter;
import org.apache.pulsar.broker.service.plugin.FilterContext;
import org.apache.pulsar.common.api.proto.KeyValue;
import org.apache.pulsar.common.api.proto.MessageMetadata;

public class RejectTaggedEntries implements EntryFilter {
    protected boolean sees(String subscription) {
        return subscription.startsWith("sees-hidden");
    }

    @Override
    public FilterResult filterEntry(Entry entry, FilterContext context) {
        MessageMetadata metadata = context.getMsgMetadata();
        Subscription subscription = context.getSubscription();
        if (metadata == null || subscription == null || sees(subscription.getName())) {
            return FilterResult.ACCEPT;
        }
        for (KeyValue property : metadata.getPropertiesList()) {
            if (property.getKey().equals("hidden")) {
                return FilterResult.REJECT;
            }
        }
        return FilterResult.ACCEPT;
    }

    @Override
    public void close() {
    }

    public static class ExceptCopies extends RejectTaggedEntries {
        @Override
        protected boolean sees(String subscription) {
            return super.sees(subscription) || subscription.startsWith("pm-copy-reader-");
        }
    }
}
