"""Continuing an earlier migration run (options.follows_run_dir): which run dirs may be continued, and the map a
continuing run is seeded with (pure file logic on run dirs written as the steps write them; the seeded map on
real clusters is judged in tests/integration/test_rollback_live.py)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pulsar_migration import dag_support
from pulsar_migration.positions import Position
from pulsar_migration.replication import follows, posmap
from pulsar_migration.replication.partition import PartitionJob, not_copied_hint, run_partition, untagged
from pulsar_migration.replication.posmap import MapRow
from pulsar_migration.replication.reading import ReadError
from pulsar_migration.report import StepReport
from pulsar_migration.spec import MigrationSpec
from pulsar_migration.stepjob import BadInput
from pulsar_migration.switch import rollback

TOPIC = "persistent://t/ns/x"


def spec(follows_run_dir: str | None = None, tenant: str = "t", mode: str = "copy") -> MigrationSpec:
    return MigrationSpec.from_dict({
        "tenant": tenant, "source": "a", "target": "b", "replication": {"mode": mode},
        "clusters": {n: {"admin_url": f"http://{n}:8080", "service_url": f"pulsar://{n}:6650"} for n in "ab"},
        "options": {"follows_run_dir": follows_run_dir}})


def row(source: tuple[int, int], target: tuple[int, int]) -> MapRow:
    return MapRow(topic=TOPIC, partition=-1, source_ledger=source[0], source_entry=source[1], source_messages=1,
                  source_batched=False, source_first_chunk=None, target_ledger=target[0], target_entry=target[1],
                  target_messages=1, target_batched=False, target_first_chunk=None, source_publish_time=1,
                  mode="copy")


def report(run_dir: Path, step: str, verdict: str = "ok", of: MigrationSpec | None = None,
           **details: Any) -> None:
    done = StepReport.start(step, of or spec())
    done.details.update({"mode": (of or spec()).replication_mode, **details})
    done.finish(verdict)  # type: ignore[arg-type]
    done.write(str(run_dir))


def rolled_back_run(tmp_path: Path) -> Path:
    """A migration run as rollback_lookup leaves it: source entries 10:0-2 copied to target 20:0-2, switched; the
    reverse map (seeded from the forward one, sides swapped) plus target 20:3-4, published there by clients,
    copied back to source 11:0-1; rolled back."""
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    report(earlier, "replicate_topics")
    report(earlier, "switch_lookup", route_after="b")
    report(earlier, "rollback_lookup", route_after="a")
    posmap.append_local(str(earlier), [row((10, i), (20, i)) for i in range(3)])
    posmap.append_local(str(earlier / "rollback"), [row((20, i), (10, i)) for i in range(3)]
                        + [row((20, 3), (11, 0)), row((20, 4), (11, 1))])
    return earlier


def pairs(run_dir: Path) -> list[tuple[int, int, int, int]]:
    frame = posmap.read_local(str(run_dir))
    assert frame is not None
    return sorted(zip(frame.source_ledger, frame.source_entry, frame.target_ledger, frame.target_entry, strict=True))


def test_a_rolled_back_run_seeds_its_map_and_its_rollbacks_swapped_once(tmp_path: Path) -> None:
    earlier, now = rolled_back_run(tmp_path), tmp_path / "now"
    details: dict[str, Any] = {}

    planned = follows.seed(spec(str(earlier)), str(now), details, dry_run=True)
    assert planned is not None and not posmap.part_files(str(now))  # a dry run writes nothing
    assert details.pop("map_rows_to_seed") == 5 and "map_rows_seeded" not in details
    assert str(posmap.ends_of(planned)[TOPIC].source) == "11:1"

    assert follows.seed(spec(str(earlier)), str(now), details, dry_run=False) is None
    # the forward rows once (the rollback's seeded copy of them dropped), and the target's own messages mapped
    # from their copies on the source
    assert pairs(now) == [(10, 0, 20, 0), (10, 1, 20, 1), (10, 2, 20, 2), (11, 0, 20, 3), (11, 1, 20, 4)]
    assert details == {"follows_run_dir": str(earlier), "map_rows_seeded": 5}
    end = posmap.ends_local(str(now))[TOPIC]
    assert (str(end.target), str(end.source)) == ("20:4", "11:1")  # the copy resumes after the source's 11:1

    again: dict[str, Any] = {}
    follows.seed(spec(str(earlier)), str(now), again, dry_run=False)
    assert again["map_rows_seeded"] == 5 and len(posmap.part_files(str(now))) == 1  # once; the count kept


def test_a_run_continued_already_is_refused_to_any_other_run(tmp_path: Path) -> None:
    earlier = rolled_back_run(tmp_path)
    follows.seed(spec(str(earlier)), str(tmp_path / "second"), {}, dry_run=False)
    assert json.loads((earlier / "continued_by.json").read_text()) == {"run_dir": str(tmp_path / "second")}
    with pytest.raises(BadInput, match=r"was continued by the run in .*second already: continue from the latest"):
        follows.seed(spec(str(earlier)), str(tmp_path / "third"), {}, dry_run=True)
    assert not (tmp_path / "third").exists()
    (tmp_path / "second" / "position_map" / follows.SEEDED_MARKER).unlink()  # killed before its marker: a retry
    follows.seed(spec(str(earlier)), str(tmp_path / "second"), {}, dry_run=False)
    assert len(pairs(tmp_path / "second")) == 5
    shutil.rmtree(tmp_path / "second")  # a continuing run given up before its seeding took the map
    (tmp_path / "second").mkdir()
    follows.seed(spec(str(earlier)), str(tmp_path / "third"), {}, dry_run=False)
    assert len(pairs(tmp_path / "third")) == 5


def test_a_rollback_that_failed_only_in_its_probe_or_found_itself_done_counts_as_rolled_back(tmp_path: Path) -> None:
    earlier = rolled_back_run(tmp_path)
    report(earlier, "rollback_lookup", verdict="failed", route_after="a")  # flipped back, then the probe failed
    follows.seed(spec(str(earlier)), str(tmp_path / "now"), {}, dry_run=False)
    report(earlier, "rollback_lookup", verdict="failed", already_rolled_back=True)  # a re-run, probe failed
    (earlier / "continued_by.json").unlink()
    follows.seed(spec(str(earlier)), str(tmp_path / "then"), {}, dry_run=False)
    assert pairs(tmp_path / "now") == pairs(tmp_path / "then") and len(pairs(tmp_path / "now")) == 5


def test_rows_an_attempt_without_the_option_mapped_do_not_stop_the_seeding(tmp_path: Path) -> None:
    earlier, now = rolled_back_run(tmp_path), tmp_path / "now"
    posmap.append_local(str(now), [row((10, 0), (20, 0))])  # a partition that attempt verified
    follows.seed(spec(str(earlier)), str(now), {}, dry_run=False)
    assert pairs(now) == [(10, 0, 20, 0), (10, 1, 20, 1), (10, 2, 20, 2), (11, 0, 20, 3), (11, 1, 20, 4)]


def test_a_run_never_switched_seeds_its_map_alone(tmp_path: Path) -> None:
    earlier = tmp_path / "earlier"
    report(earlier, "replicate_topics", verdict="failed")  # its verified partitions' rows are in the map
    report(earlier, "switch_lookup", verdict="failed", rolled_back=True)  # gave up before the flip
    posmap.append_local(str(earlier), [row((10, 0), (20, 0))])
    follows.seed(spec(str(earlier)), str(tmp_path / "now"), {}, dry_run=False)
    assert pairs(tmp_path / "now") == [(10, 0, 20, 0)]


@pytest.mark.parametrize("case", ["switched, not rolled back", "rollback failed", "flipped, probe failed",
                                  "switched again", "route moved by hand", "another tenant", "geo mode", "no map",
                                  "not a migration", "its own dir", "object store"])
def test_runs_that_cannot_be_continued_are_refused_in_one_line_before_anything_is_written(
        tmp_path: Path, case: str) -> None:
    earlier, now = rolled_back_run(tmp_path), tmp_path / "now"
    expected = {
        "switched, not rolled back": "switched the tenant's clients to b and was not rolled back "
                                     r"\(rollback_lookup never ran\)",
        "rollback failed": r"was not rolled back \(rollback_lookup failed\)",
        "flipped, probe failed": r"was not rolled back \(rollback_lookup never ran\)",
        "switched again": "switched the tenant's clients to b again after its rollback",
        "route moved by hand": "found the route back on a without switching it back itself",
        "another tenant": "migrated tenant other from a to b, not tenant t from a to b",
        "geo mode": "replicated in copy mode, this run in geo mode",
        "no map": "holds no position map",
        "not a migration": "has no replicate_topics report",
        "its own dir": "names this run's own dir",
        "object store": "only a local run dir can be continued",
    }[case]
    follows_dir, this = str(earlier), spec(str(earlier))
    if case == "switched, not rolled back":
        (earlier / "rollback_lookup.json").unlink()
    elif case == "rollback failed":
        report(earlier, "rollback_lookup", verdict="failed")  # before its flip back
    elif case == "flipped, probe failed":
        (earlier / "rollback_lookup.json").unlink()
        report(earlier, "switch_lookup", verdict="failed", route_after="b")
    elif case == "switched again":
        report(earlier, "switch_lookup", route_after="b")
        later = json.loads((earlier / "switch_lookup.json").read_text())
        later["finished_at"] = "2999-01-01T00:00:00.000Z"
        (earlier / "switch_lookup.json").write_text(json.dumps(later))
    elif case == "route moved by hand":
        report(earlier, "rollback_lookup", already_rolled_back=True)
        shutil.rmtree(earlier / "rollback")
    elif case == "another tenant":
        report(earlier, "replicate_topics", of=spec(tenant="other"))
    elif case == "geo mode":
        this = spec(str(earlier), mode="geo")
    elif case == "no map":
        for part in posmap.part_files(str(earlier)):
            part.unlink()
    elif case == "not a migration":
        (earlier / "replicate_topics.json").unlink()
    elif case == "its own dir":
        now = earlier
    elif case == "object store":
        follows_dir = "s3a://bucket/runs/earlier"
        this = spec(follows_dir)
    with pytest.raises(BadInput, match=expected) as refused:
        follows.seed(this, str(now), {}, dry_run=False)
    assert "\n" not in str(refused.value)
    if case != "its own dir":
        assert not (now / "position_map").exists()


def test_the_form_names_a_run_by_id_and_refuses_an_unknown_or_different_one(tmp_path: Path) -> None:
    base = tmp_path / "runs"
    earlier = Path(dag_support.run_dir(str(base), dag_support.MIGRATION_DAG_ID, "manual__1"))
    earlier.mkdir(parents=True)
    (earlier / dag_support.SPEC_FILE).write_text(spec().to_json())
    document = spec().to_dict()

    continued = dag_support.following(document, str(base), "manual__1")
    assert continued["options"]["follows_run_dir"] == str(earlier)
    assert MigrationSpec.from_dict(continued).follows_run_dir == str(earlier)

    with pytest.raises(ValueError, match="Continue from run: no run 'manual__2' of pulsar_tenant_migration"):
        dag_support.following(document, str(base), "manual__2")
    with pytest.raises(ValueError, match="migrated tenant t from a to b, not tenant u from a to b"):
        dag_support.following(spec(tenant="u").to_dict(), str(base), "manual__1")
    assert document["options"].get("follows_run_dir") is None  # the trigger's document is not changed
    (earlier / dag_support.SPEC_FILE).write_text("{not json")
    with pytest.raises(ValueError, match=r"^Continue from run: the spec of run 'manual__1' at .* is not JSON"):
        dag_support.following(document, str(base), "manual__1")


def test_what_a_run_is_told_about_target_messages_no_copy_made() -> None:
    assert "continue from the rolled-back run (options.follows_run_dir" in not_copied_hint(spec())
    assert "continue from the latest rolled-back migration run" in not_copied_hint(spec("/runs/one"))
    assert not_copied_hint(rollback.reverse_spec(spec("/runs/one"))) == ""  # a rollback's reverse run

    def body(task: Any) -> list[Any]:
        raise untagged(TOPIC, Position(20, 4), "")

    shared = SimpleNamespace(src_admin=None, tgt_admin=None, src_client=None, tgt_client=None)
    job = PartitionJob(topic=TOPIC, local="ns/x", partition=-1, upper=None)
    outcome, rows = run_partition(spec(), job, body, (ReadError,), shared)  # type: ignore[arg-type]
    assert rows == [] and outcome.error == (
        f"{TOPIC} on the target holds messages that were not copied from the source (last entry 20:4 has no "
        f"__pm_source property){not_copied_hint(spec())}")


def test_a_rollback_stays_known_when_a_dry_run_or_a_failed_rerun_replaces_its_report(tmp_path: Path) -> None:
    """rollback_lookup notes the flip in the run dir; a later dry run of it (verdict planned, nothing it flipped)
    rewrites rollback_lookup.json, and before the note the run then looked never rolled back: cleanup_source
    accepted it and a continuing run was refused."""
    run = tmp_path / "run"
    run.mkdir()
    report(run, "switch_lookup", route_after="b")
    report(run, "rollback_lookup", route_after="a")
    follows.note_rolled_back(str(run))
    when = follows.rolled_back(str(run), "a")
    assert when is not None
    dry = StepReport.start("rollback_lookup", spec())
    dry.dry_run = True
    dry.details["already_rolled_back"] = True
    dry.finish("planned")
    dry.write(str(run))
    report(run, "rollback_lookup", verdict="failed")  # a re-run that failed before reading the route
    assert follows.rolled_back(str(run), "a") == when
    (run / follows.ROLLED_BACK).unlink()
    assert follows.rolled_back(str(run), "a") is None  # the report alone no longer says so
    # switched again after the rollback: no longer rolled back
    follows.note_rolled_back(str(run))
    time.sleep(0.01)  # (the reports' times are to the millisecond)
    report(run, "switch_lookup", route_after="b")
    assert follows.rolled_back(str(run), "a") is None
