"""When inventory reads topic-level policies: only where the namespace's __change_events ever held an event."""

from __future__ import annotations

from typing import Any

import pytest
from pulsar_migration.admin import AdminError, NotFound, PulsarAdmin
from pulsar_migration.metadata.inventory import may_hold_topic_policies

BASE = "/persistent/acme/ns"
NO_EVENTS = {"numberOfEntries": 0, "compactedLedger": {"ledgerId": -1, "entries": -1}}


class FakeAdmin(PulsarAdmin):
    def __init__(self, answer: Any) -> None:
        super().__init__("http://127.0.0.1:1", name="fake")
        self.answer = answer
        self.paths: list[str] = []

    def get(self, path: str, **kwargs: Any) -> Any:
        self.paths.append(path)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@pytest.mark.parametrize(("every", "stats", "expected"), [
    (["orders"], NO_EVENTS, False),  # no __change_events at all: no call
    (["__change_events", "orders"], NO_EVENTS, False),  # auto-created when a topic loaded, never written
    (["__change_events", "orders"], {"numberOfEntries": 1, "compactedLedger": {"entries": -1}}, True),
    (["__change_events"], {"numberOfEntries": 0, "compactedLedger": {"ledgerId": 9, "entries": 3}}, True),
    (["__change_events"], {"numberOfEntries": 0}, False),
    (["__change_events"], {"ledgers": []}, True),  # unexpected shape: read policies
    (["__change_events-partition-0", "orders"], NO_EVENTS, True),  # partitioned system topic: read policies
    (["__change_events"], AdminError("boom", 500), True),
    (["__change_events"], NotFound("gone", 404), True),
])
def test_topic_policies_are_read_only_where_change_events_has_events(
    every: list[str], stats: Any, expected: bool
) -> None:
    admin = FakeAdmin(stats)
    assert may_hold_topic_policies(admin, BASE, every) is expected
    if "__change_events" in every:
        assert admin.paths == [f"{BASE}/__change_events/internalStats"]
    else:
        assert admin.paths == []


def test_topic_grants_keep_their_domain() -> None:
    from pulsar_migration.metadata import resources as r
    from pulsar_migration.metadata.inventory import NamespaceLayout, TenantLayout, TopicRef, layout_resources
    from pulsar_migration.spec import MigrationSpec

    spec = MigrationSpec.from_dict({
        "tenant": "t", "source": "a", "target": "b",
        "clusters": {"a": {"admin_url": "http://a:1", "service_url": "pulsar://a:2"},
                     "b": {"admin_url": "http://b:1", "service_url": "pulsar://b:2"}}})
    policies = {"auth_policies": {"destination_auth": {
        "persistent://t/ns/x": {"reader": ["consume"]},
        "non-persistent://t/ns/x": {"reader": ["produce", "consume"], "other": ["produce"]},
    }}}
    policies["auth_policies"]["destination_auth"]["non-persistent://t/ns/loose"] = {"reader": ["consume"]}
    namespace = NamespaceLayout("ns", policies, [TopicRef("ns", "x", False, False)],
                                non_persistent_partitions={"x": 2})
    layout = TenantLayout({"adminRoles": []}, {"ns": namespace})
    rows = layout_resources(layout, spec, r.TARGET, "a")
    grants = [(row.key, row.payload) for row in rows if row.kind == r.TOPIC_PERMISSION]
    assert grants == [("ns/x|reader", r.canonical(["consume"]))]
    # The non-persistent grants of a synced (partitioned) non-persistent topic, as their own kind: before, they
    # were dropped, and the role was refused on the target after the switch. A non-partitioned one has no topic
    # to grant on there.
    loose = [(row.key, row.payload) for row in rows if row.kind == r.NON_PERSISTENT_TOPIC_PERMISSION]
    assert loose == [("ns/x|other", r.canonical(["produce"])), ("ns/x|reader", r.canonical(["consume", "produce"]))]


def test_a_grant_on_one_partition_of_a_selected_topic_is_carried_to_that_partition() -> None:
    """The broker honours a grant on a partition's own name: it was dropped (not a selected topic), and the role
    was refused on that partition of the target."""
    from pulsar_migration.metadata import resources as r
    from pulsar_migration.metadata.inventory import NamespaceLayout, TenantLayout, TopicRef, layout_resources
    from pulsar_migration.spec import MigrationSpec

    spec = MigrationSpec.from_dict({
        "tenant": "t", "source": "a", "target": "b", "topics": {"include": ["^ns/orders$", "^ns/plain$"]},
        "clusters": {"a": {"admin_url": "http://a:1", "service_url": "pulsar://a:2"},
                     "b": {"admin_url": "http://b:1", "service_url": "pulsar://b:2"}}})
    policies = {"auth_policies": {"destination_auth": {
        "persistent://t/ns/orders-partition-2": {"auditor": ["consume"]},
        "persistent://t/ns/plain-partition-0": {"stray": ["consume"]},  # plain is not partitioned: a topic of its own
        "persistent://t/ns/other-partition-0": {"x": ["consume"]},  # other is not selected
    }}}
    namespace = NamespaceLayout("ns", policies, [TopicRef("ns", "orders", True, False),
                                                 TopicRef("ns", "plain", False, False)])
    rows = layout_resources(TenantLayout({"adminRoles": []}, {"ns": namespace}), spec, r.TARGET, "a")
    grants = [(row.key, row.payload) for row in rows if row.kind == r.TOPIC_PERMISSION]
    assert grants == [(r.child_key("ns/orders-partition-2", "auditor"), r.canonical(["consume"]))]
