"""sync_metadata refuses a tenant whose clients the lookup service routes to the target already, unless this run dir
switched them (a cleared task re-runs there): a new migration run after a failure past the flip applied the frozen
source's metadata over the live target (policies set back, subscriptions and topics the clients deleted created
again), and the report advised exactly that ("trigger the DAG again")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pulsar_migration.lookup.client import LookupServiceError
from pulsar_migration.metadata.step import check_not_switched
from pulsar_migration.spec import MigrationSpec
from pulsar_migration.stepjob import BadInput


class Lookup:
    def __init__(self, answer: dict[str, Any] | Exception) -> None:
        self.answer = answer
        self.closed = False

    def route(self, tenant: str) -> dict[str, Any]:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    def close(self) -> None:
        self.closed = True


def spec_with_lookup(spec_dict: dict[str, Any], monkeypatch: pytest.MonkeyPatch, lookup: Lookup) -> MigrationSpec:
    spec = MigrationSpec.from_dict({**spec_dict, "lookup": {"url": "http://127.0.0.1:1", "token_env": None}})
    monkeypatch.setattr(MigrationSpec, "lookup_admin", lambda self: lookup)
    return spec


def test_a_tenant_routed_to_the_target_is_refused_unless_this_run_switched_it(
    spec_dict: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    at_target = Lookup({"cluster": spec_dict["target"], "held": False})
    spec = spec_with_lookup(spec_dict, monkeypatch, at_target)
    with pytest.raises(BadInput, match=f"routes tenant {spec.tenant} to the target {spec.target} already.*clear its "
                                       "failed task.*roll it back first"):
        check_not_switched(spec, str(tmp_path))
    assert at_target.closed
    (tmp_path / "switch_lookup.json").write_text("{}")  # this run dir switched it: a cleared task re-runs here
    check_not_switched(spec, str(tmp_path))
    at_source = spec_with_lookup(spec_dict, monkeypatch, Lookup({"cluster": spec_dict["source"], "held": False}))
    check_not_switched(at_source, str(tmp_path / "new"))
    down = spec_with_lookup(spec_dict, monkeypatch, Lookup(LookupServiceError("lookup service ... unreachable")))
    check_not_switched(down, str(tmp_path / "new"))  # this step does not need the service: warned only
    assert "cannot tell where the lookup service routes tenant" in caplog.text
    check_not_switched(MigrationSpec.from_dict(spec_dict), str(tmp_path / "new"))  # no lookup service in the spec
