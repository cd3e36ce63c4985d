"""Builds test tenants through the raw admin API and snapshots them independently of the library's
inventory code, so tests compare clusters with a second implementation rather than the one under test."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from localdev.pulsar_local import LocalCluster
from pulsar_migration.admin import NotFound, PulsarAdmin

AVRO_ORDER = json.dumps({"type": "record", "name": "Order", "namespace": "acme",
                         "fields": [{"name": "id", "type": "long"}, {"name": "amount", "type": "double"}]})
JSON_EVENT = json.dumps({"type": "record", "name": "Event",
                         "fields": [{"name": "kind", "type": "string"}]})

# Namespace policies the rich tenant sets (non-default values), checked field by field on the target.
NAMESPACE_POLICY_FIELDS = (
    "retention_policies", "message_ttl_in_seconds", "deduplicationEnabled", "schema_compatibility_strategy",
    "backlog_quota_map", "max_producers_per_topic", "max_consumers_per_subscription", "properties",
    "is_allow_auto_update_schema", "inactive_topic_policies", "topicDispatchRate",
)


def build_rich_tenant(admin: PulsarAdmin, tenant: str, clusters: list[str], source_name: str) -> dict[str, Any]:
    """3 namespaces with non-default policies; partitioned (1, 3, 8) and non-partitioned topics;
    subscriptions (one with properties); namespace, subscription and topic grants; Avro and JSON schemas;
    topic-level policies. Returns what was built."""
    admin.put(f"/tenants/{tenant}", {"adminRoles": ["tenant-admin"], "allowedClusters": clusters})
    ns_policies = {
        "orders": {"retention": {"retentionTimeInMinutes": 1440, "retentionSizeInMB": 2048}, "ttl": 3600,
                   "dedup": True, "compat": "FORWARD_TRANSITIVE"},
        "billing": {"retention": {"retentionTimeInMinutes": 60, "retentionSizeInMB": 100}, "ttl": 600,
                    "dedup": False, "compat": "BACKWARD"},
        "audit": {"retention": {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}, "ttl": 0,
                  "dedup": True, "compat": "FULL"},
    }
    for ns, p in ns_policies.items():
        base = f"/namespaces/{tenant}/{ns}"
        admin.put(base)
        admin.post(f"{base}/retention", p["retention"])
        admin.post(f"{base}/messageTTL", p["ttl"])
        admin.post(f"{base}/deduplication", p["dedup"])
        admin.put(f"{base}/schemaCompatibilityStrategy", p["compat"])
        admin.post(f"{base}/maxProducersPerTopic", 7)
        admin.post(f"{base}/permissions/app-{ns}", ["produce", "consume"])
    admin.post(f"/namespaces/{tenant}/orders/backlogQuota", {"limitSize": 1 << 30, "limitTime": -1,
                                                             "policy": "producer_request_hold"},
               params={"backlogQuotaType": "destination_storage"})
    admin.post(f"/namespaces/{tenant}/orders/maxConsumersPerSubscription", 3)
    admin.put(f"/namespaces/{tenant}/orders/properties", {"team": "payments", "tier": "gold"})
    admin.post(f"/namespaces/{tenant}/billing/isAllowAutoUpdateSchema", False)
    admin.post(f"/namespaces/{tenant}/billing/inactiveTopicPolicies",
               {"inactiveTopicDeleteMode": "delete_when_no_subscriptions", "maxInactiveDurationSeconds": 600,
                "deleteWhileInactive": False})
    admin.post(f"/namespaces/{tenant}/audit/dispatchRate",
               {"dispatchThrottlingRateInMsg": 1000, "dispatchThrottlingRateInByte": -1, "ratePeriodInSecond": 1,
                "relativeToPublishRate": False})
    admin.post(f"/namespaces/{tenant}/orders/permissions/subscription/settlement", ["app-billing", "auditor"])

    topics = {
        "orders/created": 3, "orders/settled": 1, "orders/dlq": 0,
        "billing/invoices": 8, "billing/ledger": 0,
        "audit/trail": 0,
    }
    for local, partitions in topics.items():
        ns, topic = local.split("/")
        path = f"/persistent/{tenant}/{ns}/{topic}"
        if partitions:
            admin.put(f"{path}/partitions", partitions)
        else:
            admin.put(path)
    subscriptions = {
        "orders/created": {"settlement": {"owner": "payments"}, "analytics": {}},
        "orders/dlq": {"replayer": {}},
        "billing/invoices": {"invoicer": {"sla": "1h"}},
        "audit/trail": {"archiver": {}},
    }
    for local, subs in subscriptions.items():
        ns, topic = local.split("/")
        for sub, props in subs.items():
            admin.put(f"/persistent/{tenant}/{ns}/{topic}/subscription/{sub}",
                      {"ledgerId": -1, "entryId": -1, "properties": props})
    admin.post(f"/persistent/{tenant}/orders/created/permissions/reporting", ["consume"])
    admin.post(f"/persistent/{tenant}/billing/ledger/permissions/ledger-writer", ["produce"])
    admin.post(f"/schemas/{tenant}/orders/created/schema",
               {"type": "AVRO", "schema": AVRO_ORDER, "properties": {"owner": "payments"}})
    admin.post(f"/schemas/{tenant}/audit/trail/schema", {"type": "JSON", "schema": JSON_EVENT, "properties": {}})
    admin.post(f"/persistent/{tenant}/orders/dlq/messageTTL", params={"messageTTL": 120})
    admin.post(f"/persistent/{tenant}/billing/invoices/maxProducers", 4)
    return {"topics": topics, "subscriptions": subscriptions, "namespaces": sorted(ns_policies)}


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
            "policies": {f: _rekey(policies.get(f)) for f in NAMESPACE_POLICY_FIELDS},
            "namespace_auth": {k: sorted(v) for k, v in auth["namespace_auth"].items()},
            "subscription_auth": {k: sorted(v) for k, v in auth["subscription_auth_roles"].items()},
            "topic_auth": {k.split("/", 3)[-1]: {r: sorted(a) for r, a in v.items()}
                           for k, v in auth["destination_auth"].items()},
            "topics": {},
        }
        partitioned = {t.rsplit("/", 1)[1] for t in admin.get(f"/persistent/{tenant}/{ns}/partitioned")}
        every = {t.rsplit("/", 1)[1] for t in admin.get(f"/persistent/{tenant}/{ns}")}
        plain = {t for t in every if not any(t.startswith(f"{p}-partition-") for p in partitioned)}
        for topic in sorted(partitioned | plain):
            path = f"/persistent/{tenant}/{ns}/{topic}"
            count = admin.get(f"{path}/partitions")["partitions"] if topic in partitioned else 0
            stats = admin.get(f"{path}/partitioned-stats" if topic in partitioned else f"{path}/stats")
            try:
                schema = admin.get(f"/schemas/{tenant}/{ns}/{topic}/schema")
                schema_key = (schema["type"], schema["data"], schema.get("properties") or {})
            except NotFound:
                schema_key = None
            ns_snap["topics"][topic] = {
                "partitions": count,
                "subscriptions": {s: v.get("subscriptionProperties") or {}
                                  for s, v in stats["subscriptions"].items() if not s.startswith("pulsar.repl.")},
                "schema": schema_key,
                "messageTTL": admin.get(f"{path}/messageTTL", params={"applied": "false"}),
                "maxProducers": admin.get(f"{path}/maxProducers", params={"applied": "false"}),
            }
        snap["namespaces"][ns] = ns_snap
    return snap


def _rekey(value: Any) -> Any:
    """Cluster-keyed rate maps hold one entry per cluster name: compare the values only."""
    if isinstance(value, dict) and value and all(k.startswith("cluster-") for k in value):
        return sorted(json.dumps(v, sort_keys=True) for v in value.values())
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
