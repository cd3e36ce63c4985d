"""ChangeApplier's answer to "412 Subscription Busy" (seen on a CREATE retried after a cut connection, the first
request still at work: tests/integration/test_cluster_c.py meets it through the proxy): asked again until the
broker says the subscription exists; any other 412, or an UPDATE, fails at once."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pulsar_migration.admin import AdminError, Conflict
from pulsar_migration.metadata import apply
from pulsar_migration.metadata.apply import Change, ChangeApplier
from pulsar_migration.metadata.plan import CREATE

BUSY = AdminError("PUT ... failed with HTTP 412: Failed for Subscription Busy: Failed to fence subscription", 412)


class ScriptedAdmin:
    """Answers each PUT with the next scripted outcome (an exception to raise, or None)."""

    name = "cluster-x"

    def __init__(self, outcomes: list[Exception | None]) -> None:
        self.outcomes = outcomes
        self.puts: list[str] = []

    def put(self, path: str, body: Any = None, **_: Any) -> None:
        self.puts.append(path)
        outcome = self.outcomes.pop(0)
        if outcome is not None:
            raise outcome


def subscription_change(action: str = CREATE) -> Change:
    return Change(side="target", kind="subscription", key="ns/orders|billing", namespace="ns", action=action,
                  desired="{}", change=json.dumps({"properties": {}}))


def applier(admin: ScriptedAdmin) -> ChangeApplier:
    spec: Any = type("Spec", (), {"tenant": "t"})()
    return ChangeApplier(spec, {"target": admin})  # type: ignore[dict-item]


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(apply.time, "sleep", lambda _: None)


def test_busy_then_exists_is_done() -> None:
    admin = ScriptedAdmin([BUSY, BUSY, Conflict("exists", 409)])
    applier(admin).apply(subscription_change())
    assert admin.puts == ["/persistent/t/ns/orders/subscription/billing"] * 3


def test_busy_every_time_fails_after_the_last_attempt() -> None:
    admin = ScriptedAdmin([BUSY] * apply.BUSY_ATTEMPTS)
    with pytest.raises(AdminError, match="Busy"):
        applier(admin).apply(subscription_change())
    assert len(admin.puts) == apply.BUSY_ATTEMPTS


def test_another_412_or_an_update_is_not_asked_again() -> None:
    other = AdminError("PUT ... failed with HTTP 412: Precondition failed", 412)
    with pytest.raises(AdminError, match="Precondition"):
        applier(ScriptedAdmin([other, None])).apply(subscription_change())
    admin = ScriptedAdmin([BUSY, None])
    with pytest.raises(AdminError, match="Busy"):
        applier(admin).apply(subscription_change(action="UPDATE"))
    assert len(admin.puts) == 1


def test_a_cursor_reset_is_asked_again_while_the_subscription_is_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    """sync_progress's reset, retried after a cut connection, met the first still fencing the subscription
    (test_cluster_c through the proxy, 2026-11-29): the same reset asked again is harmless."""
    from pulsar_migration.admin import asked_again_while_busy

    answers: list[Exception | None] = [BUSY, BUSY, None]

    def reset() -> str:
        outcome = answers.pop(0)
        if outcome is not None:
            raise outcome
        return "reset"

    assert asked_again_while_busy(reset, "reset of s on t") == "reset" and answers == []
    def refused() -> str:
        raise AdminError("POST ... failed with HTTP 412: Failed to reset cursor", 412)

    with pytest.raises(AdminError, match="reset cursor"):  # any other 412 at once
        asked_again_while_busy(refused, "reset of s on t")


class SchemaAdmin:
    """Takes schema posts, refusing the `refuse_at`-th (0-based) as the compatibility check does."""

    name = "cluster-x"

    def __init__(self, refuse_at: int | None = None) -> None:
        self.refuse_at, self.posts = refuse_at, []  # type: ignore[var-annotated]

    def post(self, path: str, body: Any = None, **_: Any) -> None:
        if len(self.posts) == self.refuse_at:
            raise Conflict("POST ... failed with HTTP 409: Incompatible schema: ...", 409, path)
        self.posts.append(path)


def schema_change(versions: int) -> Change:
    body = {"versions": [{"type": "AVRO", "data": f"v{n}", "properties": {}} for n in range(versions)]}
    return Change(side="target", kind="schema", key="ns/orders", namespace="ns", action=CREATE, desired="{}",
                  change=json.dumps(body))


def test_schema_versions_go_under_the_tenant_quoted_once() -> None:
    """A tenant name with ':' was quoted twice (`acme%253Aeu`): the broker refused every schema post."""
    admin = SchemaAdmin()
    ChangeApplier(type("Spec", (), {"tenant": "acme:eu"})(), {"target": admin}).apply(  # type: ignore[arg-type,dict-item]
        schema_change(2))
    assert admin.posts == ["/schemas/acme%3Aeu/ns/orders/schema"] * 2


def test_a_schema_version_the_target_refuses_fails_in_one_line_instead_of_passing_for_exists() -> None:
    admin = SchemaAdmin(refuse_at=1)
    with pytest.raises(AdminError, match="schema 2 of 3 of ns/orders refused by cluster-x's compatibility check"):
        applier(admin).apply(schema_change(3))  # type: ignore[arg-type]
    assert len(admin.posts) == 1


def test_a_create_answered_409_is_done_and_keeps_the_answer_for_the_verification() -> None:
    """A partitioned `x` created where a stray non-partitioned `x-partition-0` exists is answered 409 "This topic
    already exists": done as before, but the answer now reaches the verification's line (it named no reason)."""
    admin = ScriptedAdmin([Conflict("This topic already exists", 409)])
    assert applier(admin).apply(subscription_change()) == "409 This topic already exists"
    assert applier(ScriptedAdmin([None])).apply(subscription_change()) is None
