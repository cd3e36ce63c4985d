"""What a switch finds that an earlier attempt left: a hold (killed between its hold and its flip, or a flip whose
release failed), a flip the service applied although its answer failed, and geo mode's fenced producers. The lookup
service is a scripted stand-in here; the real service and clusters meet the same cases in
tests/integration/test_switch_kills.py (kills at each phase boundary) and tests/unit/test_lookup_races.py."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
from pulsar_migration.lookup.client import LookupServiceError
from pulsar_migration.report import StepReport
from pulsar_migration.spec import MigrationSpec
from pulsar_migration.stepjob import StepContext
from pulsar_migration.switch.geo_dedup import FENCED_PRODUCERS, kept_with_earlier
from pulsar_migration.switch.step import flip_route, release_a_left_hold

SPEC = MigrationSpec.from_dict({
    "tenant": "acme", "source": "a", "target": "b",
    "clusters": {"a": {"admin_url": "http://127.0.0.1:1", "service_url": "pulsar://127.0.0.1:1"},
                 "b": {"admin_url": "http://127.0.0.1:2", "service_url": "pulsar://127.0.0.1:2"}}})


class ScriptedLookup:
    """The admin API's route, hold and release; `set_route` applies the route and then fails as told."""

    def __init__(self, cluster: str, held: bool, flip_fails: str | None = None) -> None:
        self.cluster, self.held, self.flip_fails = cluster, held, flip_fails
        self.calls: list[str] = []

    def route(self, tenant: str) -> dict[str, Any]:
        return {"tenant": tenant, "cluster": self.cluster, "held": self.held}

    def release(self, tenant: str, *, reason: str) -> dict[str, Any]:
        self.calls.append(f"release: {reason}")
        self.held = False
        return {"held": False}

    def set_route(self, tenant: str, cluster: str, *, reason: str, release: bool = True) -> dict[str, Any]:
        self.calls.append(f"set_route {cluster}")
        if self.flip_fails == "before":
            raise LookupServiceError("lookup service is unreachable: ConnectionError")
        self.cluster = cluster
        if self.flip_fails == "after":  # the route stored, the hold's release failed (500) or the answer was lost
            raise LookupServiceError("PUT /api/v1/routes/acme failed with HTTP 500: Internal Server Error")
        self.held = self.held and not release
        return {"released": release}


def context(tmp_path: Path, dry_run: bool = False) -> StepContext:
    report = StepReport(step="switch_lookup", tenant="acme", source="a", target="b", spec_hash="x", dry_run=dry_run)
    return StepContext("switch_lookup", SPEC, str(tmp_path), dry_run, argparse.Namespace(), report)


@pytest.mark.parametrize("cluster", ["a", "b"])
def test_a_hold_an_earlier_attempt_left_is_released_where_the_route_points(tmp_path: Path, cluster: str) -> None:
    ctx, lookup = context(tmp_path), ScriptedLookup(cluster, held=True)
    release_a_left_hold(ctx, lookup, lookup.route("acme"))  # type: ignore[arg-type]
    assert lookup.calls == [f"release: a hold an earlier attempt left: released to {cluster}"]
    assert ctx.report.details["left_hold"] == "released"


def test_no_hold_nothing_released_and_a_dry_run_only_reports_it(tmp_path: Path) -> None:
    ctx, lookup = context(tmp_path), ScriptedLookup("a", held=False)
    release_a_left_hold(ctx, lookup, lookup.route("acme"))  # type: ignore[arg-type]
    assert lookup.calls == [] and "left_hold" not in ctx.report.details
    ctx, lookup = context(tmp_path, dry_run=True), ScriptedLookup("a", held=True)
    release_a_left_hold(ctx, lookup, lookup.route("acme"))  # type: ignore[arg-type]
    assert lookup.calls == [] and ctx.report.details["left_hold"] == "kept (dry run)"


def test_a_flip_the_service_applied_though_its_answer_failed_counts_as_flipped_and_its_hold_is_released(
        tmp_path: Path) -> None:
    """Before, the switch took the failed answer for no flip, released the hold (clients went to the target) and
    reported 'rolled back: route unchanged'; rollback_lookup then refused to switch them back."""
    ctx, lookup = context(tmp_path), ScriptedLookup("a", held=True, flip_fails="after")
    flip_route(ctx, lookup)  # type: ignore[arg-type]
    assert lookup.cluster == "b" and not lookup.held
    assert lookup.calls == ["set_route b", "release: switch from a: the flip's release"]
    assert "HTTP 500" in ctx.report.details["flip_answer_failed"]


def test_a_flip_that_did_not_happen_still_fails(tmp_path: Path) -> None:
    ctx, lookup = context(tmp_path), ScriptedLookup("a", held=True, flip_fails="before")
    with pytest.raises(LookupServiceError, match="unreachable"):
        flip_route(ctx, lookup)  # type: ignore[arg-type]
    assert lookup.cluster == "a" and lookup.held and "flip_answer_failed" not in ctx.report.details


def test_fenced_producers_are_kept_across_attempts_for_the_selected_partitions(tmp_path: Path) -> None:
    """The attempt killed after its fence saw p1 and p2; the re-run's fence sees nobody (they wait in their
    backoff) and a late p3: geo mode's dedup check still asks after p1 and p2."""
    parts = ["persistent://acme/ns/t-partition-0", "persistent://acme/ns/t-partition-1"]
    first = kept_with_earlier(str(tmp_path), {parts[0]: ["p1", "p2"]}, parts)
    assert first == {parts[0]: ["p1", "p2"]}
    assert json.loads((tmp_path / FENCED_PRODUCERS).read_text()) == first
    again = kept_with_earlier(str(tmp_path), {parts[1]: ["p3"]}, parts)
    assert again == {parts[0]: ["p1", "p2"], parts[1]: ["p3"]}
    # a partition no longer selected (the topic was deleted since) is not asked after
    assert kept_with_earlier(str(tmp_path), {}, parts[1:]) == {parts[1]: ["p3"]}
