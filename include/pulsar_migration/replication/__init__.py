"""Step 2, replicate_topics: a tenant's messages reach the target exactly once, entries 1:1, with a
position map (see pulsar_migration.replication.step)."""
