"""sync_metadata fixes from a review on 2026-11-29 (checked against Pulsar 4.0.8's source):
- a backlog quota set before its retention was refused (412) on every run: the retention goes first now, and the
  quota first where the retention is refused for a quota it would fall below;
- partitioned stats that leave a partition out (its stats failed: an unload) hid its subscriptions;
- the deprecated schema auto-update strategy (applied where the compatibility strategy is UNDEFINED) is carried;
- schemas are uploaded after the topic policies (an upload is checked against the topic's own strategy)."""

from __future__ import annotations

from typing import Any

import pytest
from pulsar_migration.admin import AdminError, NotFound
from pulsar_migration.metadata import resources as r
from pulsar_migration.metadata.apply import retention_before_quota
from pulsar_migration.metadata.inventory import TopicRef, namespace_policies, partitioned_subscriptions

GB = 1024


class Broker:
    """Retention and a backlog quota as 4.0.8 checks them: a quota above the retention in force is refused, and a
    retention below the quota in force."""

    def __init__(self, retention: int, quota: int) -> None:
        self.retention, self.quota = retention, quota
        self.calls: list[str] = []

    def set_one(self, name: str, value: Any) -> None:
        self.calls.append(name)
        if name == "retention":
            if value["retentionSizeInMB"] < self.quota:
                raise AdminError("Retention Quota must exceed configured backlog quota", 412, "/retention")
            self.retention = value["retentionSizeInMB"]
        elif name == "backlogQuotaMap":
            limit = value["destination_storage"]["limitSize"] // (1024 * 1024)
            if limit > self.retention:
                raise AdminError("Backlog Quota exceeds configured retention quota", 412, "/backlogQuota")
            self.quota = limit
        else:
            pass


def quota(mb: int) -> dict[str, Any]:
    return {"destination_storage": {"limitSize": mb * 1024 * 1024, "policy": "producer_request_hold"}}


def test_a_quota_raised_with_its_retention_is_set_after_it() -> None:
    broker = Broker(retention=1 * GB, quota=0)
    policies = {"backlogQuotaMap": quota(5 * GB), "messageTTL": 60, "retention": {"retentionSizeInMB": 10 * GB,
                                                                                   "retentionTimeInMinutes": -1}}
    retention_before_quota(policies, "retention", "backlogQuotaMap", broker.set_one)
    assert broker.calls == ["messageTTL", "retention", "backlogQuotaMap"]  # sorted by name, the quota came first
    assert (broker.retention, broker.quota) == (10 * GB, 5 * GB)


def test_a_retention_shrunk_below_the_targets_quota_goes_after_the_quota() -> None:
    broker = Broker(retention=10 * GB, quota=5 * GB)
    policies = {"retention": {"retentionSizeInMB": 2 * GB, "retentionTimeInMinutes": -1},
                "backlogQuotaMap": quota(1 * GB)}
    retention_before_quota(policies, "retention", "backlogQuotaMap", broker.set_one)
    assert broker.calls == ["retention", "backlogQuotaMap", "retention"]
    assert (broker.retention, broker.quota) == (2 * GB, 1 * GB)
    # Refused for another reason, it fails as before.
    with pytest.raises(AdminError, match="Backlog Quota exceeds"):
        retention_before_quota({"backlogQuotaMap": quota(50 * GB)}, "retention", "backlogQuotaMap",
                               Broker(retention=1 * GB, quota=0).set_one)


class Stats:
    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers

    def get(self, path: str, **_: Any) -> Any:
        if path not in self.answers:
            raise NotFound(f"{path} not found", 404, path)
        return self.answers[path]


def test_a_partition_the_partitioned_stats_left_out_is_read_on_its_own() -> None:
    base = "/persistent/acme/ns"
    admin = Stats({
        f"{base}/orders/partitioned-stats": {"metadata": {"partitions": 3}, "partitions": {
            "persistent://acme/ns/orders-partition-0": {}}, "subscriptions": {"a": {"isDurable": True}}},
        f"{base}/orders-partition-1/stats": {"subscriptions": {"b": {"isDurable": True}, "a": {"isDurable": True}}},
        # partition 2 does not exist: it has none
    })
    subs = partitioned_subscriptions(admin, "acme", TopicRef("ns", "orders", True, False), 3)  # type: ignore[arg-type]
    assert sorted(subs) == ["a", "b"]


def test_the_deprecated_schema_auto_update_strategy_is_carried_and_schemas_follow_the_topic_policies() -> None:
    kept = namespace_policies({"schema_auto_update_compatibility_strategy": "AutoUpdateDisabled",
                               "schema_compatibility_strategy": "UNDEFINED"}, "a", "b")
    assert kept["schema_auto_update_compatibility_strategy"] == "AutoUpdateDisabled"
    phase = {kind: n for n, kinds in enumerate(r.APPLY_PHASES) for kind in kinds}
    assert phase[r.SCHEMA] > phase[r.TOPIC_POLICIES]
