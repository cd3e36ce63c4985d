"""Step 3: consumption progress sync (see pulsar_migration.progress.step)."""
