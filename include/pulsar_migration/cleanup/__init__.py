"""Step 5: removing the migrated tenant from the source only (see cleanup.step)."""
