"""rollback_lookup after a completed switch: the live clients of test_switch_live run through the lookup service
while the tenant is migrated, switched to the target, publishes and consumes there, and is switched back. The
source must then hold every acknowledged send exactly once in send order per partition (what was published on
the target came back by the reverse copy), every subscription must have received everything, and a re-run of
the rollback changes nothing."""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter
from typing import Any

from localdev.pulsar_local import LocalCluster
from pulsar_migration.metadata.step import run as sync_metadata
from pulsar_migration.stepjob import run_step
from pulsar_migration.switch import rollback
from pulsar_migration.switch.step import STEP, run
from pyspark.sql import SparkSession

from tests.integration.lookup_helpers import TOKEN, LookupProcess
from tests.integration.replication_helpers import replicate
from tests.integration.tenant_builders import write_spec
from tests.integration.test_switch_live import Clients, live, stored  # noqa: F401 (live: the fixture)
from tests.integration.test_sync_progress import sync

log = logging.getLogger(__name__)


def test_rollback_after_the_flip_brings_every_client_back_with_nothing_lost(
        live: dict[str, Any], cluster_a: LocalCluster, cluster_b: LocalCluster,  # noqa: F811
        spark: SparkSession) -> None:
    service: LookupProcess = live["service"]
    tenant = live["tenant"]
    clients = Clients(service.url, tenant)
    clients.start()
    spec = write_spec(live["tmp"] / "spec.json", tenant, cluster_a, cluster_b,
                      lookup={"url": service.url, "token_env": "PM_TEST_LOOKUP_TOKEN"})
    run_dir = live["tmp"] / "run"
    args = ["--spec", str(spec), "--run-dir", str(run_dir)]
    os.environ["PM_TEST_LOOKUP_TOKEN"] = TOKEN
    try:
        time.sleep(2)
        assert run_step("sync_metadata", sync_metadata, args) == 0
        assert replicate(spec, run_dir) == 0
        assert sync(spec, run_dir) == 0
        assert run_step(STEP, run, args) == 0
        assert service.api("GET", f"/routes/{tenant}").json()["cluster"] == cluster_b.name
        on_target_from = {p.name: p.next for p in clients.producers}
        time.sleep(8)  # the clients publish and consume on the target
        back_from = time.monotonic()
        code = run_step(rollback.STEP, rollback.run, args)
        report = json.loads((run_dir / f"{rollback.STEP}.json").read_text())
        time.sleep(8)  # ... and on the source again
        redelivered = clients.duplicates(back_from, time.monotonic())
        again = run_step(rollback.STEP, rollback.run, args)
    finally:
        os.environ.pop("PM_TEST_LOOKUP_TOKEN", None)
        clients.finish()
    assert code == 0, report.get("error")
    assert report["counts"]["reverse_map_rows_seeded"] > 0 and report["details"]["hold_s"] > 0
    assert report["details"]["route_after"] == cluster_a.name
    route = service.api("GET", f"/routes/{tenant}").json()
    assert route["cluster"] == cluster_a.name and route["held"] is False
    assert again == 0
    rerun = json.loads((run_dir / f"{rollback.STEP}.json").read_text())
    assert rerun["details"]["already_rolled_back"] is True
    log.info("rollback: hold %ss, phases %s, redelivered after it %s", report["details"]["hold_s"],
             report["details"]["phases_s"], redelivered)

    for p in clients.producers:
        assert p.failed == [], p.failed[:5]
        # messages were published on the target between the switch and the rollback, and after it on the source
        assert on_target_from[p.name] < max(p.sent)
        partitions = 2 if p.topic.endswith("orders") else 0
        mine = [[int(x.split(":")[1]) for x in part if x.startswith(p.name + ":")]
                for part in stored(cluster_a, p.topic, partitions)]
        counts = Counter(n for part in mine for n in part)
        assert sorted(counts) == sorted(p.sent), f"{p.name}: the source's set differs from the acknowledged sends"
        assert max(counts.values()) == 1, f"{p.name}: stored twice: {[n for n, k in counts.items() if k > 1][:5]}"
        for part in mine:
            assert part == sorted(part), f"{p.name}: order broken in storage"
    sent = {p.topic: {f"{p.name}:{n}" for n in p.sent} for p in clients.producers}
    for c in clients.consumers:
        assert not sent[c.topic] - {payload for payload, _ in c.received}, c.subscription
