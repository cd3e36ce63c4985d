"""A realistic demo tenant, built through the raw admin API (used by `make demo` and the tests).

3 namespaces with non-default policies; partitioned (1, 3, 8) and non-partitioned topics; subscriptions
(some with properties); namespace, subscription and topic grants; Avro and JSON schemas; topic policies and
properties.
"""

from __future__ import annotations

import json
from typing import Any

from pulsar_migration.admin import PulsarAdmin

AVRO_ORDER = json.dumps({"type": "record", "name": "Order", "namespace": "acme",
                         "fields": [{"name": "id", "type": "long"}, {"name": "amount", "type": "double"}]})
# v2 adds an optional field: compatible under the orders namespace's FORWARD_TRANSITIVE strategy.
AVRO_ORDER_V2 = json.dumps({"type": "record", "name": "Order", "namespace": "acme",
                            "fields": [{"name": "id", "type": "long"}, {"name": "amount", "type": "double"},
                                       {"name": "note", "type": ["null", "string"], "default": None}]})
JSON_EVENT = json.dumps({"type": "record", "name": "Event",
                         "fields": [{"name": "kind", "type": "string"}]})

def build_rich_tenant(admin: PulsarAdmin, tenant: str, clusters: list[str]) -> dict[str, Any]:
    """3 namespaces with non-default policies; partitioned (1, 3, 8) and non-partitioned topics;
    subscriptions (one with properties); namespace, subscription and topic grants; Avro and JSON schemas;
    topic-level policies (one global); topic properties. Returns what was built."""
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
    admin.post(f"/namespaces/{tenant}/audit/replicatorDispatchRate",
               {"dispatchThrottlingRateInMsg": 500, "dispatchThrottlingRateInByte": -1, "ratePeriodInSecond": 1,
                "relativeToPublishRate": False})
    admin.post(f"/namespaces/{tenant}/audit/dispatcherPauseOnAckStatePersistent")
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
    admin.put(f"/non-persistent/{tenant}/audit/live-metrics/partitions", 2)  # partition metadata persists
    admin.post(f"/non-persistent/{tenant}/audit/live-metrics/permissions/dashboards", ["consume"])
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
    for version in (AVRO_ORDER, AVRO_ORDER_V2):  # a history of two versions
        admin.post(f"/schemas/{tenant}/orders/created/schema",
                   {"type": "AVRO", "schema": version, "properties": {"owner": "payments"}})
    admin.post(f"/schemas/{tenant}/audit/trail/schema", {"type": "JSON", "schema": JSON_EVENT, "properties": {}})
    # Topic properties: a partitioned topic's live in its partitioned metadata, a non-partitioned one's in its ledger.
    admin.put(f"/persistent/{tenant}/orders/created/properties", {"owner": "payments", "pii": "no"})
    admin.put(f"/persistent/{tenant}/orders/dlq/properties", {"replay-with": "replayer"})
    admin.post(f"/persistent/{tenant}/orders/dlq/messageTTL", params={"messageTTL": 120})
    admin.post(f"/persistent/{tenant}/billing/invoices/maxProducers", 4)
    admin.post(f"/persistent/{tenant}/orders/created/settlement/dispatchRate",  # one subscription's own rate
               {"dispatchThrottlingRateInMsg": 2000, "dispatchThrottlingRateInByte": -1, "ratePeriodInSecond": 1,
                "relativeToPublishRate": False})
    admin.post(f"/persistent/{tenant}/orders/dlq/deduplicationSnapshotInterval", 30)
    admin.post(f"/persistent/{tenant}/orders/dlq/dispatcherPauseOnAckStatePersistent")
    admin.post(f"/persistent/{tenant}/billing/invoices/maxSubscriptionsPerTopic", 50, params={"isGlobal": "true"})
    return {"topics": topics, "subscriptions": subscriptions, "namespaces": sorted(ns_policies)}
