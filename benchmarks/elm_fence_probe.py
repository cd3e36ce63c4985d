"""Probe: does the switch's fence hold on a source cluster running Pulsar's extensible load manager?

    .venv/bin/python -m benchmarks.elm_fence_probe [--load-manager extensible|modular]

With the extensible load manager (PIP-192) a broker may name the new owner of a bundle in its CloseProducer /
CloseConsumer commands (PIP-307), and the client then connects there directly, bypassing an HTTP lookup service
(FACTS.md). The fence relies on every reconnect starting with a lookup, parked while the tenant is held. This
starts cluster-g as two brokers (localdev.pulsar_two_brokers) with the chosen load manager, a tenant with a
4-partition topic, the lookup service routing it there, and one producer publishing every 20 ms through the
service. It then holds the tenant, unloads its namespace as the fence does, and counts the sends acknowledged
more than 1 s after the unload while the tenant is still held (0: every reconnect waited on the hold) and the
producers the brokers show. Prints one line per figure; stops the cluster afterwards.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import threading
import time
from pathlib import Path

import pulsar
from localdev import pulsar_local, pulsar_two_brokers
from localdev.pulsar_local import LocalCluster

from tests.integration.lookup_helpers import start_service

log = logging.getLogger(__name__)

EXTENSIBLE = {
    "loadManagerClassName": "org.apache.pulsar.broker.loadbalance.extensions.ExtensibleLoadManagerImpl",
    "loadBalancerLoadSheddingStrategy": "org.apache.pulsar.broker.loadbalance.extensions.scheduler.TransferShedder",
    "loadBalancerEnabled": "true", "loadBalancerSheddingEnabled": "false", "topicLevelPoliciesEnabled": "true"}
SETTLE_S = 25.0  # the second broker registers with the load manager some seconds after it answers health checks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.elm_fence_probe", description=__doc__.split("\n")[0])
    parser.add_argument("--load-manager", choices=("extensible", "modular"), default="extensible")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if args.load_manager == "extensible":
        pulsar_local.CONFIG_OVERRIDES.update(EXTENSIBLE)  # both brokers' configurations are rendered from these
    cluster = LocalCluster(6)
    pulsar_two_brokers.start(cluster, auth=False)
    try:
        time.sleep(SETTLE_S)
        return probe(cluster, args.load_manager)
    finally:
        pulsar_two_brokers.stop(cluster)


def probe(cluster: LocalCluster, load_manager: str) -> int:
    admin = cluster.admin(timeout_s=30)
    log.info("load manager: %s", admin.get("/brokers/configuration/runtime").get("loadManagerClassName"))
    tenant, topic = "probe", "persistent://probe/ns/t"
    admin.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": [cluster.name]})
    admin.put(f"/namespaces/{tenant}/ns")
    admin.put(f"/persistent/{tenant}/ns/t/partitions", 4)
    partitions = [f"{topic}-partition-{i}" for i in range(4)]
    service = start_service(Path(tempfile.mkdtemp(prefix="elm-probe-")), [cluster], cluster)
    acked: list[float] = []
    stop = threading.Event()
    try:
        service.api("PUT", f"/routes/{tenant}", json={"cluster": cluster.name, "reason": "probe"})
        client = pulsar.Client(service.url, operation_timeout_seconds=30)
        producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=60_000)

        def publish() -> None:
            n = 0
            while not stop.is_set():
                producer.send_async(f"m{n}".encode(), lambda result, _id: acked.append(time.monotonic())
                                    if result == pulsar.Result.Ok else None, partition_key=str(n))
                n += 1
                time.sleep(0.02)

        sender = threading.Thread(target=publish)
        sender.start()
        time.sleep(3)
        log.info("owners before: %s", sorted(pulsar_two_brokers.owners(cluster, partitions)))
        service.api("POST", f"/routes/{tenant}/hold", json={"reason": "probe"})
        time.sleep(0.5)
        unloaded_at = time.monotonic()
        admin.put(f"/namespaces/{tenant}/ns/unload", expect_json=False)
        time.sleep(6)
        while_held = sum(1 for t in acked if t > unloaded_at + 1.0)
        log.info("RESULT load manager %s: %d send(s) acknowledged while held (more than 1 s after the unload)",
                 load_manager, while_held)
        publishers = sum(len(admin.get(f"/persistent/{p.split('://')[1]}/stats")["publishers"]) for p in partitions)
        log.info("RESULT load manager %s: %d producer(s) connected while held", load_manager, publishers)
        service.api("POST", f"/routes/{tenant}/release", json={"reason": "probe"})
        time.sleep(3)
        log.info("after the release: %d send(s) acknowledged in all", len(acked))
        stop.set()
        sender.join()
        client.close()
        return 0 if while_held == 0 and publishers == 0 else 1
    finally:
        stop.set()
        service.stop()
        admin.close()


if __name__ == "__main__":
    raise SystemExit(main())
