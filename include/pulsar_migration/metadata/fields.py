"""Settings maps compared field by field (namespace policies, topic policies)."""

from __future__ import annotations

from typing import Any

from pulsar_migration.metadata import resources as r

# Settings the replication step turns on for the target's own needs (deduplication makes copies and
# client re-sends exactly-once): a target that has them on satisfies any desired value, so a later
# metadata sync never turns them off again.
KEPT_ON_TARGET_WHEN_ENABLED = frozenset({"deduplicationEnabled"})


def held(want: dict[str, Any], have: dict[str, Any]) -> dict[str, Any]:
    """`have` on the keys of `want` only (None where it lacks one): a merged map as far as it is desired."""
    return {k: have.get(k) for k in want}


def differing(want: dict[str, Any], have: dict[str, Any]) -> dict[str, Any]:
    """The entries of `want` that `have` lacks or holds otherwise."""
    return {k: v for k, v in want.items() if have.get(k) != v}


def project_fields(desired: dict[str, Any], actual: dict[str, Any]) -> dict[str, Any]:
    """Each desired setting as the target holds it; merged maps only on the desired keys."""
    projected: dict[str, Any] = {}
    for name, value in desired.items():
        have = actual.get(name)
        if name in r.MERGED_MAP_FIELDS and isinstance(value, dict) and isinstance(have, dict):
            have = held(value, have)
        if name in KEPT_ON_TARGET_WHEN_ENABLED and have is True:
            have = value
        projected[name] = have
    return projected


# What a namespace holds from its creation (4.0.8): not a setting of the target's own when the source's older
# policies lack the field.
FRESH_NAMESPACE_VALUES: dict[str, Any] = {
    "schema_compatibility_strategy": "UNDEFINED", "is_allow_auto_update_schema": True,
    "schema_validation_enforced": False, "encryption_required": False, "subscription_auth_mode": "None",
}
# Backlog quota maps by kind: a quota type only the target has can hold producers or evict the backlog.
QUOTA_MAPS = {"backlog_quota_map", "backlogQuotaMap"}


def set_only_on_target(desired: dict[str, Any] | None, actual: dict[str, Any]) -> list[str]:
    """Settings the target holds that the source does not (`desired`: the source's settings, None when it has none):
    a policy removed on the source after a first sync, or one the target's operator set. Left as they are (the
    sync cannot tell the two apart), named in the report: a TTL or a quota only the target has changes what its
    subscriptions are given. Backlog quota types count one by one; other maps' extra keys are harmless."""
    desired = desired or {}
    extra: list[str] = []
    for name, value in sorted(actual.items()):
        if value in (None, {}, []) or (name in KEPT_ON_TARGET_WHEN_ENABLED and value is True) or \
                (name in FRESH_NAMESPACE_VALUES and FRESH_NAMESPACE_VALUES[name] == value):
            continue
        if name not in desired:
            extra.append(name)
        elif name in QUOTA_MAPS and isinstance(value, dict) and isinstance(desired[name], dict):
            extra.extend(f"{name}.{kind}" for kind in sorted(set(value) - set(desired[name])))
    return extra
