"""rollback_lookup: switches a tenant's live clients back to the source after switch_lookup flipped them.

    spark-submit spark_jobs/rollback_lookup.py --spec SPEC --run-dir RUN_DIR [--dry-run]

RUN_DIR is the migration's own run dir: the rollback needs its position map. It is the switch run in reverse,
in `RUN_DIR/rollback/` (reports `rollback_lookup.*.json` there, its own map):

1. **preconditions**: switch_lookup reported ok here, the lookup service routes the tenant to the target (to
   the source already: rolled back, only the probe runs).
2. **reverse map**: the migration's map with both sides swapped, written once. The reverse copy then starts,
   per partition, right after the last target entry the migration copied there, i.e. it takes only what
   clients published on the target since the flip; the reverse progress sync translates every target
   position, old or new, back to a source one. In geo mode the reverse "copy" is Pulsar's own replication from
   the target back to the source (the target's namespaces replicate to the source from then on; a replicator
   skips what was replicated into its cluster, so only what clients published on the target goes back, and the
   source's replication to the target carries what they publish after the rollback: active-active).
3. **the cutover in reverse** (switch.step.cutover with source and target swapped): catch-up copies and
   progress, hold, fence the target, final delta (keeping client producer names and sequence ids, which the
   source's deduplication knows from before the switch), final progress sync, quiet check, flip the route
   back to the source, release; a failure before that flip leaves the clients on the target, as before.
4. **probe** that a producer and a reader through the lookup service land on the source.

The target keeps its copy (nothing is deleted): a later migration run continues this one (options.follows_run_dir,
replication.follows), its map seeded from this run's map and the reverse one.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path

from pulsar_migration import rundir
from pulsar_migration.lookup.client import LookupServiceError
from pulsar_migration.replication import posmap
from pulsar_migration.replication.follows import CLEANUP_STARTED, ROLLBACK_DIR, ROLLED_BACK, note_rolled_back
from pulsar_migration.report import StepReport
from pulsar_migration.spec import MigrationSpec
from pulsar_migration.stepjob import BadInput, StepContext
from pulsar_migration.switch.probe import probe
from pulsar_migration.switch.step import STEP as SWITCH_STEP
from pulsar_migration.switch.step import (
    Phases,
    SwitchError,
    cutover,
    namespaces,
    release_a_left_hold,
    selected_partitions,
)

log = logging.getLogger(__name__)

STEP = "rollback_lookup"


def reverse_spec(spec: MigrationSpec) -> MigrationSpec:
    """The same tenant, selection and replication mode from the target back to the source (its map is seeded
    from the migration's, never from an earlier run's)."""
    options = {k: v for k, v in spec.options.items() if k != "follows_run_dir"}
    return dataclasses.replace(spec, source=spec.target, target=spec.source, options=options, rolling_back=True)


def seed_reverse_map(run_dir: str, reverse_dir: str) -> int:
    """Writes the migration's map with sides swapped into the reverse run dir, once; returns the rows written
    (0 when it is there already). One file, renamed into place: a kill leaves all of it or none."""
    if posmap.read_local(reverse_dir) is not None:
        return 0
    forward = posmap.read_local(run_dir)
    if forward is None or forward.empty:
        raise BadInput(f"no position map in {run_dir}: there is nothing switch_lookup moved to roll back")
    return posmap.append_frame_local(reverse_dir, posmap.swap_sides(forward))


def run(ctx: StepContext) -> None:
    spec, report = ctx.spec, ctx.report
    if not spec.lookup_url:
        raise BadInput("the spec names no lookup service (lookup.url): there is no route to switch back")
    if not rundir.is_local(ctx.run_dir):
        raise BadInput(f"rollback_lookup needs a local run dir (its final steps run in the driver): {ctx.run_dir}")
    try:
        switched = StepReport.read(ctx.run_dir, SWITCH_STEP)
    except (FileNotFoundError, OSError):
        raise BadInput(f"no {SWITCH_STEP} report in {ctx.run_dir}: this run never switched") from None
    if switched.verdict != "ok" or switched.dry_run:
        raise BadInput(f"{SWITCH_STEP} in {ctx.run_dir} is {switched.verdict}"
                       f"{' (dry run)' if switched.dry_run else ''}: there is no flip to roll back")
    if rundir.exists(ctx.run_dir, CLEANUP_STARTED):
        raise BadInput(f"cleanup_source started deleting the source's copy of this run ({CLEANUP_STARTED} in "
                       f"{ctx.run_dir}): there is nothing to roll back to")
    reverse = reverse_spec(spec)
    reverse_dir = rundir.join(ctx.run_dir, ROLLBACK_DIR)
    Path(rundir.local_path(reverse_dir)).mkdir(parents=True, exist_ok=True)
    rctx = dataclasses.replace(ctx, spec=reverse, run_dir=reverse_dir,
                               args=argparse.Namespace(**{**vars(ctx.args), "markdelete_only": False}))
    lookup = spec.lookup_admin()
    tgt_admin, src_admin = reverse.source_cluster.admin(), reverse.target_cluster.admin()
    try:
        phases = Phases(report)
        with phases("preconditions"):
            answer = lookup.route(spec.tenant)
            route = str(answer["cluster"])
            report.details["route_before"] = route
            if route not in (spec.source, spec.target):
                raise SwitchError(f"the lookup service routes tenant {spec.tenant} to {route}, neither the source "
                                  f"{spec.source} nor the target {spec.target}")
            release_a_left_hold(rctx, lookup, answer)
        partitions = selected_partitions(rctx, tgt_admin)
        report.counts["partitions"] = len(partitions)
        if route == spec.source:
            report.details["already_rolled_back"] = True
            if not ctx.dry_run and not rundir.exists(ctx.run_dir, ROLLED_BACK):
                note_rolled_back(ctx.run_dir)  # an attempt killed after its flip, before its note
            with phases("probe"):
                report.details["probe"] = probe(rctx, partitions)
            return
        if ctx.dry_run:
            report.details["plan"] = [f"seed {ROLLBACK_DIR}/position_map from the migration's map (sides swapped)",
                                      f"catch-up {'replication' if spec.replication_mode == 'geo' else 'copy'} "
                                      "and progress from the target", "hold",
                                      "fence (unload " + ", ".join(namespaces(rctx, tgt_admin)) + f" on {spec.target})",
                                      "final delta and progress", "quiet check",
                                      f"flip {spec.tenant} back to {spec.source}", "probe"]
            return
        with phases("reverse_map"):
            report.counts["reverse_map_rows_seeded"] = seed_reverse_map(ctx.run_dir, reverse_dir)
        # The reverse cutover's own catch-up copy runs first; its progress syncs follow inside cutover.
        cutover(rctx, lookup, tgt_admin, src_admin, partitions, phases)
        note_rolled_back(ctx.run_dir)
        report.details["route_after"] = spec.source
        with phases("probe"):
            report.details["probe"] = probe(rctx, partitions)
    except LookupServiceError as exc:
        raise SwitchError(str(exc)) from None
    finally:
        lookup.close()
        tgt_admin.close()
        src_admin.close()
