"""A subscription held by some partitions of a partitioned topic only (created on one partition's name, or deleted
from some) is created on those partitions of the target only. It was created on every partition at the earliest
position, where a client subscribing there would have had the source create it afresh (by default at the latest
position): after the switch it got those partitions' whole history again."""

from __future__ import annotations

import json
from typing import Any

from pulsar_migration.admin import Conflict
from pulsar_migration.metadata import resources as r
from pulsar_migration.metadata.apply import Change, ChangeApplier
from pulsar_migration.metadata.inventory import TopicRef, partitioned_subscriptions
from pulsar_migration.metadata.plan import CREATE, NOOP, UPDATE, decide
from pulsar_migration.metadata.state import project_actual

from tests.unit.test_metadata_review_fixes import Stats

BASE = "/persistent/acme/ns"


def j(value: Any) -> str:
    return r.canonical(value)


def test_each_subscription_is_read_with_the_partitions_holding_it() -> None:
    durable = {"isDurable": True}
    admin = Stats({
        f"{BASE}/orders/partitioned-stats": {"partitions": {
            "persistent://acme/ns/orders-partition-0": {"subscriptions": {"all": durable, "pulsar.dedup": durable}},
            "persistent://acme/ns/orders-partition-2": {"subscriptions": {
                "all": durable, "one": {"isDurable": True, "subscriptionProperties": {"k": "v"}},
                "reader-x": {"isDurable": False}}},
        }},
        f"{BASE}/orders-partition-1/stats": {"subscriptions": {"all": durable}},  # left out of the answer above
    })
    found = partitioned_subscriptions(admin, "acme", TopicRef("ns", "orders", True, False), 3)  # type: ignore[arg-type]
    assert found == {"all": {"0": {}, "1": {}, "2": {}}, "one": {"2": {"k": "v"}}}


def test_missing_partitions_are_an_update_and_the_projection_sees_the_desired_ones() -> None:
    desired = j({"partitions": {"2": {"k": "v"}}})
    assert decide(r.SUBSCRIPTION, desired, None).action == CREATE
    # The target holding it on every partition (the old way, or its own) is left alone: only partition 2 counts.
    everywhere = j({"partitions": {"0": {"k": "v"}, "1": {}, "2": {"k": "v", "own": "x"}}})
    assert decide(r.SUBSCRIPTION, desired, everywhere).action == NOOP
    assert project_actual(r.SUBSCRIPTION, desired, everywhere) == desired
    # Killed while created on the source's three partitions: the missing two are created.
    want_all = j({"partitions": {"0": {}, "1": {}, "2": {}}})
    partial = decide(r.SUBSCRIPTION, want_all, j({"partitions": {"1": {"own": "x"}}}))
    assert (partial.action, partial.reason) == (UPDATE, "missing on partition(s) 0, 2")
    assert json.loads(partial.change or "") == {"partitions": {"0": {}, "2": {}}, "create_on": ["0", "2"]}
    assert project_actual(r.SUBSCRIPTION, want_all, j({"partitions": {"1": {}}})) == j({"partitions": {"1": {}}})
    # Killed while its properties were set partition by partition: the partitions left with the old ones are found
    # (one partition's map stood for all, and it was already right), each given its own keys back.
    want_new = j({"partitions": {"0": {"k": "new"}, "1": {"k": "new"}, "2": {"k": "new"}}})
    halfway = j({"partitions": {"0": {"k": "new"}, "1": {"k": "old", "mine": "1"}, "2": {}}})
    redo = decide(r.SUBSCRIPTION, want_new, halfway)
    assert (redo.action, redo.reason) == (UPDATE, "properties differ on partition(s) 1, 2")
    assert json.loads(redo.change or "") == {"partitions": {"1": {"k": "new", "mine": "1"}, "2": {"k": "new"}},
                                             "create_on": []}
    assert project_actual(r.SUBSCRIPTION, want_new, halfway) != want_new
    # A topic non-partitioned on the source and partitioned on the target (a topic conflict, which blocks this row)
    # was a KeyError in the plan's UDF: the step failed on every run instead of naming the conflict.
    assert decide(r.SUBSCRIPTION, j({"properties": {"a": "1"}}), j({"partitions": {"0": {}}})).action == UPDATE
    assert decide(r.SUBSCRIPTION, j({"partitions": {"0": {}}}), j({"properties": {}})).action == UPDATE
    # A non-partitioned topic's subscription has its properties alone, as before.
    assert decide(r.SUBSCRIPTION, j({"properties": {"a": "1"}}), j({"properties": {}})).reason == \
        "properties differ in a"


class Recording:
    name = "cluster-x"

    def __init__(self, exists: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.exists = set(exists)
        self.puts: list[tuple[str, Any]] = []

    def put(self, path: str, body: Any = None, **_: Any) -> None:
        self.puts.append((path, body))
        if path in self.exists:
            raise Conflict("Subscription already exists for topic", 409, path)


def apply_one(admin: Recording, action: str, change: dict[str, Any]) -> None:
    spec: Any = type("Spec", (), {"tenant": "acme"})()
    ChangeApplier(spec, {"target": admin}).apply(Change(  # type: ignore[dict-item]
        side="target", kind="subscription", key="ns/orders|one", namespace="ns", action=action, desired="{}",
        change=json.dumps(change)))


def test_it_is_created_and_updated_partition_by_partition() -> None:
    created = Recording(exists={f"{BASE}/orders-partition-0/subscription/one"})  # made by a grow, or a retry
    apply_one(created, CREATE, {"partitions": {"0": {"k": "v"}, "2": {"k": "v"}}})
    assert [path for path, _ in created.puts] == [f"{BASE}/orders-partition-0/subscription/one",
                                                  f"{BASE}/orders-partition-0/subscription/one/properties",
                                                  f"{BASE}/orders-partition-2/subscription/one"]
    assert created.puts[2][1] == {"ledgerId": -1, "entryId": -1, "properties": {"k": "v"}}
    # The partitioned topic's own properties call fails (404) where a partition lacks the subscription: by partition.
    updated = Recording()
    apply_one(updated, UPDATE, {"partitions": {"0": {"k": "w"}, "2": {"k": "w"}}, "create_on": ["2"]})
    assert [path for path, _ in updated.puts] == [f"{BASE}/orders-partition-0/subscription/one/properties",
                                                  f"{BASE}/orders-partition-2/subscription/one"]


def test_properties_the_broker_keeps_itself_are_not_topic_properties() -> None:
    from pulsar_migration.metadata.inventory import user_topic_properties

    assert user_topic_properties({"pulsar.topic.epoch": "0", "migrated": "true", "PULSAR.SHADOW_SOURCE": "x",
                                  "owner": "payments"}) == {"owner": "payments"}
    assert user_topic_properties(None) == {}
