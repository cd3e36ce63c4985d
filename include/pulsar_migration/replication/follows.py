"""A migration run that continues an earlier one of the same tenant (spec option `follows_run_dir`).

After a rollback the target keeps everything: the source's messages copied before the first flip, and what
clients published on the target between the flips (they went back to the source by the reverse copy or Pulsar's
replication). A new run cannot work that out from the clusters alone: the target's own messages carry no source
position (in copy mode the resume point then fails with "holds messages that were not copied"; in geo mode the
verification pairs the two sides' entries in the wrong order). The earlier run's maps say it exactly: its
position map (source -> target) and its rollback's (target -> source, the messages published on the target
included) with sides swapped. Their union seeds this run's map once, in one file renamed into place (a kill
leaves all of it or none); from its end on, the run copies (or pairs) what the source got since the rollback,
and sync_progress translates every position through it.

The earlier run must not have left the clients on the target: a run that switched and was not rolled back is
refused, as are run dirs of another tenant or cluster pair, and a run another one continues already (its
`continued_by.json`): the later run's messages would be missing from the map.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from pulsar_migration import rundir
from pulsar_migration.replication import posmap
from pulsar_migration.report import StepReport, utc_now
from pulsar_migration.spec import MigrationSpec
from pulsar_migration.stepjob import BadInput

log = logging.getLogger(__name__)

REPLICATE_STEP = "replicate_topics"
# Named here, not imported: the switch imports replication (its catch-up and final delta are replicate runs).
SWITCH_STEP = "switch_lookup"
ROLLBACK_STEP = "rollback_lookup"
ROLLBACK_DIR = "rollback"  # the rollback's own run dir inside the migration's (switch.rollback takes it from here)
SEEDED_MARKER = "_seeded_from_earlier_run.json"  # in the map's dir: readers skip "_" names
CONTINUED_NOTE = "continued_by.json"  # in the earlier run dir: which run continues it
# Written by cleanup_source before it deletes anything on the source: a rollback of that run is refused from then on.
CLEANUP_STARTED = "cleanup_source_deleting.json"
# Written by rollback_lookup once the route is back on the source (never by a dry run): the rollback report alone
# can be replaced by a later dry run or a failed re-run of the rollback, which do not say it flipped.
ROLLED_BACK = "rollback_flipped.json"


def earlier_rows(spec: MigrationSpec, earlier: str) -> Any:
    """The earlier run's map rows for this run (read_local's frame: its map, its rollback's swapped); BadInput
    (one line) when that run dir is not one this run may continue."""
    where = f"options.follows_run_dir {earlier}"
    try:
        replicated = StepReport.read(earlier, REPLICATE_STEP)
    except (FileNotFoundError, OSError):
        raise BadInput(f"{where} has no {REPLICATE_STEP} report: not the run dir of a migration") from None
    ours = (spec.tenant, spec.source, spec.target)
    theirs = (replicated.tenant, replicated.source, replicated.target)
    if theirs != ours:
        raise BadInput(f"{where} migrated tenant {theirs[0]} from {theirs[1]} to {theirs[2]}, not tenant "
                       f"{ours[0]} from {ours[1]} to {ours[2]}")
    if spec.replication_mode != replicated.details.get("mode", spec.replication_mode):
        raise BadInput(f"{where} replicated in {replicated.details['mode']} mode, this run in "
                       f"{spec.replication_mode} mode: continue it in the same mode")
    forward = posmap.read_local(earlier)
    if forward is None or forward.empty:
        raise BadInput(f"{where} holds no position map: there is nothing to continue (start afresh)")
    frames = [forward]
    switched = _report(earlier, SWITCH_STEP)
    if switched is not None and _flipped(switched, spec.target, "already_switched"):
        back_at = rollback_flipped_at(earlier, spec.source)
        if back_at is None:
            back = _report(earlier, ROLLBACK_STEP)
            raise BadInput(f"{where} switched the tenant's clients to {spec.target} and was not rolled back "
                           f"({ROLLBACK_STEP} {back.verdict if back else 'never ran'}): there is nothing to migrate "
                           "again; roll it back first")
        if back_at < (switched.finished_at or ""):
            raise BadInput(f"{where} switched the tenant's clients to {spec.target} again after its rollback: "
                           "there is nothing to migrate again; roll it back first")
        reverse = posmap.read_local(rundir.join(earlier, ROLLBACK_DIR))
        if reverse is None or reverse.empty:
            raise BadInput(f"{where} found the route back on {spec.source} without switching it back itself (no "
                           "reverse map): what clients published on the target then is mapped nowhere; delete the "
                           "tenant on the target and migrate it afresh")
        frames.append(posmap.swap_sides(reverse))
    import pandas as pd  # deferred: every importer of the replication step would pay for it

    return pd.concat(frames, ignore_index=True).drop_duplicates(list(posmap.KEY_COLUMNS))


def _flipped(report: StepReport, to: str, already: str) -> bool:
    """Whether a switch (or rollback) report says the route names `to` now: flipped by that run (verdict ok, or
    failed after the flip, in its probe) or found flipped by an earlier attempt that it re-ran."""
    if report.dry_run:
        return False
    return report.details.get("route_after") == to or bool(report.details.get(already))


def rollback_flipped_at(run_dir: str, source: str) -> str | None:
    """When the rollback of the migration run in `run_dir` last found the route back on `source` (its report, or
    its ROLLED_BACK note, which later dry runs and failed re-runs leave in place); None: never."""
    back = _report(run_dir, ROLLBACK_STEP)
    times = [back.finished_at or ""] if back is not None and _flipped(back, source, "already_rolled_back") else []
    try:
        times.append(str(json.loads(rundir.read_text(run_dir, ROLLED_BACK))["at"]))
    except (OSError, ValueError, KeyError):
        pass
    return max(times) if times else None


def note_rolled_back(run_dir: str) -> None:
    """Records that the route is back on the source now (rollback_lookup, after its flip or finding it done)."""
    rundir.write_text(run_dir, ROLLED_BACK, json.dumps({"at": utc_now()}) + "\n")


def rolled_back(run_dir: str, source: str) -> str | None:
    """When the migration run in `run_dir` was rolled back to `source` after its last switch (None: not rolled back,
    or switched again since)."""
    back_at = rollback_flipped_at(run_dir, source)
    if back_at is None:
        return None
    switched = _report(run_dir, SWITCH_STEP)
    return back_at if switched is None or back_at >= (switched.finished_at or "") else None


def continued_by(run_dir: str) -> str | None:
    """The run dir of the run that continues the one in `run_dir` (its CONTINUED_NOTE), if any."""
    if not rundir.is_local(run_dir):  # a continued run is local (seed refuses others)
        return None
    try:
        return json.loads(rundir.read_text(run_dir, CONTINUED_NOTE)).get("run_dir")
    except (OSError, ValueError):
        return None


def _report(run_dir: str, step: str) -> StepReport | None:
    try:
        return StepReport.read(run_dir, step)
    except (FileNotFoundError, OSError):
        return None


def seed(spec: MigrationSpec, run_dir: str, details: dict[str, Any], *, dry_run: bool) -> Any | None:
    """Seeds this run's map from the earlier run's when it has none yet. Returns the rows for a dry run (which
    writes nothing: its plan reads them instead of the map), else None. Records what it did in `details`."""
    earlier = spec.follows_run_dir
    if not earlier:
        return None
    details["follows_run_dir"] = earlier
    if not rundir.is_local(earlier):
        raise BadInput(f"options.follows_run_dir {earlier}: only a local run dir can be continued (a rollback "
                       "needs one too)")
    if not rundir.is_local(run_dir):
        raise BadInput(f"options.follows_run_dir needs a local run dir for this run too: {run_dir}")
    here = os.path.realpath(rundir.local_path(run_dir))
    if os.path.realpath(rundir.local_path(earlier)) == here:
        raise BadInput(f"options.follows_run_dir names this run's own dir {run_dir}: name the earlier run's")
    marker = Path(rundir.local_path(posmap.location(run_dir))) / SEEDED_MARKER
    if marker.is_file():  # seeded by an earlier attempt of this run
        details["map_rows_seeded"] = json.loads(marker.read_text()).get("rows", 0)
        return None
    later = continued_by(earlier)
    # Only a run that took the map counts (one stopped before its seeding has nothing to continue).
    if later and os.path.realpath(later) != here \
            and (Path(later) / posmap.POSITION_MAP_DATASET / SEEDED_MARKER).is_file():
        raise BadInput(f"options.follows_run_dir {earlier} was continued by the run in {later} already: continue "
                       "from the latest run of the tenant (that one, or one continuing it)")
    rows = earlier_rows(spec, earlier)
    if dry_run:
        details["map_rows_to_seed"] = len(rows)
        mapped = posmap.read_local(run_dir)
        if mapped is None:
            return rows
        import pandas as pd

        return pd.concat([mapped, rows], ignore_index=True)
    # Rows an attempt of this run without the option mapped (partitions it verified) are the same pairs: readers
    # drop the duplicates. A kill before the marker only makes the next attempt append the rows again.
    # The earlier run learns it was continued first: a later run naming it again would miss this one's messages.
    note = Path(rundir.local_path(earlier)) / CONTINUED_NOTE
    note.write_text(json.dumps({"run_dir": rundir.local_path(run_dir)}) + "\n")
    posmap.append_frame_local(run_dir, rows)
    marker.write_text(json.dumps({"follows_run_dir": earlier, "rows": len(rows)}) + "\n")
    details["map_rows_seeded"] = len(rows)
    log.info("position map seeded with %d rows from %s (its map and its rollback's)", len(rows), earlier)
    return None
