"""Builds the desired and actual resource DataFrames for one migration spec."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pulsar_migration.admin import PulsarAdmin, seg
from pulsar_migration.metadata import resources as r
from pulsar_migration.metadata.fields import held, project_fields
from pulsar_migration.metadata.inventory import (
    MetadataError,
    TenantLayout,
    TopicRef,
    fetch_topic_resources,
    layout_resources,
    read_layout,
    read_registration,
    registration_payload,
    tenant_row,
)
from pulsar_migration.metadata.plan import RESOURCE_SCHEMA
from pulsar_migration.spec import ClusterSpec, MigrationSpec


@dataclass
class Clusters:
    """Admin clients of both sides (driver)."""

    source: PulsarAdmin
    target: PulsarAdmin

    @classmethod
    def open(cls, spec: MigrationSpec) -> Clusters:
        return cls(spec.source_cluster.admin(), spec.target_cluster.admin())

    def close(self) -> None:
        self.source.close()
        self.target.close()


def _admin_for(spec_dict: dict[str, Any], cluster_name: str) -> PulsarAdmin:
    return MigrationSpec.from_dict(spec_dict).clusters[cluster_name].admin()


def _topic_rows(spark: SparkSession, spec: MigrationSpec, cluster_name: str, refs: list[TopicRef],
                side: str, concurrency: int) -> DataFrame:
    """Per-topic resources, read in executors (each task: one admin client, `concurrency` threads)."""
    if not refs:
        return spark.createDataFrame([], RESOURCE_SCHEMA)
    sc = spark.sparkContext
    slices = max(1, min(len(refs), sc.defaultParallelism * 2))
    fetch = partial(fetch_topic_resources, partial(_admin_for, spec.to_dict(), cluster_name), spec.tenant,
                    side=side, concurrency=concurrency)
    rdd = sc.parallelize(refs, slices).mapPartitions(fetch)
    rows = spark.createDataFrame(rdd, RESOURCE_SCHEMA).cache()
    errors = rows.filter(F.col("kind") == r.READ_ERROR)
    failed = errors.count()
    if failed:
        first = errors.orderBy("key").first()
        raise MetadataError(f"reading {failed} topic(s) on cluster {cluster_name} failed; first: {first.key}: "
                            f"{json.loads(first.payload)['error']}")
    return rows


def _frame(spark: SparkSession, rows: list[r.Resource]) -> DataFrame:
    return spark.createDataFrame([row.as_tuple() for row in rows], RESOURCE_SCHEMA)


def _registration(spec: MigrationSpec, peer: ClusterSpec) -> dict[str, Any]:
    """What the other side must hold about `peer` (auth only for geo mode's broker-to-broker links)."""
    return registration_payload(peer, with_auth=spec.replication_mode == "geo")


def desired_state(spark: SparkSession, spec: MigrationSpec, source: TenantLayout, concurrency: int) -> DataFrame:
    """What both clusters must hold when metadata sync is done, derived from the source tenant."""
    both = sorted({spec.source, spec.target})
    info = source.tenant_info or {}
    rows = [
        r.Resource.of(r.SOURCE, r.CLUSTER, spec.target, "", _registration(spec, spec.target_cluster)),
        r.Resource.of(r.TARGET, r.CLUSTER, spec.source, "", _registration(spec, spec.source_cluster)),
        # The source tenant must allow the target before any namespace can replicate there.
        r.Resource.of(r.SOURCE, r.TENANT, spec.tenant, "", {"allowedClusters": both}),
        tenant_row(r.TARGET, spec.tenant, {"adminRoles": info.get("adminRoles"), "allowedClusters": both}),
        *layout_resources(source, spec, r.TARGET, own_cluster=spec.source),
    ]
    return _frame(spark, rows).unionByName(
        _topic_rows(spark, spec, spec.source, source.topics, r.TARGET, concurrency)
    )


def actual_state(spark: SparkSession, spec: MigrationSpec, clusters: Clusters, desired_topics: set[str],
                 concurrency: int) -> DataFrame:
    """What the clusters hold now, for the resources metadata sync manages (target: the whole tenant)."""
    target = read_layout(clusters.target, spec, must_exist=False)
    source_tenant = clusters.source.get(f"/tenants/{seg(spec.tenant)}")
    rows: list[r.Resource] = []
    for side, admin, peer in ((r.SOURCE, clusters.source, spec.target_cluster),
                              (r.TARGET, clusters.target, spec.source_cluster)):
        registration = read_registration(admin, peer.name, _registration(spec, peer).keys())
        if registration is not None:
            rows.append(r.Resource.of(side, r.CLUSTER, peer.name, "", registration))
    for row in (tenant_row(r.SOURCE, spec.tenant, source_tenant),
                tenant_row(r.TARGET, spec.tenant, target.tenant_info)):
        if row is not None:
            rows.append(row)
    rows.extend(layout_resources(target, spec, r.TARGET, own_cluster=spec.target))
    # Target-only topics need no details: they are left alone whatever they hold.
    refs = [t for t in target.topics if t.local in desired_topics]
    return _frame(spark, rows).unionByName(
        _topic_rows(spark, spec, spec.target, refs, r.TARGET, concurrency)
    )


def project_actual(kind: str, desired_json: str, actual_json: str | None) -> str | None:
    """The part of an actual payload that corresponds to the desired one.

    After a complete sync, projection(actual) == desired for every covered row, whatever extra the
    target holds (grants, map keys, newer schema versions, properties only it has); hashing both sides
    proves it independently of the plan's decision rules.
    """
    if actual_json is None:
        return None
    desired, actual = json.loads(desired_json), json.loads(actual_json)
    if isinstance(desired, list):
        return r.canonical(sorted(set(desired) & set(actual)))
    if kind == r.CLUSTER:  # an existing registration is never overwritten: that it exists is what counts
        return desired_json
    if kind == r.TENANT:
        return r.canonical({k: sorted(set(v) & set(actual.get(k, []))) for k, v in desired.items()})
    if kind == r.NAMESPACE:
        return r.canonical({"policies": project_fields(desired["policies"], actual.get("policies", {})),
                            "numBundles": desired.get("numBundles")})  # bundles may split after create
    if kind in r.TOPIC_POLICY_KINDS:
        return r.canonical(project_fields(desired, actual))
    if kind == r.SUBSCRIPTION and "partitions" in desired:  # a partitioned topic's: per desired partition held
        on = actual.get("partitions") or {}
        return r.canonical({"partitions": {i: held(want, on[i]) for i, want in desired["partitions"].items()
                                           if i in on}})
    if kind in (r.SUBSCRIPTION, r.TOPIC_PROPERTIES):
        return r.canonical({"properties": held(desired["properties"], actual.get("properties", {}))})
    if kind == r.SCHEMA:  # the desired version numbers as the target holds them; others are left alone
        by_number = {v["version"]: v for v in actual["versions"]}
        return r.canonical({"versions": [by_number.get(v["version"]) for v in desired["versions"]]})
    return r.canonical(actual)

