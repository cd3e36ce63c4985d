"""Snapshots tenants through the raw admin API, independently of the library's inventory code, so tests
compare clusters with a second implementation rather than the one under test."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from localdev.pulsar_local import LocalCluster
from pulsar_migration.admin import NotFound, PulsarAdmin

# Namespace policies the rich tenant sets (non-default values), checked field by field on the target.
NAMESPACE_POLICY_FIELDS = (
    "retention_policies", "message_ttl_in_seconds", "deduplicationEnabled", "schema_compatibility_strategy",
    "backlog_quota_map", "max_producers_per_topic", "max_consumers_per_subscription", "properties",
    "is_allow_auto_update_schema", "inactive_topic_policies", "topicDispatchRate", "replicatorDispatchRate",
    "dispatcherPauseOnAckStatePersistentEnabled",
)


def snapshot(admin: PulsarAdmin, tenant: str) -> dict[str, Any]:
    """Everything metadata sync manages for one tenant on one cluster, read straight from the REST API."""
    try:
        info = admin.get(f"/tenants/{tenant}")
    except NotFound:
        return {"tenant": None}
    snap: dict[str, Any] = {"tenant": {"adminRoles": sorted(info["adminRoles"])}, "namespaces": {}}
    for full in sorted(admin.get(f"/namespaces/{tenant}")):
        ns = full.split("/", 1)[1]
        policies = admin.get(f"/namespaces/{tenant}/{ns}")
        auth = policies["auth_policies"]
        ns_snap: dict[str, Any] = {
            "policies": {f: _rekey(policies.get(f), admin.name) for f in NAMESPACE_POLICY_FIELDS},
            "namespace_auth": {k: sorted(v) for k, v in auth["namespace_auth"].items()},
            "subscription_auth": {k: sorted(v) for k, v in auth["subscription_auth_roles"].items()},
            "topic_auth": {k.split("/", 3)[-1]: {r: sorted(a) for r, a in v.items()}
                           for k, v in auth["destination_auth"].items()},
            "topics": {},
            "non_persistent_partitions": {
                t.rsplit("/", 1)[1]: admin.get(f"/non-persistent/{tenant}/{ns}/{t.rsplit('/', 1)[1]}/partitions")[
                    "partitions"] for t in admin.get(f"/non-persistent/{tenant}/{ns}/partitioned")},
        }
        partitioned = {t.rsplit("/", 1)[1] for t in admin.get(f"/persistent/{tenant}/{ns}/partitioned")}
        every = {t.rsplit("/", 1)[1] for t in admin.get(f"/persistent/{tenant}/{ns}")}
        plain = {t for t in every if not any(t.startswith(f"{p}-partition-") for p in partitioned)}
        for topic in sorted(partitioned | plain):
            path = f"/persistent/{tenant}/{ns}/{topic}"
            count = admin.get(f"{path}/partitions")["partitions"] if topic in partitioned else 0
            stats = admin.get(f"{path}/partitioned-stats" if topic in partitioned else f"{path}/stats")
            history = admin.get(f"/schemas/{tenant}/{ns}/{topic}/schemas")["getSchemaResponses"]
            schemas = [(v["version"], v["type"], v["data"], v.get("properties") or {}) for v in history]
            ns_snap["topics"][topic] = {
                "partitions": count,
                "subscriptions": {s: v.get("subscriptionProperties") or {}
                                  for s, v in stats["subscriptions"].items() if not s.startswith("pulsar.repl.")},
                "schemas": schemas,
                "messageTTL": admin.get(f"{path}/messageTTL", params={"applied": "false"}),
                "maxProducers": admin.get(f"{path}/maxProducers", params={"applied": "false"}),
                "properties": admin.get(f"{path}/properties"),
                "subscription_dispatch_rates": {s: admin.get(f"{path}/{s}/dispatchRate", params={"applied": "false"})
                                                for s in stats["subscriptions"] if not s.startswith("pulsar.")},
                "deduplicationSnapshotInterval": admin.get(f"{path}/deduplicationSnapshotInterval",
                                                           params={"applied": "false"}),
                "dispatcherPauseOnAckStatePersistent": admin.get(f"{path}/dispatcherPauseOnAckStatePersistent",
                                                                 params={"applied": "false"}),
                "global_maxSubscriptionsPerTopic": admin.get(f"{path}/maxSubscriptionsPerTopic",
                                                             params={"applied": "false", "isGlobal": "true"}),
            }
        snap["namespaces"][ns] = ns_snap
    return snap


def _rekey(value: Any, own_cluster: str) -> Any:
    """Per-cluster rate maps: the entry for the cluster being read becomes `<own>`, so a source's and a
    target's maps compare equal only when each holds the rate under its own name."""
    if isinstance(value, dict) and own_cluster in value:
        return {("<own>" if k == own_cluster else k): v for k, v in value.items()}
    return value

def write_spec(path: Path, tenant: str, a: LocalCluster, b: LocalCluster, **overrides: Any) -> Path:
    spec: dict[str, Any] = {
        "tenant": tenant, "source": a.name, "target": b.name,
        "clusters": {
            a.name: {"admin_url": a.admin_url, "service_url": a.service_url, "token_env": None, "tls": None},
            b.name: {"admin_url": b.admin_url, "service_url": b.service_url, "token_env": None, "tls": None},
        },
    }
    spec.update(overrides)
    path.write_text(json.dumps(spec))
    return path


SERVER_ERRORS = range(500, 600)


def drop_tenant(tenant: str, *admins: PulsarAdmin, wait_s: float = 60.0) -> None:
    """Force-deletes `tenant` wherever it exists. The broker answers 500 while a compaction of the namespace's
    `__change_events` topic races the deletion ("Consumer connect fail"): asked again until `wait_s` passes."""
    for admin in admins:
        admin.force_delete(f"/tenants/{tenant}", SERVER_ERRORS, wait_s)
