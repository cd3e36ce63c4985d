"""Reads what exists: the source tenant (as the state the target must reach) and the target's state.

The driver lists namespaces and topics (a few calls per namespace); the per-topic reads (partition
count, subscriptions, schema history, topic policies) run in Spark executors, a bounded thread pool each.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pulsar_migration.admin import AdminError, NotFound, PulsarAdmin, schema_path, seg
from pulsar_migration.metadata import resources as r
from pulsar_migration.spec import ClusterSpec, MigrationSpec
from pulsar_migration.stepjob import BadInput, StepFailed

log = logging.getLogger(__name__)

TOKEN_AUTH_PLUGIN = "org.apache.pulsar.client.impl.auth.AuthenticationToken"
OAUTH2_AUTH_PLUGIN = "org.apache.pulsar.client.impl.auth.oauth2.AuthenticationOAuth2"


class MetadataError(StepFailed):
    """Inventory or apply found something that stops the step (message: one line)."""


@dataclass(frozen=True)
class TopicRef:
    namespace: str
    topic: str
    partitioned: bool
    read_policies: bool  # the namespace may have topic-level policies (its __change_events has events)

    @property
    def local(self) -> str:
        return r.topic_key(self.namespace, self.topic)


@dataclass
class NamespaceLayout:
    name: str
    policies: dict[str, Any]
    topics: list[TopicRef] = field(default_factory=list)
    non_persistent_partitions: dict[str, int] = field(default_factory=dict)  # partitioned ones only


@dataclass
class TenantLayout:
    """What the driver reads of one tenant on one cluster (None tenant_info: tenant absent)."""

    tenant_info: dict[str, Any] | None
    namespaces: dict[str, NamespaceLayout] = field(default_factory=dict)

    @property
    def topics(self) -> list[TopicRef]:
        return [t for ns in self.namespaces.values() for t in ns.topics]


# -- cluster registration --------------------------------------------------------------------------

def registration_payload(cluster: ClusterSpec, *, with_auth: bool) -> dict[str, Any]:
    """What a peer must hold about `cluster` to reach it (no secret: the token is added at apply).

    Auth is only for broker-to-broker replication (geo mode): a copy never has brokers connect to each
    other, so it never stores a token in the peer's registration.
    """
    payload: dict[str, Any] = {}
    if cluster.admin_url.startswith("https://"):
        payload["serviceUrlTls"] = cluster.admin_url
    else:
        payload["serviceUrl"] = cluster.admin_url
    if cluster.service_url.startswith("pulsar+ssl://"):
        payload["brokerServiceUrlTls"] = cluster.service_url
    else:
        payload["brokerServiceUrl"] = cluster.service_url
    if cluster.tls is not None:
        payload["brokerClientTlsEnabled"] = True
        payload["tlsAllowInsecureConnection"] = bool(cluster.tls.allow_insecure)
        if cluster.tls.trust_certs_file:
            payload["brokerClientTrustCertsFilePath"] = cluster.tls.trust_certs_file
        if cluster.tls.cert_file and cluster.tls.key_file:  # a peer's replicator shows them to a mutual-TLS broker
            payload["brokerClientCertificateFilePath"] = cluster.tls.cert_file
            payload["brokerClientKeyFilePath"] = cluster.tls.key_file
    if with_auth and cluster.oauth2:
        payload["authenticationPlugin"] = OAUTH2_AUTH_PLUGIN
    elif with_auth and (cluster.token_env or cluster.token_file):
        payload["authenticationPlugin"] = TOKEN_AUTH_PLUGIN
    return payload


def read_registration(admin: PulsarAdmin, name: str, keys: Iterable[str]) -> dict[str, Any] | None:
    """A cluster's registration as `admin` holds it, projected on `keys` (never the auth parameters)."""
    try:
        data = admin.cluster(name)
    except NotFound:
        return None
    return {k: data.get(k) for k in keys}


# -- tenant layout (driver) ------------------------------------------------------------------------

def read_layout(admin: PulsarAdmin, spec: MigrationSpec, *, must_exist: bool) -> TenantLayout:
    """Tenant, selected namespaces with policies, selected topics of one cluster."""
    try:
        tenant_info = admin.get(f"/tenants/{seg(spec.tenant)}")
    except NotFound:
        if must_exist:
            raise BadInput(f"tenant '{spec.tenant}' does not exist on cluster {admin.name}") from None
        return TenantLayout(None)
    layout = TenantLayout(tenant_info)
    for full_name in admin.get(f"/namespaces/{seg(spec.tenant)}"):
        ns = full_name.split("/", 1)[1]
        if not spec.namespace_selected(ns):
            continue
        layout.namespaces[ns] = _read_namespace(admin, spec, ns)
    if must_exist and spec.namespaces:
        missing = sorted(set(spec.namespaces) - set(layout.namespaces))
        if missing:
            raise MetadataError(
                f"namespace(s) {', '.join(missing)} of tenant '{spec.tenant}' do not exist on cluster {admin.name}"
            )
    return layout


def _read_namespace(admin: PulsarAdmin, spec: MigrationSpec, ns: str) -> NamespaceLayout:
    base = f"/persistent/{seg(spec.tenant)}/{seg(ns)}"
    policies = admin.get(f"/namespaces/{seg(spec.tenant)}/{seg(ns)}")
    partitioned = [_short(t) for t in admin.get(f"{base}/partitioned")]
    every = [_short(t) for t in admin.get(base, params={"includeSystemTopic": "true"})]
    has_topic_policies = may_hold_topic_policies(admin, base, every)
    layout = NamespaceLayout(ns, policies)
    for topic in partitioned:
        if not r.is_system_topic(topic) and spec.topics.selects(r.topic_key(ns, topic)):
            layout.topics.append(TopicRef(ns, topic, True, has_topic_policies))
    for topic in every:
        if _is_partition_of(topic, partitioned) or r.is_system_topic(topic):
            continue
        if spec.topics.selects(r.topic_key(ns, topic)):
            layout.topics.append(TopicRef(ns, topic, False, has_topic_policies))
    non_persistent = f"/non-persistent/{seg(spec.tenant)}/{seg(ns)}"
    for topic in (_short(t) for t in admin.get(f"{non_persistent}/partitioned")):
        if not r.is_system_topic(topic) and spec.topics.selects(r.topic_key(ns, topic)):
            layout.non_persistent_partitions[topic] = admin.get(f"{non_persistent}/{seg(topic)}/partitions")[
                "partitions"]
    return layout


def may_hold_topic_policies(admin: PulsarAdmin, namespace_base: str, every: list[str] | None = None) -> bool:
    """Whether any topic of the namespace may have topic-level policies (else their per-topic reads are skipped).

    Topic policies are events in the namespace's `__change_events` system topic. The broker creates that
    topic as soon as any topic of the namespace is loaded, so its existence says little; whether it ever
    received an event says it all: no entry in its ledgers and no compacted ledger means no policies. One
    call per namespace instead of len(TOPIC_POLICY_PATHS) calls per topic. Anything unexpected (a
    partitioned `__change_events`, missing fields, an error) answers True: reading too much is only slower.
    `every`: the namespace's topics, system ones included, when already listed (None: not listed; an absent
    `__change_events` answers NotFound then).
    """
    if every is not None and r.CHANGE_EVENTS_TOPIC not in every:
        return any(t.startswith(f"{r.CHANGE_EVENTS_TOPIC}-partition-") for t in every)
    try:
        stats = admin.get(f"{namespace_base}/{r.CHANGE_EVENTS_TOPIC}/internalStats")
    except NotFound:
        return every is not None  # listed yet gone: read the policies; never there: none
    except AdminError as exc:
        log.warning("cannot read %s/%s internal stats on %s (%s); reading topic policies of every topic",
                    namespace_base, r.CHANGE_EVENTS_TOPIC, admin.name, exc)
        return True
    if not isinstance(stats, dict) or "numberOfEntries" not in stats:
        return True
    compacted = stats.get("compactedLedger") or {}
    return int(stats["numberOfEntries"]) > 0 or int(compacted.get("entries", -1)) > 0


def _is_partition_of(topic: str, partitioned: list[str]) -> bool:
    base, sep, index = topic.rpartition("-partition-")
    return bool(sep) and index.isdigit() and base in partitioned


def _short(full_topic: str) -> str:
    """`persistent://t/ns/name` -> `name`."""
    return full_topic.split("://", 1)[-1].split("/", 2)[2]


# -- resources from the layout (driver) ------------------------------------------------------------

def namespace_policies(policies: dict[str, Any], own_cluster: str, as_cluster: str) -> dict[str, Any]:
    """The synced subset of a namespace's policies, cluster-keyed maps re-keyed to `as_cluster`."""
    kept: dict[str, Any] = {}
    for name in r.NAMESPACE_POLICY_SETTERS:
        value = policies.get(name)
        if name in r.CLUSTER_KEYED_POLICIES:
            value = {as_cluster: value[own_cluster]} if value and own_cluster in value else None
        if value is None or value == {} or r.switch_off(name, value):
            continue
        kept[name] = value
    return kept


def layout_resources(layout: TenantLayout, spec: MigrationSpec, side: str, own_cluster: str) -> list[r.Resource]:
    """Namespaces and the grants stored in namespace policies, as rows for `side`.

    Source rows are expressed as the target must hold them (cluster-keyed maps re-keyed).
    """
    rows: list[r.Resource] = []
    selected_topics = {t.local: t for t in layout.topics}
    for ns, ns_layout in sorted(layout.namespaces.items()):
        policies = ns_layout.policies
        rows.append(r.Resource.of(side, r.NAMESPACE, ns, ns, {
            "policies": namespace_policies(policies, own_cluster, spec.target),
            "numBundles": (policies.get("bundles") or {}).get("numBundles"),
        }))
        for topic, partitions in sorted(ns_layout.non_persistent_partitions.items()):
            rows.append(r.Resource.of(side, r.NON_PERSISTENT_TOPIC, r.topic_key(ns, topic), ns,
                                      {"partitions": partitions}))
        auth = policies.get("auth_policies") or {}
        for role, actions in sorted((auth.get("namespace_auth") or {}).items()):
            rows.append(r.Resource.of(side, r.NAMESPACE_PERMISSION, r.child_key(ns, role), ns, sorted(actions)))
        for sub, roles in sorted((auth.get("subscription_auth_roles") or {}).items()):
            rows.append(r.Resource.of(side, r.SUBSCRIPTION_PERMISSION, r.child_key(ns, sub), ns, sorted(roles)))
        for topic_uri, grants in sorted((auth.get("destination_auth") or {}).items()):
            domain, _, path = topic_uri.partition("://")
            local = path.split("/", 1)[1]
            # Each domain its own kind: a non-persistent grant must not land on a same-named persistent topic.
            kind = {"persistent": r.TOPIC_PERMISSION, "non-persistent": r.NON_PERSISTENT_TOPIC_PERMISSION}.get(domain)
            # A grant on one partition of a selected partitioned topic is its own (the broker honours it on that
            # name): carried to the same partition (it was dropped, the role refused there on the target).
            owner = partition_owner(local, selected_topics) if kind == r.TOPIC_PERMISSION else None
            if kind is None or not spec.topics.selects(owner or local):
                continue
            # The topics synced: selected persistent ones, partitioned non-persistent ones (the others have no
            # metadata to create, and a grant needs its topic).
            if (local not in selected_topics and owner is None) if kind == r.TOPIC_PERMISSION else \
                    local.split("/", 1)[1] not in ns_layout.non_persistent_partitions:
                continue
            for role, actions in sorted(grants.items()):
                rows.append(r.Resource.of(side, kind, r.child_key(local, role), ns, sorted(actions)))
    return rows


def partition_owner(local: str, selected_topics: dict[str, TopicRef]) -> str | None:
    """The selected partitioned topic `local` is a partition of (`ns/orders` for `ns/orders-partition-2`), or None."""
    base, found, index = local.rpartition("-partition-")
    owner = selected_topics.get(base) if found and index.isdigit() else None
    return base if owner is not None and owner.partitioned else None


def tenant_row(side: str, tenant: str, info: dict[str, Any] | None) -> r.Resource | None:
    if info is None:
        return None
    return r.Resource.of(side, r.TENANT, tenant, "", {
        "adminRoles": sorted(info.get("adminRoles") or []),
        "allowedClusters": sorted(info.get("allowedClusters") or []),
    })


# -- per-topic details (executors) -----------------------------------------------------------------

def topic_resources(admin: PulsarAdmin, tenant: str, ref: TopicRef, side: str) -> list[r.Resource]:
    """Topic (partition count), durable subscriptions, schema history and topic policies of one topic."""
    base = f"/persistent/{seg(tenant)}/{seg(ref.namespace)}/{seg(ref.topic)}"
    rows: list[r.Resource] = []
    metadata = admin.get(f"{base}/partitions") if ref.partitioned else {}
    partitions = metadata.get("partitions", 0)
    rows.append(r.Resource.of(side, r.TOPIC, ref.local, ref.namespace, {"partitions": partitions}))
    properties = user_topic_properties(metadata.get("properties") if ref.partitioned else
                                       own_topic_properties(admin, base))
    if properties:
        rows.append(r.Resource.of(side, r.TOPIC_PROPERTIES, ref.local, ref.namespace, {"properties": properties}))
    try:
        # A partitioned topic's: the properties of each partition holding it; another's: its properties.
        subscriptions: dict[str, dict[str, Any]] = {
            sub: {"partitions": on} for sub, on in partitioned_subscriptions(admin, tenant, ref, partitions).items()
        } if ref.partitioned else {
            sub: {"properties": sub_stats.get("subscriptionProperties") or {}}
            for sub, sub_stats in (admin.get(f"{base}/stats").get("subscriptions") or {}).items()
            if durable_user_subscription(sub, sub_stats)}
    except NotFound:
        subscriptions = {}
    for sub, payload in sorted(subscriptions.items()):
        rows.append(r.Resource.of(side, r.SUBSCRIPTION, r.child_key(ref.local, sub), ref.namespace, payload))
    try:
        history = admin.get(f"{schema_path(tenant, ref.namespace, ref.topic)}/schemas")
    except NotFound:
        history = None
    versions = sorted((history or {}).get("getSchemaResponses") or [], key=lambda v: int(v["version"]))
    if versions:
        # The whole history, in order: messages carry their schema version, so the target must number
        # the same schemas the same way.
        rows.append(r.Resource.of(side, r.SCHEMA, ref.local, ref.namespace, {"versions": [
            {"version": int(v["version"]), "type": v.get("type"), "data": v.get("data") or "",
             "properties": v.get("properties") or {}}
            for v in versions
        ]}))
    if ref.read_policies:
        for kind, is_global in ((r.TOPIC_POLICIES, False), (r.TOPIC_GLOBAL_POLICIES, True)):
            policies = read_topic_policies(admin, base, is_global)
            rates = subscription_dispatch_rates(admin, base, sorted(subscriptions), is_global)
            if rates:
                policies[r.SUBSCRIPTION_DISPATCH_RATES] = rates
            if policies:
                rows.append(r.Resource.of(side, kind, ref.local, ref.namespace, policies))
    return rows


def own_policy(is_global: bool) -> dict[str, str]:
    """Query of a topic policy's own value (not the one applied from the namespace or broker), local or global."""
    return {"applied": "false", "isGlobal": str(is_global).lower()}


def subscription_dispatch_rates(admin: PulsarAdmin, base: str, subscriptions: list[str],
                                is_global: bool) -> dict[str, Any]:
    """The dispatch rates set on single subscriptions of the topic, by subscription name."""
    rates = {}
    for sub in subscriptions:
        rate = admin.get(f"{base}/{seg(sub)}/dispatchRate", params=own_policy(is_global))
        if rate:
            rates[sub] = rate
    return rates


def read_topic_policies(admin: PulsarAdmin, base: str, is_global: bool) -> dict[str, Any]:
    """The topic's own (local or global) policies, as set: not the values applied from elsewhere."""
    policies = {}
    for path in r.TOPIC_GLOBAL_POLICY_PATHS if is_global else r.TOPIC_POLICY_PATHS:
        value = admin.get(f"{base}/{path}", params=own_policy(is_global))
        if value not in (None, "", {}, [], b"") and not r.switch_off(path, value):
            policies[path] = value
    return policies


# Keys the broker itself keeps among a topic's properties (a non-partitioned topic's are its managed ledger's): the
# exclusive producers' fencing epoch, the blue-green migration mark, a shadow topic's source. Carried, they would
# make the target's topic migrated or a shadow when it next loads.
BROKER_TOPIC_PROPERTIES = frozenset({"pulsar.topic.epoch", "migrated", "PULSAR.SHADOW_SOURCE"})


def user_topic_properties(properties: dict[str, str] | None) -> dict[str, str]:
    return {k: v for k, v in (properties or {}).items() if k not in BROKER_TOPIC_PROPERTIES}


def own_topic_properties(admin: PulsarAdmin, base: str) -> dict[str, str]:
    """A non-partitioned topic's properties (kept in its managed ledger); {} where it does not exist."""
    try:
        return admin.get(f"{base}/properties") or {}
    except NotFound:
        return {}


def durable_user_subscription(name: str, sub_stats: dict[str, Any]) -> bool:
    return not r.is_system_cursor(name) and sub_stats.get("isDurable") is not False


def partitioned_subscriptions(admin: PulsarAdmin, tenant: str, ref: TopicRef,
                              partitions: int) -> dict[str, dict[str, dict[str, str]]]:
    """The durable subscriptions of a partitioned topic, each with the partitions holding it (index as text) and
    their properties. A subscription can be on some partitions only (created on one partition's name, or deleted
    from some): it was created on every partition of the target, at the earliest position, where a client would
    have had the source create it afresh (at its initial position, by default the latest). Properties are each
    partition's own: one compared for all missed the partitions a kill left with the old ones.

    The broker's partitioned stats leave out a partition whose stats failed (an unload, a ledger recovering) and
    still answer 200: its subscriptions were silently missing from the inventory (not created on the target; on the
    target's side, one missing there passed for present). A partition left out is read on its own (NotFound: it
    does not exist, so it has none)."""
    base = f"/persistent/{seg(tenant)}/{seg(ref.namespace)}"
    stats = admin.get(f"{base}/{seg(ref.topic)}/partitioned-stats")
    per_partition: dict[int, dict[str, Any]] = {}
    for name, partition_stats in (stats.get("partitions") or {}).items():
        index = name.rsplit("-partition-", 1)[-1]
        if index.isdigit() and int(index) < partitions:
            per_partition[int(index)] = (partition_stats or {}).get("subscriptions") or {}
    for i in range(partitions):
        if i in per_partition:
            continue
        try:
            per_partition[i] = admin.get(f"{base}/{seg(f'{ref.topic}-partition-{i}')}/stats").get(
                "subscriptions") or {}
        except NotFound:
            continue
    found: dict[str, dict[str, dict[str, str]]] = {}
    for i in sorted(per_partition):
        for sub, sub_stats in per_partition[i].items():
            if durable_user_subscription(sub, sub_stats):
                found.setdefault(sub, {})[str(i)] = sub_stats.get("subscriptionProperties") or {}
    return found


def fetch_topic_resources(
    admin_factory: Callable[[], PulsarAdmin], tenant: str, refs: Iterable[TopicRef], side: str, concurrency: int
) -> Iterator[tuple[str, str, str, str, str]]:
    """Runs `topic_resources` over `refs` with at most `concurrency` calls in flight."""
    admin = admin_factory()

    def read(ref: TopicRef) -> list[r.Resource]:
        try:
            return topic_resources(admin, tenant, ref, side)
        except Exception as exc:  # reported as a row: the driver fails with one clear line
            return [r.Resource.of(side, r.READ_ERROR, ref.local, ref.namespace, {"error": str(exc)})]

    try:
        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
            for rows in pool.map(read, list(refs)):
                yield from (row.as_tuple() for row in rows)
    finally:
        admin.close()
