"""Applies plan rows (CREATE/UPDATE) with admin calls; never deletes, shrinks or retypes anything.

Rows run phase by phase (clusters, tenant, namespaces, ... subscriptions). Within a phase, rows that
write the same namespace's policies run one after another (the broker versions that znode), all else
in parallel: Spark tasks over groups, a bounded thread pool per task.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

from pyspark.sql import SparkSession

from pulsar_migration.admin import (
    BUSY_ATTEMPTS,
    AdminError,
    Conflict,
    PulsarAdmin,
    asked_again_while_busy,
    schema_path,
    seg,
    seg_twice,
)
from pulsar_migration.metadata import resources as r
from pulsar_migration.metadata.inventory import OAUTH2_AUTH_PLUGIN, TOKEN_AUTH_PLUGIN
from pulsar_migration.metadata.plan import CHANGING_ACTIONS, CREATE
from pulsar_migration.spec import MigrationSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Change:
    side: str
    kind: str
    key: str
    namespace: str
    action: str
    desired: str
    change: str

    def serial_group(self) -> tuple[str, ...]:
        if self.kind in r.NAMESPACE_SERIAL_KINDS:
            return (self.side, "namespace-policies", self.namespace)
        return (self.side, self.kind, self.key)


@dataclass(frozen=True)
class ChangeResult:
    side: str
    kind: str
    key: str
    action: str
    ok: bool
    error: str | None
    millis: int


PRECONDITION_FAILED = 412


def retention_before_quota(policies: dict[str, Any], retention: str, quota: str,
                           set_one: Callable[[str, Any], None]) -> None:
    """Sets `policies` one by one, the retention before the backlog quota: the broker checks a quota against the
    retention in force when it is set (412 "Backlog Quota exceeds configured retention quota"), so a quota raised
    with its retention was refused on every run (sorted by name, the quota came first). Where the retention is
    refused instead (412: the target's quota now exceeds the smaller retention), the quota goes first."""
    quota_set = False
    for name, value in sorted(policies.items(), key=lambda item: item[0] == quota):
        if name == quota and quota_set:
            continue
        try:
            set_one(name, value)
        except AdminError as exc:
            if name != retention or quota not in policies or exc.status != PRECONDITION_FAILED:
                raise
            set_one(quota, policies[quota])
            quota_set = True
            set_one(name, value)


class ChangeApplier:
    """Turns one Change into admin calls on the cluster of its side."""

    def __init__(self, spec: MigrationSpec, admins: dict[str, PulsarAdmin]) -> None:
        self.spec = spec
        self.admins = admins
        self.tenant = seg(spec.tenant)

    def apply(self, c: Change) -> str | None:
        """Applies the change; returns the broker's answer when a CREATE found the resource there (409)."""
        admin = self.admins[c.side]
        body = json.loads(c.change)
        handler = getattr(self, f"_apply_{c.kind}")
        try:
            # A CREATE asked again while busy answers 409 (exists) or creates it.
            asked_again_while_busy(lambda: handler(admin, c, body), f"{c.kind} {c.key} on {admin.name}",
                                   attempts=BUSY_ATTEMPTS if c.action == CREATE else 1)
        except Conflict as exc:
            # A CREATE that finds the resource already there (e.g. a retry after a lost response) is fine: the
            # verification compares the actual state either way. Its answer is kept: a 409 for something else (a
            # non-partitioned `x-partition-0` where a partitioned `x` is created) names why it differs.
            if c.action != CREATE:
                raise
            return f"409 {exc}"
        return None

    def _apply_cluster(self, admin: PulsarAdmin, c: Change, _: Any) -> None:
        data = json.loads(c.desired)
        peer = self.spec.clusters[c.key]
        if data.get("authenticationPlugin") == OAUTH2_AUTH_PLUGIN and peer.oauth2:  # geo mode only
            data["authenticationParameters"] = peer.oauth2.broker_params()
            log.warning("cluster %s's registration on %s names the OAuth2 credentials file %s: the brokers' "
                        "replicators read it on their own hosts, so it must exist there", c.key, admin.name,
                        peer.oauth2.credentials_file)
        if data.get("authenticationPlugin") == TOKEN_AUTH_PLUGIN:  # geo mode only: brokers replicate
            data["authenticationParameters"] = f"token:{peer.token()}"
            if peer.token_file:  # the brokers' replicators cannot read the tools' file: they get today's token
                log.warning("cluster %s's registration on %s holds the token now in %s; the brokers never read "
                            "that file again, so give their replication a token that outlives it", c.key,
                            admin.name, peer.token_file)
        admin.put(f"/clusters/{seg(c.key)}", data)  # plan only creates: a registration is never overwritten

    def _apply_tenant(self, admin: PulsarAdmin, c: Change, body: dict[str, Any]) -> None:
        info = {"adminRoles": body.get("adminRoles", []), "allowedClusters": body["allowedClusters"]}
        path = f"/tenants/{self.tenant}"
        admin.put(path, info) if c.action == CREATE else admin.post(path, info)

    def _apply_namespace(self, admin: PulsarAdmin, c: Change, body: dict[str, Any]) -> None:
        path = f"/namespaces/{self.tenant}/{seg(c.key)}"
        if c.action == CREATE:
            create_body = dict(body["policies"])
            # A creation body's entry filters are stored unchecked, naming plugins the target may not load: set
            # through their setter, which checks them.
            filters = create_body.pop("entryFilters", None)
            if body.get("numBundles"):
                create_body["bundles"] = {"numBundles": body["numBundles"]}
            admin.put(path, create_body)
            if filters is not None:
                method, suffix = r.NAMESPACE_POLICY_SETTERS["entryFilters"]
                admin.request(method, f"{path}{suffix}", json_body=filters)
            return
        def set_one(name: str, value: Any) -> None:
            method, suffix = r.NAMESPACE_POLICY_SETTERS[name]
            if name == "backlog_quota_map":
                for quota_type, quota in value.items():
                    admin.post(f"{path}{suffix}", quota, params={"backlogQuotaType": quota_type})
            elif name in r.CLUSTER_KEYED_POLICIES:
                admin.request(method, f"{path}{suffix}", json_body=value[self.spec.target])
            else:
                admin.request(method, f"{path}{suffix}", json_body=value)

        retention_before_quota(body["policies"], "retention_policies", "backlog_quota_map", set_one)

    def _apply_namespace_permission(self, admin: PulsarAdmin, c: Change, actions: list[str]) -> None:
        ns, role = r.split_child_key(c.key)
        admin.post(f"/namespaces/{self.tenant}/{seg(ns)}/permissions/{seg(role)}", actions)

    def _apply_subscription_permission(self, admin: PulsarAdmin, c: Change, roles: list[str]) -> None:
        ns, sub = r.split_child_key(c.key)
        admin.post(f"/namespaces/{self.tenant}/{seg(ns)}/permissions/subscription/{seg(sub)}", roles)

    def _topic_path(self, topic_local: str) -> str:
        ns, topic = topic_local.split("/", 1)
        return f"/persistent/{self.tenant}/{seg(ns)}/{seg(topic)}"

    def _apply_topic(self, admin: PulsarAdmin, c: Change, body: dict[str, Any]) -> None:
        path = self._topic_path(c.key)
        partitions = body["partitions"]
        if c.action == CREATE:
            admin.put(f"{path}/partitions", partitions) if partitions else admin.put(path)
        else:  # grow only: plan never emits UPDATE for a shrink or a retype
            admin.post(f"{path}/partitions", partitions)

    def _apply_non_persistent_topic(self, admin: PulsarAdmin, c: Change, body: dict[str, Any]) -> None:
        ns, topic = c.key.split("/", 1)
        path = f"/non-persistent/{self.tenant}/{seg(ns)}/{seg(topic)}/partitions"
        admin.put(path, body["partitions"]) if c.action == CREATE else admin.post(path, body["partitions"])

    def _apply_topic_permission(self, admin: PulsarAdmin, c: Change, actions: list[str]) -> None:
        topic_local, role = r.split_child_key(c.key)
        admin.post(f"{self._topic_path(topic_local)}/permissions/{seg(role)}", actions)

    def _apply_non_persistent_topic_permission(self, admin: PulsarAdmin, c: Change, actions: list[str]) -> None:
        topic_local, role = r.split_child_key(c.key)
        ns, topic = topic_local.split("/", 1)
        admin.post(f"/non-persistent/{self.tenant}/{seg(ns)}/{seg(topic)}/permissions/{seg(role)}", actions)

    def _apply_topic_policies(self, admin: PulsarAdmin, c: Change, policies: dict[str, Any],
                              is_global: bool = False) -> None:
        path = self._topic_path(c.key)
        scope = {"isGlobal": "true"} if is_global else {}

        def set_one(name: str, value: Any) -> None:
            if name == "messageTTL":  # 4.0 takes the TTL as a query parameter
                admin.post(f"{path}/messageTTL", params={"messageTTL": value, **scope})
            elif name == "backlogQuotaMap":
                for quota_type, quota in value.items():
                    admin.post(f"{path}/backlogQuota", quota, params={"backlogQuotaType": quota_type, **scope})
            elif name == r.SUBSCRIPTION_DISPATCH_RATES:  # one call per subscription
                for sub, rate in value.items():
                    admin.post(f"{path}/{seg(sub)}/dispatchRate", rate, params=scope or None)
            else:
                admin.request("PUT" if name in r.TOPIC_POLICY_PUT else "POST", f"{path}/{name}", json_body=value,
                              params=scope or None)

        retention_before_quota(policies, "retention", "backlogQuotaMap", set_one)

    def _apply_topic_global_policies(self, admin: PulsarAdmin, c: Change, policies: dict[str, Any]) -> None:
        self._apply_topic_policies(admin, c, policies, is_global=True)

    def _apply_topic_properties(self, admin: PulsarAdmin, c: Change, body: dict[str, Any]) -> None:
        # Merged into the topic's properties by the broker (a partitioned topic's land in its partitioned metadata).
        admin.put(f"{self._topic_path(c.key)}/properties", body["properties"])

    def _apply_schema(self, admin: PulsarAdmin, c: Change, body: dict[str, Any]) -> None:
        ns, topic = c.key.split("/", 1)
        # In order: each post becomes the next version, under the namespace's compatibility strategy. A version the
        # target refuses as incompatible (409: its strategy is stricter than the source's was when the history was
        # written) fails in one line with the broker's reason: a CREATE's 409 otherwise passes for "exists".
        for n, schema in enumerate(body["versions"]):
            try:
                admin.post(f"{schema_path(self.spec.tenant, ns, topic)}/schema",
                           {"type": schema["type"], "schema": schema["data"], "properties": schema["properties"]})
            except Conflict as exc:
                raise AdminError(f"schema {n + 1} of {len(body['versions'])} of {c.key} refused by {admin.name}'s "
                                 f"compatibility check, so its later versions cannot follow ({exc}): relax the "
                                 "target namespace's schemaCompatibilityStrategy for the copy, or set it as the "
                                 "source's history allows", exc.status, exc.path) from None

    def _apply_subscription(self, admin: PulsarAdmin, c: Change, body: dict[str, Any]) -> None:
        topic_local, sub = r.split_child_key(c.key)
        if "partitions" not in body:  # a non-partitioned topic
            path = f"{self._topic_path(topic_local)}/subscription/{seg_twice(sub)}"
            if c.action == CREATE:
                self._create_subscription(admin, path, body["properties"])
            else:
                admin.put(f"{path}/properties", body["properties"])
            return
        # Partition by partition: on the partitions that hold it on the source only (the partitioned topic's own
        # call creates it on all, and sets properties only where every partition has it).
        create_on = set(body["partitions"]) if c.action == CREATE else set(body["create_on"])
        for i, properties in sorted(body["partitions"].items(), key=lambda item: int(item[0])):
            path = f"{self._topic_path(f'{topic_local}-partition-{i}')}/subscription/{seg_twice(sub)}"
            if i in create_on:
                try:
                    self._create_subscription(admin, path, properties)
                    continue
                except Conflict:  # there already: made by the target's grow (from partition 0's), or a retry
                    pass
            admin.put(f"{path}/properties", properties)

    @staticmethod
    def _create_subscription(admin: PulsarAdmin, path: str, properties: dict[str, str]) -> None:
        # Created at the earliest position: nothing can be skipped before progress sync sets the exact cursor.
        admin.put(path, {"ledgerId": -1, "entryId": -1, "properties": properties})


def _apply_groups(spec_dict: dict[str, Any], concurrency: int,
                  groups: Iterable[list[Change]]) -> Iterator[ChangeResult]:
    """Executor side: one applier per task; groups in parallel, changes in a group in order."""
    spec = MigrationSpec.from_dict(spec_dict)
    admins = {r.SOURCE: spec.source_cluster.admin(), r.TARGET: spec.target_cluster.admin()}
    applier = ChangeApplier(spec, admins)

    def run_group(group: list[Change]) -> list[ChangeResult]:
        results = []
        for c in group:
            started = time.monotonic()
            try:
                existed = applier.apply(c)  # kept in `error` of a row that is ok: the 409 a CREATE met
                results.append(ChangeResult(c.side, c.kind, c.key, c.action, True, existed, _ms(started)))
            except Exception as exc:  # reported per row; the step fails on any
                results.append(ChangeResult(c.side, c.kind, c.key, c.action, False, str(exc), _ms(started)))
        return results

    try:
        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
            for results in pool.map(run_group, list(groups)):
                yield from results
    finally:
        for admin in admins.values():
            admin.close()


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def apply_changes(spark: SparkSession, spec: MigrationSpec, changes: list[Change],
                  concurrency: int) -> list[ChangeResult]:
    """Runs the changes phase by phase; stops after a phase with failures (later phases need it)."""
    results: list[ChangeResult] = []
    sc = spark.sparkContext
    for phase in r.APPLY_PHASES:
        phase_changes = [c for c in changes if c.kind in phase and c.action in CHANGING_ACTIONS]
        if not phase_changes:
            continue
        groups: dict[tuple[str, ...], list[Change]] = {}
        for c in phase_changes:
            groups.setdefault(c.serial_group(), []).append(c)
        slices = max(1, min(len(groups), sc.defaultParallelism * 2))
        started = time.monotonic()
        phase_results = (
            sc.parallelize(list(groups.values()), slices)
            .mapPartitions(partial(_apply_groups, spec.to_dict(), concurrency))
            .collect()
        )
        failed = [res for res in phase_results if not res.ok]
        log.info("apply phase %s: %d changes, %d failed, %.1fs", "+".join(phase), len(phase_results),
                 len(failed), time.monotonic() - started)
        results.extend(phase_results)
        if failed:
            done = {(res.side, res.kind, res.key) for res in results}
            results.extend(
                ChangeResult(c.side, c.kind, c.key, c.action, False, "skipped: an earlier phase failed", 0)
                for c in changes if (c.side, c.kind, c.key) not in done and c.action in CHANGING_ACTIONS
            )
            break
    return results
