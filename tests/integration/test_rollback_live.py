"""The live cutover in copy mode and both ways back to the source, on one tenant whose live clients (those of
test_switch_live: four subscription types, a batching and a plain producer, a producer of the distribution's Java
client) run through the lookup service all along, one migration (sync_metadata, replicate_topics, sync_progress)
serving all of it:

1. a switch_lookup that fails before the flip (a client bypasses the lookup service) rolls back by itself: the
   route stays on the source, released, and the clients carry on there;
2. once the bypass is gone the switch succeeds while the Java producer publishes across it, judged as
   test_switch_live judges its geo-mode cutover (the clients settled for it, then going on);
3. the clients publish and consume on the target, and rollback_lookup switches them back; a re-run of the
   rollback changes nothing. The source must then hold every acknowledged send so far exactly once in send order
   per partition (what was published on the target came back by the reverse copy) and every subscription must
   have received everything;
4. the tenant is migrated again while the clients go on at the source: a run in a new run dir that does not
   continue the rolled-back one fails in one line naming the way out; one that does (options.follows_run_dir)
   copies only what the source got since the rollback, and a switch moves the clients to the target again. The
   target must then hold every acknowledged send of the whole test exactly once in send order (nothing published
   on the target between the flips copied back to it a second time), the Java producer's cycle once, and every
   subscription must have received everything;
5. they are switched back once more by the continuing run's rollback: the source must then hold every
   acknowledged send of the whole test exactly once in send order, the Java producer's cycle once."""

from __future__ import annotations

import json
import logging
from typing import Any

import pulsar
import pytest
from localdev.pulsar_local import LocalCluster
from pulsar_migration.stepjob import run_step
from pulsar_migration.switch import rollback
from pulsar_migration.switch.step import STEP, run
from pyspark.sql import SparkSession

from tests.integration.lookup_helpers import LookupProcess
from tests.integration.test_switch_live import (  # noqa: F401 (live: the fixture)
    Clients,
    carried_on,
    judge_back_again,
    judge_back_on_source,
    judge_migrated_again,
    judge_the_cutover,
    live,
    live_spec,
    migrate,
    migrate_again,
    roll_back_again,
    roll_back_live,
    switch_with_java_publishing,
    unload_floor,
)

log = logging.getLogger(__name__)


def test_copy_cutover_after_a_failed_switch_then_rollback_loses_nothing_either_way(
        live: dict[str, Any], cluster_a: LocalCluster, cluster_b: LocalCluster,  # noqa: F811
        spark: SparkSession, monkeypatch: pytest.MonkeyPatch) -> None:
    service: LookupProcess = live["service"]
    tenant = live["tenant"]
    clients = Clients(service.url, tenant)
    clients.start()
    # The injected fault of the first switch: one consumer talks to the source broker directly, not through the
    # lookup service, so the fence never sees the source quiet.
    bypass = pulsar.Client(cluster_a.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    bypass_open = True
    bypass.subscribe(f"persistent://{tenant}/ns/events", "rogue", consumer_type=pulsar.ConsumerType.Shared)
    spec, run_dir = live_spec(live, cluster_a, cluster_b, "copy", monkeypatch), live["tmp"] / "run"
    args = ["--spec", str(spec), "--run-dir", str(run_dir)]
    try:
        floor = unload_floor(clients, live["admin_a"], tenant)
        migrate(spec, run_dir)

        # 1. The switch must give up, release the hold with the route unchanged ...
        failed = run_step(STEP, run, args)
        failed_report = json.loads((run_dir / f"{STEP}.json").read_text())
        assert failed == 1 and failed_report["details"]["rolled_back"] is True, failed_report.get("error")
        assert "rogue" in failed_report["error"]  # found by the fence's wait or by the quiet check after the delta
        route = service.api("GET", f"/routes/{tenant}").json()
        assert route["cluster"] == cluster_a.name and route["held"] is False
        # ... and the clients go on at the source: every producer has sends after the failed switch acknowledged
        # and every subscription receives them, while the route names the source unheld. (That nothing was lost
        # or stored twice there is judged on the target after the switch and on the source at the end.)
        carried_on(clients, "at the source after the failed switch")
        assert service.api("GET", f"/routes/{tenant}").json()["cluster"] == cluster_a.name
        bypass.close()
        bypass_open = False

        # 2. The switch, judged with the clients settled (producers paused, every send answered and received).
        cutover = switch_with_java_publishing(live, spec, run_dir, clients)
        clients.settle()
        judge_the_cutover(live, cluster_a, cluster_b, "copy", clients, floor, cutover)
        clients.resume()

        # 3. The clients publish and consume on the target, then the rollback, then on the source again.
        back = roll_back_live(clients, args, run_dir)
        again = run_step(rollback.STEP, rollback.run, args)
        assert back.code == 0, back.report.get("error")
        report = back.report
        assert report["counts"]["reverse_map_rows_seeded"] > 0 and report["details"]["hold_s"] > 0
        assert report["details"]["route_after"] == cluster_a.name
        route = service.api("GET", f"/routes/{tenant}").json()
        assert route["cluster"] == cluster_a.name and route["held"] is False
        assert again == 0
        rerun = json.loads((run_dir / f"{rollback.STEP}.json").read_text())
        assert rerun["details"]["already_rolled_back"] is True
        log.info("rollback: hold %ss, phases %s, redelivered after it %s", report["details"]["hold_s"],
                 report["details"]["phases_s"], back.redelivered)
        clients.settle()
        judge_back_on_source(clients, cluster_a, back.on_target_from)
        clients.resume()

        # 4. Migrating again, the clients going on at the source.
        again_from, again_args = migrate_again(live, spec, run_dir, clients, fresh_fails=True)
        carried_on(clients, "on the target after the second switch")
        judge_migrated_again(live, cluster_b, clients, back, again_from)

        # 5. ... and back once more: the continuing run's map (the first run's and its rollback's) serves its
        # rollback as the first run's did.
        back_again = roll_back_again(live, cluster_a, clients, again_args)
    finally:
        if bypass_open:
            bypass.close()
        clients.finish()
    judge_back_again(live, cluster_a, clients, back_again)

