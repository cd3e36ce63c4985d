"""Settings maps compared field by field (namespace policies, topic policies)."""

from __future__ import annotations

from typing import Any

from pulsar_migration.metadata import resources as r

# Settings the replication step turns on for the target's own needs (deduplication makes copies and
# client re-sends exactly-once): a target that has them on satisfies any desired value, so a later
# metadata sync never turns them off again.
KEPT_ON_TARGET_WHEN_ENABLED = frozenset({"deduplicationEnabled"})


def project_fields(desired: dict[str, Any], actual: dict[str, Any]) -> dict[str, Any]:
    """Each desired setting as the target holds it; merged maps only on the desired keys."""
    projected: dict[str, Any] = {}
    for name, value in desired.items():
        have = actual.get(name)
        if name in r.MERGED_MAP_FIELDS and isinstance(value, dict) and isinstance(have, dict):
            have = {k: have.get(k) for k in value}
        if name in KEPT_ON_TARGET_WHEN_ENABLED and have is True:
            have = value
        projected[name] = have
    return projected
