"""Plan = desired state (from the source) joined with actual state; one row per resource.

Actions: CREATE (absent), UPDATE (present but short of the desired state), CONFLICT (cannot be
reconciled without shrinking, retyping or deleting something), NOOP (already there, or only on the
target, which is never touched). Topic rules follow PIP-370's table: fewer partitions on the target
-> grow; more partitions, or partitioned vs non-partitioned -> CONFLICT.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pulsar_migration.metadata import resources as r
from pulsar_migration.metadata.fields import differing, project_fields

CREATE, UPDATE, CONFLICT, NOOP = "CREATE", "UPDATE", "CONFLICT", "NOOP"
ACTIONS = (CREATE, UPDATE, CONFLICT, NOOP)
CHANGING_ACTIONS = (CREATE, UPDATE)

# Kinds whose payload is a set (roles, actions, clusters): the target may hold more; it must hold
# at least the desired members. Missing members are added, extra ones kept.
_SET_KINDS = frozenset({r.NAMESPACE_PERMISSION, r.SUBSCRIPTION_PERMISSION, r.TOPIC_PERMISSION,
                        r.NON_PERSISTENT_TOPIC_PERMISSION})

RESOURCE_SCHEMA = T.StructType([
    T.StructField("side", T.StringType(), False),
    T.StructField("kind", T.StringType(), False),
    T.StructField("key", T.StringType(), False),
    T.StructField("namespace", T.StringType(), False),
    T.StructField("payload", T.StringType(), False),
])
_DECISION_SCHEMA = T.StructType([
    T.StructField("action", T.StringType(), False),
    T.StructField("reason", T.StringType(), False),
    T.StructField("change", T.StringType(), True),
])


@dataclass(frozen=True)
class Decision:
    action: str
    reason: str
    change: str | None = None  # canonical JSON of what apply sends (CREATE/UPDATE only)


def decide(kind: str, desired_json: str | None, actual_json: str | None) -> Decision:
    """The action for one resource, given its desired and actual payloads (None: absent)."""
    if desired_json is None:
        return Decision(NOOP, "exists only on the target; left alone")
    desired = json.loads(desired_json)
    if actual_json is None:
        return Decision(CREATE, "absent", desired_json)
    actual = json.loads(actual_json)
    if kind in (r.TOPIC, r.NON_PERSISTENT_TOPIC):
        return _decide_topic(desired["partitions"], actual["partitions"])
    if kind == r.TENANT:
        return _decide_tenant(desired, actual)
    if kind in _SET_KINDS:
        missing = sorted(set(desired) - set(actual))
        if not missing:
            return Decision(NOOP, "present")
        return Decision(UPDATE, f"missing {', '.join(missing)}", r.canonical(sorted(set(desired) | set(actual))))
    if kind == r.CLUSTER:
        return _decide_registration(desired, actual)
    if kind in r.TOPIC_POLICY_KINDS:
        return _decide_fields(desired, actual)
    if kind == r.SUBSCRIPTION:
        return _decide_subscription(desired, actual)
    if kind == r.TOPIC_PROPERTIES:
        return _decide_topic_properties(desired["properties"], actual["properties"])
    if kind == r.NAMESPACE:
        decision = _decide_fields(desired["policies"], actual["policies"])
        if decision.action == UPDATE:
            return Decision(UPDATE, decision.reason, r.canonical({"policies": json.loads(decision.change or "{}")}))
        return decision
    if kind == r.SCHEMA:
        return _decide_schema(desired["versions"], actual["versions"])
    raise ValueError(f"no decision rule for resource kind {kind!r}")


def _decide_topic(want: int, have: int) -> Decision:
    if want == have:
        return Decision(NOOP, "equal" if want else "non-partitioned on both")
    if want == 0:
        return Decision(CONFLICT, f"non-partitioned on the source, {have} partitions on the target")
    if have == 0:
        return Decision(CONFLICT, f"{want} partitions on the source, non-partitioned on the target")
    if have < want:
        return Decision(UPDATE, f"grow partitions {have} -> {want}", r.canonical({"partitions": want}))
    return Decision(CONFLICT, f"target has more partitions ({have}) than the source ({want}); never shrunk")


def _decide_schema(want: list[dict[str, Any]], have: list[dict[str, Any]]) -> Decision:
    """Every source version must exist on the target under the same number with the same content.

    Messages carry their schema version, so numbers matter. Missing versions can only be added when
    they are exactly the next numbers the target will assign (each post becomes latest + 1).
    """
    by_number = {v["version"]: v for v in have}
    changed = [v["version"] for v in want if v["version"] in by_number and by_number[v["version"]] != v]
    if changed:
        return Decision(CONFLICT, f"schema version {changed[0]} differs ({len(want)} version(s) on the source, "
                                  f"{len(have)} on the target)")
    missing = [v for v in want if v["version"] not in by_number]
    if not missing:
        extra = len(have) - len(want)
        return Decision(NOOP, f"{len(want)} version(s) equal" + (f"; {extra} more only on the target" if extra else ""))
    next_number = max(by_number, default=-1) + 1
    numbers = [v["version"] for v in missing]
    if numbers != list(range(next_number, next_number + len(missing))):
        return Decision(CONFLICT, f"source schema versions {numbers[0]}..{numbers[-1]} cannot get the same numbers "
                                  f"on the target (its next version is {next_number})")
    return Decision(UPDATE, f"add versions {numbers[0]}..{numbers[-1]}", r.canonical({"versions": missing}))


def _decide_registration(desired: dict[str, Any], actual: dict[str, Any]) -> Decision:
    """A registration is created when absent, never overwritten: other tenants' replication may use it."""
    other = sorted(differing(desired, actual))
    if not other:
        return Decision(NOOP, "equal")
    return Decision(NOOP, f"registered with other settings ({', '.join(other)}); never overwritten")


def _decide_subscription(desired: dict[str, Any], actual: dict[str, Any]) -> Decision:
    """A non-partitioned topic's: its properties. A partitioned topic's: each partition holding it on the source
    must hold it on the target with those properties (a kill while the broker created it on every partition, or
    while this step set them partition by partition, leaves some without; the target's own on a few, too)."""
    if "partitions" not in desired:
        # The target's topic may be partitioned (a topic conflict, which blocks this row): its payload has no map.
        want, have = desired["properties"], actual.get("properties") or {}
        other = sorted(differing(want, have))
        if not other:
            return Decision(NOOP, "present")
        # The broker replaces the whole map: send the target's own keys too, so none is lost.
        return Decision(UPDATE, f"properties differ in {', '.join(other)}",
                        r.canonical({"properties": {**have, **want}}))
    wanted, held = desired["partitions"], actual.get("partitions") or {}
    missing = sorted((i for i in wanted if i not in held), key=int)
    other = sorted((i for i in wanted if i in held and differing(wanted[i], held[i])), key=int)
    if not missing and not other:
        return Decision(NOOP, "present")
    reasons = ([f"missing on partition(s) {', '.join(missing)}"] if missing else []) + (
        [f"properties differ on partition(s) {', '.join(other)}"] if other else [])
    # Per partition, the whole map as it must be (the broker replaces it): the target's own keys kept.
    return Decision(UPDATE, "; ".join(reasons), r.canonical({
        "partitions": {i: {**held.get(i, {}), **wanted[i]} for i in missing + other}, "create_on": missing}))


def _decide_topic_properties(want: dict[str, str], have: dict[str, str]) -> Decision:
    other = differing(want, have)
    if not other:
        return Decision(NOOP, "present")
    # The broker merges key by key: only what differs is sent; keys only on the target stay.
    return Decision(UPDATE, f"properties differ in {', '.join(sorted(other))}", r.canonical({"properties": other}))


def _decide_tenant(desired: dict[str, Any], actual: dict[str, Any]) -> Decision:
    missing = {
        field: sorted(set(desired.get(field, [])) - set(actual.get(field, [])))
        for field in ("adminRoles", "allowedClusters")
    }
    missing = {k: v for k, v in missing.items() if v}
    if not missing:
        return Decision(NOOP, "present")
    union = {field: sorted(set(desired.get(field, [])) | set(actual.get(field, []))) for field in
             ("adminRoles", "allowedClusters")}
    reason = "; ".join(f"missing {field} {', '.join(vals)}" for field, vals in missing.items())
    return Decision(UPDATE, reason, r.canonical(union))


def _decide_fields(desired: dict[str, Any], actual: dict[str, Any]) -> Decision:
    """Each desired setting must hold on the target; merged maps (properties, quotas, per-cluster rates)
    only need the desired keys, and the change carries only what differs."""
    projected = project_fields(desired, actual)
    changed: dict[str, Any] = {}
    for name, value in desired.items():
        if projected.get(name) == value:
            continue
        if name in r.MERGED_MAP_FIELDS and isinstance(value, dict):
            value = differing(value, projected.get(name) or {})
        changed[name] = value
    if not changed:
        return Decision(NOOP, "equal")
    return Decision(UPDATE, f"differs in {', '.join(sorted(changed))}", r.canonical(changed))


def _decide_row(kind: str, desired: str | None, actual: str | None) -> tuple[str, str, str | None]:
    d = decide(kind, desired, actual)
    return (d.action, d.reason, d.change)


# useArrow explicit: otherwise Spark tries to infer a pandas UDF from the (postponed) type hints.
_decide_udf = F.udf(_decide_row, _DECISION_SCHEMA, useArrow=False)


def plan_metadata(desired: DataFrame, actual: DataFrame) -> DataFrame:
    """Joins desired and actual resources into plan rows, then blocks children of conflicting topics.

    Columns: side, kind, key, namespace, action, reason, desired, actual, change.
    """
    keys = ["side", "kind", "key"]
    joined = desired.alias("d").join(actual.alias("a"), on=keys, how="full_outer").select(
        *keys,
        F.coalesce(F.col("d.namespace"), F.col("a.namespace")).alias("namespace"),
        F.col("d.payload").alias("desired"),
        F.col("a.payload").alias("actual"),
    )
    decided = joined.withColumn("decision", _decide_udf("kind", "desired", "actual")).select(
        *keys, "namespace", "decision.action", "decision.reason", "desired", "actual", "decision.change"
    )
    conflicting_topics = decided.filter((F.col("kind") == r.TOPIC) & (F.col("action") == CONFLICT)).select(
        F.col("key").alias("conflict_topic"), F.col("reason").alias("conflict_reason")
    )
    topic_of_row = F.when(F.col("kind").isin(*sorted(r.TOPIC_KEYED_KINDS)), F.col("key")).otherwise(
        F.regexp_replace(F.regexp_replace(F.split(F.col("key"), r"\|").getItem(0), "%7C", "|"), "%25", "%")
    )  # as resources.child_parent
    with_topic = decided.withColumn("topic_of_row", topic_of_row)
    blocked = (F.col("kind").isin(*sorted(r.TOPIC_CHILD_KINDS))) & F.col("conflict_topic").isNotNull() & (
        F.col("action").isin(*CHANGING_ACTIONS)
    )
    return (
        with_topic.join(F.broadcast(conflicting_topics), with_topic.topic_of_row == conflicting_topics.conflict_topic,
                        "left")
        .withColumn("reason", F.when(blocked, F.concat(F.lit("topic in conflict: "), F.col("conflict_reason")))
                    .otherwise(F.col("reason")))
        .withColumn("change", F.when(blocked, F.lit(None)).otherwise(F.col("change")))
        .withColumn("action", F.when(blocked, F.lit(CONFLICT)).otherwise(F.col("action")))
        .drop("topic_of_row", "conflict_topic", "conflict_reason")
    )


def plan_counts(plan: DataFrame) -> dict[str, int]:
    """`{"<kind>.<action>": n, "<action>": n}` for the report."""
    counts: dict[str, int] = dict.fromkeys(ACTIONS, 0)
    for row in plan.groupBy("kind", "action").count().collect():
        counts[f"{row['kind']}.{row['action']}"] = row["count"]
        counts[row["action"]] += row["count"]
    return counts
