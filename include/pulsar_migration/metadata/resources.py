"""The resource model of metadata sync: one row per thing that must exist on a cluster.

A resource is (side, kind, key, namespace, payload). `side` says which cluster the row is about
("source" for the registrations and tenant access the source needs, "target" for everything else);
`payload` is canonical JSON so two inventories compare as strings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

SOURCE = "source"
TARGET = "target"

# Kinds, in the order apply must run them (a later kind may need an earlier one to exist).
CLUSTER = "cluster"
TENANT = "tenant"
NAMESPACE = "namespace"
NAMESPACE_PERMISSION = "namespace_permission"
SUBSCRIPTION_PERMISSION = "subscription_permission"
TOPIC = "topic"
# Partitioned non-persistent topics: only their partition metadata persists (their messages and
# subscriptions live in broker memory), but without it clients would get auto-created non-partitioned
# topics on the target.
NON_PERSISTENT_TOPIC = "non_persistent_topic"
TOPIC_PERMISSION = "topic_permission"
# Grants on non-persistent topics (the same namespace policy, keyed by the topic's domain): their own kind, so a
# grant never lands on a same-named persistent topic.
NON_PERSISTENT_TOPIC_PERMISSION = "non_persistent_topic_permission"
TOPIC_POLICIES = "topic_policies"
# Global topic policies (`pulsar-admin topics set-... -g`): the same settings, stored with the global flag and
# replicated to the namespace's clusters; a topic's own (local) value overrides its global one field by field.
TOPIC_GLOBAL_POLICIES = "topic_global_policies"
# A topic's own properties (PIP-180: set at creation or with `topics update-properties`; kept in the partitioned
# metadata of a partitioned topic, in the managed ledger of another). Not a topic policy: read and set whether or not
# the namespace holds topic policies, and merged by the broker key by key.
TOPIC_PROPERTIES = "topic_properties"
SCHEMA = "schema"
SUBSCRIPTION = "subscription"
READ_ERROR = "read_error"  # an executor could not read a topic; never planned, fails the step

APPLY_PHASES: tuple[tuple[str, ...], ...] = (
    (CLUSTER,),
    (TENANT,),
    (NAMESPACE,),
    (NAMESPACE_PERMISSION, SUBSCRIPTION_PERMISSION, TOPIC, NON_PERSISTENT_TOPIC),
    (TOPIC_PERMISSION, NON_PERSISTENT_TOPIC_PERMISSION, TOPIC_POLICIES, TOPIC_GLOBAL_POLICIES, TOPIC_PROPERTIES),
    # After the topic policies: an upload is checked against the topic's own compatibility strategy first.
    (SCHEMA,),
    (SUBSCRIPTION,),
)
ALL_KINDS = tuple(kind for phase in APPLY_PHASES for kind in phase)
# Kinds stored inside the namespace's policies znode: concurrent writes to one namespace race
# (optimistic versioning), so apply runs them one namespace at a time.
NAMESPACE_SERIAL_KINDS = frozenset({NAMESPACE, NAMESPACE_PERMISSION, SUBSCRIPTION_PERMISSION, TOPIC_PERMISSION,
                                    NON_PERSISTENT_TOPIC_PERMISSION})
# Kinds that hang off a topic: when the topic is in conflict they are not applied either.
TOPIC_POLICY_KINDS = frozenset({TOPIC_POLICIES, TOPIC_GLOBAL_POLICIES})
TOPIC_CHILD_KINDS = frozenset({TOPIC_PERMISSION, TOPIC_PROPERTIES, SCHEMA, SUBSCRIPTION}) | TOPIC_POLICY_KINDS
# Kinds keyed by their topic alone (the others that hang off a topic are keyed `topic|name`).
TOPIC_KEYED_KINDS = frozenset({TOPIC_PROPERTIES, SCHEMA}) | TOPIC_POLICY_KINDS

# Namespace policies kept on the target, with the admin call that sets each one on an existing
# namespace (a new namespace gets them all in its creation body). Fields not listed are either
# cluster-local (bundles layout, offload storage, resource groups) or handled by their own kind
# (auth_policies) or deliberately never touched (replication_clusters, allowed_clusters: changing
# them can trigger cascading topic deletion).
# value: (HTTP method, path suffix under /namespaces/{t}/{ns})
NAMESPACE_POLICY_SETTERS: dict[str, tuple[str, str]] = {
    "retention_policies": ("POST", "/retention"),
    "message_ttl_in_seconds": ("POST", "/messageTTL"),
    "deduplicationEnabled": ("POST", "/deduplication"),
    "deduplicationSnapshotIntervalSeconds": ("POST", "/deduplicationSnapshotInterval"),
    "schema_compatibility_strategy": ("PUT", "/schemaCompatibilityStrategy"),
    # Deprecated, yet 4.0 applies it where schema_compatibility_strategy is UNDEFINED (AutoUpdateDisabled: no
    # schema change at all); not carried, such a source's target took FULL.
    "schema_auto_update_compatibility_strategy": ("PUT", "/schemaAutoUpdateCompatibilityStrategy"),
    "is_allow_auto_update_schema": ("POST", "/isAllowAutoUpdateSchema"),
    "schema_validation_enforced": ("POST", "/schemaValidationEnforced"),
    "encryption_required": ("POST", "/encryptionRequired"),
    "subscription_auth_mode": ("POST", "/subscriptionAuthMode"),
    "max_producers_per_topic": ("POST", "/maxProducersPerTopic"),
    "max_consumers_per_topic": ("POST", "/maxConsumersPerTopic"),
    "max_consumers_per_subscription": ("POST", "/maxConsumersPerSubscription"),
    "max_unacked_messages_per_consumer": ("POST", "/maxUnackedMessagesPerConsumer"),
    "max_unacked_messages_per_subscription": ("POST", "/maxUnackedMessagesPerSubscription"),
    "max_subscriptions_per_topic": ("POST", "/maxSubscriptionsPerTopic"),
    "max_topics_per_namespace": ("POST", "/maxTopicsPerNamespace"),
    "autoTopicCreationOverride": ("POST", "/autoTopicCreation"),
    "autoSubscriptionCreationOverride": ("POST", "/autoSubscriptionCreation"),
    "delayed_delivery_policies": ("POST", "/delayedDelivery"),
    "inactive_topic_policies": ("POST", "/inactiveTopicPolicies"),
    "compaction_threshold": ("PUT", "/compactionThreshold"),
    "subscription_expiration_time_minutes": ("POST", "/subscriptionExpirationTime"),
    "persistence": ("POST", "/persistence"),
    "properties": ("PUT", "/properties"),
    "subscription_types_enabled": ("POST", "/subscriptionTypesEnabled"),
    "backlog_quota_map": ("POST", "/backlogQuota"),  # one call per quota type
    # Broker entry filters (PIP-105) by plugin name: the target's brokers must load the same plugins
    # (allowOverrideEntryFilters, entryFiltersDirectory), or the setter names the missing one.
    "entryFilters": ("POST", "/entryFilters"),
    # Rate maps are keyed by cluster name: the source's entry becomes the target's.
    "topicDispatchRate": ("POST", "/dispatchRate"),
    "subscriptionDispatchRate": ("POST", "/subscriptionDispatchRate"),
    "publishMaxMessageRate": ("POST", "/publishRate"),
    "clusterSubscribeRate": ("POST", "/subscribeRate"),
    "replicatorDispatchRate": ("POST", "/replicatorDispatchRate"),
    # Set by a POST (no value), removed by a DELETE: carried when on (see ONLY_WHEN_ON).
    "dispatcherPauseOnAckStatePersistentEnabled": ("POST", "/dispatcherPauseOnAckStatePersistent"),
}
CLUSTER_KEYED_POLICIES = frozenset(
    {"topicDispatchRate", "subscriptionDispatchRate", "publishMaxMessageRate", "clusterSubscribeRate",
     "replicatorDispatchRate"}
)
# Switches the broker reads back as `false` when never set: only `true` is a setting (one never set would otherwise
# be carried as an explicit value onto every topic).
ONLY_WHEN_ON = frozenset({"dispatcherPauseOnAckStatePersistentEnabled", "dispatcherPauseOnAckStatePersistent"})


def switch_off(name: str, value: Any) -> bool:
    """An ONLY_WHEN_ON switch read back as anything but `true`: no setting."""
    return name in ONLY_WHEN_ON and value is not True

# Topic-level policies read and set per topic (path suffix under /persistent/{t}/{ns}/{topic}).
# Topic policies live in the namespace's __change_events system topic: a namespace where it is absent
# or has never received an event has none, and inventory skips these calls there.
TOPIC_POLICY_PATHS: tuple[str, ...] = (
    "retention",
    "messageTTL",
    "deduplicationEnabled",
    "maxProducers",
    "maxConsumers",
    "maxUnackedMessagesOnConsumer",
    "maxUnackedMessagesOnSubscription",
    "maxSubscriptionsPerTopic",
    "maxMessageSize",
    "compactionThreshold",
    "persistence",
    "delayedDelivery",
    "inactiveTopicPolicies",
    "dispatchRate",
    "subscriptionDispatchRate",
    "publishRate",
    "backlogQuotaMap",
    "maxConsumersPerSubscription",
    "subscribeRate",
    "subscriptionTypesEnabled",
    "autoSubscriptionCreation",
    "schemaCompatibilityStrategy",  # set with PUT; the rest with POST
    "entryFilters",
    "deduplicationSnapshotInterval",
    "replicatorDispatchRate",
    "dispatcherPauseOnAckStatePersistent",  # set with a bare POST; `false` when unset (ONLY_WHEN_ON)
    # schemaValidationEnforced is left out: the broker answers `false` when it is unset.
)
TOPIC_POLICY_PUT = frozenset({"schemaCompatibilityStrategy"})
# Dispatch rates of single subscriptions (`topics set-subscription-dispatch-rate -s`), kept among the topic's policies
# by subscription name; read for the subscriptions the topic has.
SUBSCRIPTION_DISPATCH_RATES = "subscriptionLevelDispatchRates"
# Those with a global value too. 4.0.8 keeps a topic's schema compatibility strategy local only (its `isGlobal` is
# ignored: the local value is set and read back); entry filters stay local here (plugins are per cluster).
TOPIC_GLOBAL_POLICY_PATHS = tuple(p for p in TOPIC_POLICY_PATHS if p not in {"schemaCompatibilityStrategy",
                                                                             "entryFilters"})
# Map-valued settings the broker merges key by key (or that are set one key per call): the target
# must hold each desired key; keys only on the target are kept.
MERGED_MAP_FIELDS = frozenset({"properties", "backlog_quota_map", "backlogQuotaMap", SUBSCRIPTION_DISPATCH_RATES}) | \
    CLUSTER_KEYED_POLICIES
CHANGE_EVENTS_TOPIC = "__change_events"


def canonical(value: Any) -> str:
    """JSON with sorted keys and no spaces: equal values give equal strings."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Resource:
    side: str
    kind: str
    key: str
    namespace: str
    payload: str  # canonical JSON

    @classmethod
    def of(cls, side: str, kind: str, key: str, namespace: str, payload: Any) -> Resource:
        return cls(side, kind, key, namespace, canonical(payload))

    def as_tuple(self) -> tuple[str, str, str, str, str]:
        return (self.side, self.kind, self.key, self.namespace, self.payload)


def topic_key(namespace: str, topic: str) -> str:
    return f"{namespace}/{topic}"


def child_key(topic_local: str, name: str) -> str:
    """Key of a topic's (or namespace's) child (role, subscription): `ns/topic|name`. A topic name may hold `|`
    (a namespace's may not): its `%` and `|` are escaped, so the first `|` always ends it (a topic `a|b` was split
    into `a` and `b|name`: its grants and subscriptions went to the wrong topic or failed)."""
    return f"{topic_local.replace('%', '%25').replace('|', '%7C')}|{name}"


def split_child_key(key: str) -> tuple[str, str]:
    escaped, _, name = key.partition("|")
    return child_parent(escaped), name


def child_parent(escaped: str) -> str:
    """The topic (or namespace) part of a child key as child_key escaped it, unescaped."""
    return escaped.replace("%7C", "|").replace("%25", "%")


def is_system_topic(topic: str) -> bool:
    """Pulsar's internal topics: `__change_events`, `__transaction_buffer_snapshot`, ..., and the
    per-subscription `<topic>-<sub>__transaction_pending_ack` topics."""
    return topic.startswith("__") or topic.endswith("__transaction_pending_ack")


def is_system_cursor(subscription: str) -> bool:
    """Cursors the broker owns: replicators (`pulsar.repl.<cluster>`), the compactor (`__compaction`) and message
    deduplication (`pulsar.dedup`). Those two by their exact names: a user's `__compaction-audit` is a subscription."""
    return subscription.startswith("pulsar.repl.") or subscription in ("__compaction", "pulsar.dedup")
