"""Step 4: the fenced cutover of a tenant's clients through the lookup service (see switch.step)."""
