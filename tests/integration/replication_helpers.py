"""What the replicate_topics tests (copy and geo) share: running the step, its report, and reading a partition
with the plain Python client, independently of the library's own reading and hashing."""

from __future__ import annotations

import datetime
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pulsar
from localdev.pulsar_local import LocalCluster
from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.replication.step import STEP, run
from pulsar_migration.stepjob import run_step

COPY_PROPERTIES = ("__pm_source", "__pm_source_publish_time")
GEO_PROPERTY = "__MSG_PROP_REPL_SOURCE_POSITION"


class CountingAdmin(PulsarAdmin):
    """The library's admin client, counting its GET calls by the path's last segment ("stats", "lastMessageId")."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gets: Counter[str] = Counter()

    def get(self, path: str, **kwargs: Any) -> Any:
        self.gets[path.rsplit("/", 1)[-1]] += 1
        return super().get(path, **kwargs)


def client(cluster: LocalCluster) -> pulsar.Client:
    """A client of `cluster` (as its superuser where it requires tokens)."""
    token = cluster.superuser_token()
    return pulsar.Client(cluster.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn),
                         authentication=pulsar.AuthenticationToken(token) if token else None)


def partition_names(topic: str, partitions: int) -> list[str]:
    """The topic's partitions by name (the topic itself when it is not partitioned: `partitions` 0)."""
    return [f"{topic}-partition-{i}" for i in range(partitions)] if partitions else [topic]


def replicate(spec: Path, run_dir: Path, *extra: str) -> int:
    return run_step(STEP, run, ["--spec", str(spec), "--run-dir", str(run_dir), *extra])


def replicate_report(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / f"{STEP}.json").read_text())


def drain(cluster: LocalCluster, topic: str) -> list[dict[str, Any]]:
    """Every message of one partition in order, as a plain reader sees it. `props` leaves out what replication
    adds; `source` and `origin` hold the copy's and native geo-replication's source positions."""
    c = client(cluster)
    try:
        reader = c.create_reader(topic, pulsar.MessageId.earliest)
        out = []
        while reader.has_message_available():
            m = reader.read_next(10_000)
            mid = m.message_id()
            props = m.properties()
            out.append({
                "entry": (mid.ledger_id(), mid.entry_id()), "batch_index": mid.batch_index(),
                "data": m.data(), "key": m.partition_key(), "ordering_key": m.ordering_key(),
                "props": {k: v for k, v in props.items() if k not in (*COPY_PROPERTIES, GEO_PROPERTY)},
                "event_time": m.event_timestamp(), "schema_version": m._message.int_schema_version(),
                "source": props.get("__pm_source"), "origin": props.get(GEO_PROPERTY),
            })
        return out
    finally:
        c.close()


def source_tenant(admin: PulsarAdmin, cluster: LocalCluster, tenant: str, namespace: str = "ns") -> str:
    """Creates `tenant` with one namespace on the source cluster only; returns the tenant."""
    admin.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": [cluster.name]})
    admin.put(f"/namespaces/{tenant}/{namespace}")
    return tenant


def create_topics(admin: PulsarAdmin, *topics: str) -> None:
    """Creates each `persistent://...` topic, non-partitioned, on `admin`'s cluster."""
    for topic in topics:
        admin.put(admin.topic_path(topic))


def create_layout(admin: PulsarAdmin, tenant: str, topics: dict[str, int]) -> None:
    """Creates each `namespace/topic` of `tenant` with its partition count (0: non-partitioned)."""
    for name, partitions in topics.items():
        if partitions:
            admin.put(f"/persistent/{tenant}/{name}/partitions", partitions)
        else:
            admin.put(f"/persistent/{tenant}/{name}")


def delivery_time_ms(admin: PulsarAdmin, topic: str, message: dict[str, Any]) -> int:
    """The delivery time stored with a drained message (its entry's X-Pulsar-deliver-at-time header)."""
    headers = admin.entry_headers(topic, *message["entry"])
    at = datetime.datetime.fromisoformat(headers["X-Pulsar-deliver-at-time"].replace("Z", "+00:00"))
    return int(at.timestamp() * 1000)
