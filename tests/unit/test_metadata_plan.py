"""Planning rules of metadata sync (pure logic and the Spark join), no cluster needed."""

from __future__ import annotations

import json

import pytest
from pulsar_migration.metadata import resources as r
from pulsar_migration.metadata.inventory import _is_partition_of, namespace_policies, registration_payload
from pulsar_migration.metadata.plan import CONFLICT, CREATE, NOOP, UPDATE, decide, plan_counts, plan_metadata
from pulsar_migration.metadata.state import project_actual
from pulsar_migration.oauth2 import OAuth2Spec
from pulsar_migration.spec import ClusterSpec, TlsSpec
from pyspark.sql import SparkSession


def j(value: object) -> str:
    return r.canonical(value)


@pytest.mark.parametrize(("want", "have", "action", "reason_part"), [
    (3, 3, NOOP, "equal"),
    (0, 0, NOOP, "non-partitioned on both"),
    (8, 3, UPDATE, "grow partitions 3 -> 8"),
    (3, 8, CONFLICT, "never shrunk"),
    (0, 4, CONFLICT, "non-partitioned on the source"),
    (4, 0, CONFLICT, "non-partitioned on the target"),
])
def test_topic_rules_follow_pip370(want: int, have: int, action: str, reason_part: str) -> None:
    decision = decide(r.TOPIC, j({"partitions": want}), j({"partitions": have}))
    assert decision.action == action and reason_part in decision.reason
    if action == UPDATE:
        assert json.loads(decision.change or "") == {"partitions": want}
    else:
        assert decision.change is None


def test_non_persistent_partitioned_topics_follow_the_same_rules() -> None:
    assert decide(r.NON_PERSISTENT_TOPIC, j({"partitions": 4}), j({"partitions": 2})).action == UPDATE
    assert decide(r.NON_PERSISTENT_TOPIC, j({"partitions": 2}), j({"partitions": 4})).action == CONFLICT
    assert decide(r.NON_PERSISTENT_TOPIC, j({"partitions": 2}), None).action == CREATE


def test_absent_is_create_and_target_only_is_left_alone() -> None:
    assert decide(r.TOPIC, j({"partitions": 2}), None).action == CREATE
    created = decide(r.SCHEMA, j({"versions": [{"type": "AVRO"}]}), None)
    assert (created.action, created.change) == (CREATE, j({"versions": [{"type": "AVRO"}]}))
    assert decide(r.NAMESPACE, None, j({"policies": {}})).action == NOOP


def test_grants_only_ever_grow() -> None:
    decision = decide(r.NAMESPACE_PERMISSION, j(["consume", "produce"]), j(["consume", "functions"]))
    assert decision.action == UPDATE and "produce" in decision.reason
    assert json.loads(decision.change or "") == ["consume", "functions", "produce"]  # extra action kept
    assert decide(r.TOPIC_PERMISSION, j(["consume"]), j(["consume", "produce"])).action == NOOP


def test_tenant_keeps_target_roles_and_clusters() -> None:
    decision = decide(r.TENANT, j({"adminRoles": ["a"], "allowedClusters": ["x", "y"]}),
                      j({"adminRoles": ["b"], "allowedClusters": ["y", "z"]}))
    assert decision.action == UPDATE
    assert json.loads(decision.change or "") == {"adminRoles": ["a", "b"], "allowedClusters": ["x", "y", "z"]}
    assert decide(r.TENANT, j({"allowedClusters": ["x"]}), j({"adminRoles": [], "allowedClusters": ["x", "y"]})
                  ).action == NOOP


def test_namespace_policies_update_only_the_differing_fields() -> None:
    desired = j({"policies": {"message_ttl_in_seconds": 60, "deduplicationEnabled": True}, "numBundles": 4})
    actual = j({"policies": {"message_ttl_in_seconds": 60, "deduplicationEnabled": False,
                             "max_producers_per_topic": 3}, "numBundles": 16})
    decision = decide(r.NAMESPACE, desired, actual)
    assert decision.action == UPDATE and decision.reason == "differs in deduplicationEnabled"
    assert json.loads(decision.change or "") == {"policies": {"deduplicationEnabled": True}}
    assert decide(r.NAMESPACE, desired, j({"policies": {"message_ttl_in_seconds": 60, "deduplicationEnabled": True},
                                           "numBundles": 16})).action == NOOP


V0, V1, V2 = ({"version": i, "type": "AVRO", "data": f"schema-{i}", "properties": {}} for i in range(3))


@pytest.mark.parametrize(("want", "have", "action", "change", "reason_part"), [
    ([V0, V1], [V0, V1], NOOP, None, "2 version(s) equal"),
    ([V0, V1, V2], [V0], UPDATE, [V1, V2], "add versions 1..2"),
    ([V0, V1], [V0, V1, V2], NOOP, None, "1 more only on the target"),
    ([V0, V1], [V0, {**V2, "version": 1}], CONFLICT, None, "schema version 1 differs"),
    ([V0], [{**V1, "version": 0}], CONFLICT, None, "schema version 0 differs"),
    ([V1, V2], [], CONFLICT, None, "its next version is 0"),  # v0 was deleted on the source
    ([V1, V2], [{**V0, "data": "other"}], UPDATE, [V1, V2], "add versions 1..2"),  # numbers line up
    ([V0, V2], [V0], CONFLICT, None, "cannot get the same numbers"),
])
def test_schema_history_must_match_version_for_version(want: list, have: list, action: str,
                                                        change: list | None, reason_part: str) -> None:
    decision = decide(r.SCHEMA, j({"versions": want}), j({"versions": have}))
    assert decision.action == action and reason_part in decision.reason
    assert decision.change == (j({"versions": change}) if change else None)


def test_schema_projection_matches_by_version_number() -> None:
    assert project_actual(r.SCHEMA, j({"versions": [V0]}), j({"versions": [V0, V1]})) == j({"versions": [V0]})
    assert project_actual(r.SCHEMA, j({"versions": [V0, V1]}), j({"versions": [V0]})) == j({"versions": [V0, None]})
    assert project_actual(r.SCHEMA, j({"versions": [V1]}), j({"versions": [V0, V1]})) == j({"versions": [V1]})


def test_subscription_properties_grow_and_keep_target_only_keys() -> None:
    decision = decide(r.SUBSCRIPTION, j({"properties": {"a": "1"}}), j({"properties": {"a": "0", "t": "x"}}))
    assert decision.action == UPDATE and decision.reason == "properties differ in a"
    assert json.loads(decision.change or "") == {"properties": {"a": "1", "t": "x"}}  # the broker replaces the map
    assert decide(r.SUBSCRIPTION, j({"properties": {}}), j({"properties": {"t": "x"}})).action == NOOP


def test_cluster_registration_is_created_but_never_overwritten() -> None:
    desired = j({"serviceUrl": "http://b:8082", "brokerServiceUrl": "pulsar://b:6652"})
    assert decide(r.CLUSTER, desired, None).action == CREATE
    other = decide(r.CLUSTER, desired, j({"serviceUrl": "http://internal-b:8080", "brokerServiceUrl": "pulsar://b:6652"}))
    assert (other.action, other.change) == (NOOP, None)
    assert "serviceUrl" in other.reason and "never overwritten" in other.reason
    assert project_actual(r.CLUSTER, desired, j({"serviceUrl": "http://internal-b:8080"})) == desired
    assert project_actual(r.CLUSTER, desired, None) is None


def test_merged_maps_need_only_the_desired_keys() -> None:
    desired = j({"policies": {"properties": {"team": "payments"},
                              "backlog_quota_map": {"destination_storage": {"limitSize": 1}}}, "numBundles": 4})
    actual = j({"policies": {"properties": {"team": "payments", "extra": "kept"},
                             "backlog_quota_map": {"destination_storage": {"limitSize": 1},
                                                   "message_age": {"limitTime": 5}}}})
    assert decide(r.NAMESPACE, desired, actual).action == NOOP
    drifted = j({"policies": {"properties": {"team": "ops", "extra": "kept"}, "backlog_quota_map": {}}})
    decision = decide(r.NAMESPACE, desired, drifted)
    assert json.loads(decision.change or "") == {"policies": {
        "properties": {"team": "payments"}, "backlog_quota_map": {"destination_storage": {"limitSize": 1}}}}
    assert project_actual(r.NAMESPACE, desired, actual) == desired
    topic = decide(r.TOPIC_POLICIES, j({"backlogQuotaMap": {"destination_storage": {"limitSize": 2}}}),
                   j({"backlogQuotaMap": {"destination_storage": {"limitSize": 2}, "message_age": {}}}))
    assert topic.action == NOOP


def test_topic_properties_send_only_what_differs_and_keep_the_targets_own() -> None:
    """The broker merges a topic's properties key by key: keys only on the target stay, the change holds only the
    differing ones, and the verification sees the desired keys only."""
    desired = j({"properties": {"owner": "payments", "pii": "no"}})
    assert decide(r.TOPIC_PROPERTIES, desired, None).action == CREATE
    assert decide(r.TOPIC_PROPERTIES, desired, j({"properties": {"owner": "payments", "pii": "no", "x": "1"}})).action \
        == NOOP
    drifted = decide(r.TOPIC_PROPERTIES, desired, j({"properties": {"owner": "payments", "pii": "yes", "x": "1"}}))
    assert (drifted.action, drifted.reason) == (UPDATE, "properties differ in pii")
    assert json.loads(drifted.change or "") == {"properties": {"pii": "no"}}
    assert project_actual(r.TOPIC_PROPERTIES, desired, j({"properties": {"owner": "payments", "pii": "no",
                                                                          "x": "1"}})) == desired


def test_cluster_keyed_rate_maps_move_to_the_target_name() -> None:
    rate = {"dispatchThrottlingRateInMsg": 10}
    kept = namespace_policies({"topicDispatchRate": {"a": rate, "other": {"x": 1}}, "message_ttl_in_seconds": 5,
                               "retention_policies": None, "properties": {}, "replication_clusters": ["a"]},
                              own_cluster="a", as_cluster="b")
    assert kept == {"topicDispatchRate": {"b": rate}, "message_ttl_in_seconds": 5}


def test_partition_names_are_recognised_only_for_partitioned_parents() -> None:
    assert _is_partition_of("orders-partition-3", ["orders"])
    assert not _is_partition_of("orders-partition-x", ["orders"])
    assert not _is_partition_of("legacy-partition-0", ["orders"])


def test_registration_payload_never_holds_a_token() -> None:
    plain = registration_payload(ClusterSpec("b", "http://h:8082", "pulsar://h:6652"), with_auth=True)
    assert plain == {"serviceUrl": "http://h:8082", "brokerServiceUrl": "pulsar://h:6652"}
    secured = registration_payload(ClusterSpec("b", "https://h:8443", "pulsar+ssl://h:6651", token_env="B_TOKEN",
                                               tls=TlsSpec(trust_certs_file="/ca.pem")), with_auth=True)
    assert secured["serviceUrlTls"] == "https://h:8443" and secured["brokerClientTlsEnabled"] is True
    assert secured["authenticationPlugin"].endswith("AuthenticationToken")
    assert "authenticationParameters" not in secured
    copy_mode = registration_payload(ClusterSpec("b", "http://h:8082", "pulsar://h:6652", token_env="B_TOKEN"),
                                     with_auth=False)
    assert "authenticationPlugin" not in copy_mode  # a copy never has brokers authenticate to each other
    oauth = OAuth2Spec("https://auth.example.com/", "/etc/pulsar/b.json", audience="urn:pulsar")
    with_oauth = registration_payload(ClusterSpec("b", "http://h:8082", "pulsar://h:6652", oauth2=oauth),
                                      with_auth=True)
    assert with_oauth["authenticationPlugin"] == "org.apache.pulsar.client.impl.auth.oauth2.AuthenticationOAuth2"
    # What the peer's brokers get as parameters: where to read the credentials, never the secret itself.
    assert json.loads(oauth.broker_params()) == {"type": "client_credentials", "issuerUrl": "https://auth.example.com/",
                                                 "privateKey": "file:///etc/pulsar/b.json", "audience": "urn:pulsar"}


def test_projection_of_a_superset_equals_the_desired_payload() -> None:
    assert project_actual(r.NAMESPACE_PERMISSION, j(["consume"]), j(["consume", "produce"])) == j(["consume"])
    assert project_actual(r.TOPIC_POLICIES, j({"maxProducers": 4}), j({"maxProducers": 4, "messageTTL": 5})) == j(
        {"maxProducers": 4})
    assert project_actual(r.SCHEMA, j({"versions": [{"type": "AVRO"}]}), None) is None


def test_plan_join_blocks_children_of_conflicting_topics(spark: SparkSession) -> None:
    rows = [
        (r.TARGET, r.TOPIC, "ns/t", "ns", j({"partitions": 2})),
        (r.TARGET, r.SUBSCRIPTION, "ns/t|s", "ns", j({"properties": {}})),
        (r.TARGET, r.SCHEMA, "ns/t", "ns", j({"versions": [V0]})),
        (r.TARGET, r.TOPIC_PROPERTIES, "ns/t", "ns", j({"properties": {"owner": "a"}})),
        (r.TARGET, r.TOPIC, "ns/ok", "ns", j({"partitions": 0})),
        (r.TARGET, r.SUBSCRIPTION, "ns/ok|s", "ns", j({"properties": {}})),
    ]
    actual = [
        (r.TARGET, r.TOPIC, "ns/t", "ns", j({"partitions": 5})),
        (r.TARGET, r.TOPIC, "ns/only-here", "ns", j({"partitions": 0})),
    ]
    from pulsar_migration.metadata.plan import RESOURCE_SCHEMA

    plan = plan_metadata(spark.createDataFrame(rows, RESOURCE_SCHEMA), spark.createDataFrame(actual, RESOURCE_SCHEMA))
    got = {(row.kind, row.key): (row.action, row.reason, row.change) for row in plan.collect()}
    assert got[(r.TOPIC, "ns/t")][0] == CONFLICT
    assert got[(r.SUBSCRIPTION, "ns/t|s")][:2] == (CONFLICT, "topic in conflict: target has more partitions (5) "
                                                              "than the source (2); never shrunk")
    assert got[(r.SUBSCRIPTION, "ns/t|s")][2] is None
    assert got[(r.SCHEMA, "ns/t")][0] == CONFLICT
    assert got[(r.TOPIC_PROPERTIES, "ns/t")][0] == CONFLICT
    assert got[(r.TOPIC, "ns/ok")][0] == CREATE and got[(r.SUBSCRIPTION, "ns/ok|s")][0] == CREATE
    assert got[(r.TOPIC, "ns/only-here")][0] == NOOP
    counts = plan_counts(plan)
    assert (counts[CONFLICT], counts[CREATE], counts[NOOP], counts[UPDATE]) == (4, 2, 1, 0)
    assert counts["topic.CONFLICT"] == 1


def test_a_topic_name_with_a_bar_or_a_percent_keeps_its_children(spark: SparkSession) -> None:
    """`|` ends a child key's topic part: a topic `a|b` was split into `a` and `b|s` (its subscription created on a
    topic `a`, its conflict not blocking it). The topic part is escaped now (resources.child_key)."""
    for topic, name in (("ns/a|b", "s|x"), ("ns/100%7Cdone", "role"), ("ns/plain", "")):
        key = r.child_key(topic, name)
        assert r.split_child_key(key) == (topic, name)
    rows = [(r.TARGET, r.TOPIC, "ns/a|b", "ns", j({"partitions": 2})),
            (r.TARGET, r.SUBSCRIPTION, r.child_key("ns/a|b", "s"), "ns", j({"properties": {}})),
            (r.TARGET, r.TOPIC, "ns/a", "ns", j({"partitions": 0})),
            (r.TARGET, r.SUBSCRIPTION, r.child_key("ns/a", "b|s"), "ns", j({"properties": {}}))]
    actual = [(r.TARGET, r.TOPIC, "ns/a|b", "ns", j({"partitions": 5}))]
    from pulsar_migration.metadata.plan import RESOURCE_SCHEMA

    plan = plan_metadata(spark.createDataFrame(rows, RESOURCE_SCHEMA), spark.createDataFrame(actual, RESOURCE_SCHEMA))
    got = {(row.kind, row.key): row.action for row in plan.collect()}
    assert got[(r.SUBSCRIPTION, r.child_key("ns/a|b", "s"))] == CONFLICT  # blocked with its topic
    assert got[(r.SUBSCRIPTION, r.child_key("ns/a", "b|s"))] == CREATE  # another topic's: not confused with it


def test_settings_only_the_target_holds_are_named() -> None:
    from pulsar_migration.metadata.fields import set_only_on_target

    source = {"retention_policies": {"retentionSizeInMB": 1}, "backlog_quota_map": {"destination_storage": {}}}
    target = {**source, "message_ttl_in_seconds": 60, "backlog_quota_map": {"destination_storage": {},
                                                                           "message_age": {"limitTime": 5}},
              # the replication step's own, and what any new namespace holds: not the target's own settings
              "deduplicationEnabled": True, "subscription_auth_mode": "None", "is_allow_auto_update_schema": True,
              "properties": {}, "encryption_required": True}
    assert set_only_on_target(source, target) == ["backlog_quota_map.message_age", "encryption_required",
                                                  "message_ttl_in_seconds"]
    assert set_only_on_target(None, {"maxProducers": 2}) == ["maxProducers"]  # a topic the source set nothing on
