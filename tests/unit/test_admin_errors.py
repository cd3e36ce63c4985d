"""Admin error reasons never carry a token, whatever a proxy echoes back."""

from __future__ import annotations

import requests
from pulsar_migration.admin import _reason


def _response(body: bytes, status: int = 502) -> requests.Response:
    resp = requests.Response()
    resp.status_code, resp._content, resp.reason = status, body, "Bad Gateway"
    return resp


def test_token_like_text_is_masked_in_error_reasons() -> None:
    reason = _reason(_response(b'<html>{"authenticationParameters":"token:eyJ.abc-1"} Bearer eyJ.xyz</html>'))
    assert "eyJ" not in reason
    assert "token:***" in reason or '"authenticationParameters":"***"' in reason
    assert "Bearer ***" in reason


def test_broker_reasons_pass_through() -> None:
    assert _reason(_response(b'{"reason": "Tenant does not exist"}', 404)) == "Tenant does not exist"


class _Answers:
    """A stand-in for the requests session: answers each call with the next (status, body) in turn."""

    headers: dict[str, str] = {}

    def __init__(self, answers: list[tuple[int, bytes]]) -> None:
        self.answers, self.calls = answers, 0

    def request(self, *_args: object, **_kwargs: object) -> requests.Response:
        status, body = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        return _response(body, status)


def answering_client(monkeypatch, answers: list[tuple[int, bytes]], retries: int = 1,
                     clock_step_s: int | None = None):
    """A PulsarAdmin whose session answers `answers` in turn, never sleeping; with `clock_step_s`, its clock moves
    that far at each reading (so a bounded wait ends after a known number of tries)."""
    from pulsar_migration import admin as admin_module

    if clock_step_s is not None:
        clock = iter(range(0, 100_000, clock_step_s))
        monkeypatch.setattr(admin_module.time, "monotonic", lambda: float(next(clock)))
    monkeypatch.setattr(admin_module.time, "sleep", lambda _s: None)
    client = admin_module.PulsarAdmin("http://127.0.0.1:1", retries=retries)
    client._session = _Answers(answers)  # type: ignore[assignment]
    return client


RECOVERING = b'{"reason": "ManagedLedgerException: Error while recovering ledger error code: -10"}'


def test_a_ledger_still_recovering_is_asked_again_past_the_usual_retries(monkeypatch) -> None:
    client = answering_client(monkeypatch, [(500, RECOVERING)] * 6 + [(200, b'{"msgInCounter": 7}')])
    assert client.get("/persistent/t/ns/x/stats") == {"msgInCounter": 7}
    assert client._session.calls == 7  # type: ignore[attr-defined]


def test_a_ledger_that_never_recovers_fails_after_the_bounded_wait(monkeypatch) -> None:
    import pytest
    from pulsar_migration import admin as admin_module

    client = answering_client(monkeypatch, [(500, RECOVERING)], clock_step_s=5)
    with pytest.raises(admin_module.AdminError, match="Error while recovering ledger"):
        client.get("/persistent/t/ns/x/stats")
    # more than the usual 2 attempts, and no more than the 30 s wait allows (the clock moves 5 s a reading)
    assert 2 < client._session.calls <= 1 + admin_module.RECOVERING_LEDGER_WAIT_S // 5  # type: ignore[attr-defined]


def test_other_server_errors_keep_the_usual_retries(monkeypatch) -> None:
    import pytest
    from pulsar_migration import admin as admin_module

    client = answering_client(monkeypatch, [(500, b'{"reason": "something else"}')], retries=2)
    with pytest.raises(admin_module.AdminError, match="something else"):
        client.get("/x")
    assert client._session.calls == 3  # type: ignore[attr-defined]


def test_a_topic_between_owners_is_asked_again_and_other_412s_are_final(monkeypatch) -> None:
    """A namespace unload answers "Can't find owner" for a moment (HTTP 412); a 412 of another kind is the
    broker's refusal and stays one."""
    import pytest
    from pulsar_migration import admin as admin_module

    no_owner = b'{"reason": "Can\'t find owner for topic persistent://t/ns/x"}'
    client = answering_client(monkeypatch, [(412, no_owner)] * 4 + [(200, b'{"ledgerId": 3, "entryId": 9}')])
    assert client.get("/persistent/t/ns/x/lastMessageId") == {"ledgerId": 3, "entryId": 9}
    assert client._session.calls == 5  # type: ignore[attr-defined]
    client._session = _Answers([(412, b'{"reason": "Topic has active producers"}')])  # type: ignore[assignment]
    with pytest.raises(admin_module.AdminError, match="active producers"):
        client.get("/persistent/t/ns/x/lastMessageId")
    assert client._session.calls == 1  # type: ignore[attr-defined]


REFUSED = b'{"reason": "Cannot delete non empty namespace"}'


def test_a_force_delete_asks_again_while_refused_and_counts_gone_as_deleted(monkeypatch) -> None:
    client = answering_client(monkeypatch, [(409, REFUSED)] * 3 + [(204, b"")])
    client.force_delete("/namespaces/t/ns", {409}, wait_s=60)
    assert client._session.calls == 4  # type: ignore[attr-defined]
    client._session = _Answers([(404, b'{"reason": "Namespace does not exist"}')])  # type: ignore[assignment]
    client.force_delete("/namespaces/t/ns", {409}, wait_s=60)
    assert client._session.calls == 1  # type: ignore[attr-defined]


def test_a_force_delete_raises_other_answers_at_once_and_refusals_after_its_wait(monkeypatch) -> None:
    import pytest
    from pulsar_migration import admin as admin_module

    client = answering_client(monkeypatch, [(403, b'{"reason": "Unauthorized"}')], clock_step_s=5)
    with pytest.raises(admin_module.AdminError) as refused:
        client.force_delete("/tenants/t", {409}, wait_s=60)
    assert refused.value.status == 403 and client._session.calls == 1  # type: ignore[attr-defined]
    client._session = _Answers([(409, REFUSED)])  # type: ignore[assignment]
    with pytest.raises(admin_module.AdminError, match="non empty") as kept:
        client.force_delete("/namespaces/t/ns", {409}, wait_s=30)
    assert kept.value.status == 409 and 5 <= client._session.calls <= 8  # type: ignore[attr-defined]
