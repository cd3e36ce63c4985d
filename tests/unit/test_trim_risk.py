"""Which target topics the broker may trim behind deduplication's cursor (replication.trim_risk): no retention and no
subscription. A fake admin answers the policy and subscription reads here; the real brokers' answers are in
tests/integration/test_trim_risk.py."""

from __future__ import annotations

import logging

import pytest
from pulsar_migration.replication.trim_risk import keeps_nothing, trim_risk, trimmed, unprotected_topics

from tests.unit.answering_admin import AnsweringAdmin

KEEPS = {"retentionTimeInMinutes": 60, "retentionSizeInMB": -1}
NOTHING = {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0}



def test_a_policy_keeps_messages_only_with_both_limits_above_zero() -> None:
    assert keeps_nothing({}) and keeps_nothing(NOTHING)
    assert keeps_nothing({"retentionTimeInMinutes": 60, "retentionSizeInMB": 0})
    assert not keeps_nothing(KEEPS) and not keeps_nothing({"retentionTimeInMinutes": -1, "retentionSizeInMB": -1})


def test_only_topics_held_by_nothing_are_named_and_a_keeping_namespace_costs_one_call(
        caplog: pytest.LogCaptureFixture) -> None:
    admin = AnsweringAdmin({
        "/namespaces/t/kept/retention": KEEPS,
        "/namespaces/t/bare/retention": None,  # no namespace policy: the topics' applied ones decide
        "/persistent/t/bare/subscribed/subscriptions": ["s1"],
        "/persistent/t/bare/alone/subscriptions": [],
        "/persistent/t/bare/alone/retention": NOTHING,
        "/persistent/t/bare/own-policy/subscriptions": [],
        "/persistent/t/bare/own-policy/retention": KEEPS,
    })
    topics = [f"persistent://t/{name}" for name in
              ("kept/a", "kept/b", "bare/subscribed", "bare/alone", "bare/own-policy", "bare/gone")]
    bare = unprotected_topics(admin, topics, 4)  # type: ignore[arg-type]
    assert bare == ["persistent://t/bare/alone"]
    assert not [c for c in admin.calls if c.startswith("/persistent/t/kept/")]
    with caplog.at_level(logging.WARNING, logger="pulsar_migration.replication.trim_risk"):
        risk = trim_risk("cluster-b", bare)
    assert risk is not None and risk["count"] == 1 and risk["topics"] == bare
    assert risk["warning"].startswith(
        "1 topic(s) keep no retention and have no subscription on cluster-b (t/bare/alone)")
    assert [r.getMessage() for r in caplog.records] == [risk["warning"]]
    assert trim_risk("cluster-b", []) is None


def test_a_partition_without_the_lowest_ledger_its_map_holds_was_trimmed() -> None:
    admin = AnsweringAdmin({
        "/persistent/t/bare/a-partition-0/internalStats": {"ledgers": [{"ledgerId": 9}, {"ledgerId": 12}]},
        "/persistent/t/bare/a-partition-1/internalStats": {"ledgers": [{"ledgerId": 7}, {"ledgerId": 12}]},
        "/persistent/t/bare/b/internalStats": {"ledgers": []},
    })
    mapped = [("persistent://t/bare/a-partition-0", 7), ("persistent://t/bare/a-partition-1", 7),
              ("persistent://t/bare/b", 3), ("persistent://t/bare/gone", 3)]
    assert trimmed(admin, mapped, 2) == [("persistent://t/bare/a-partition-0", 9, 7)]  # type: ignore[arg-type]
