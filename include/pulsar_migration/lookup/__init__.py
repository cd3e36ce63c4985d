"""The lookup service: routes each tenant's Pulsar clients to the cluster that owns the tenant now."""
