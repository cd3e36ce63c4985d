"""pulsar_migration.tokens: a token's expiry read from its JWT claims, the warning and the refusal's words."""

from __future__ import annotations

import base64
import datetime
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from pulsar_migration import tokens

NOW = datetime.datetime(2026, 11, 28, 8, 0, tzinfo=datetime.UTC)


def jwt(claims: Any) -> str:
    def part(value: Any) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")
    return f"{part({'alg': 'HS256'})}.{part(claims)}.c2ln"


def test_the_expiry_is_read_from_the_claims_without_the_key() -> None:
    exp = int(NOW.timestamp()) + 600
    assert tokens.expiry(jwt({"sub": "pm-admin", "exp": exp})) == NOW + datetime.timedelta(minutes=10)


@pytest.mark.parametrize("token", [None, "", "not-a-jwt", "a.b", jwt({"sub": "pm-admin"}), jwt({"exp": "soon"}),
                                   jwt({"exp": True}), jwt([1, 2]), "x.%%%.y", "x.bm90IGpzb24.y", jwt({"exp": 1e300})])
def test_tokens_without_a_readable_expiry_have_none(token: str | None) -> None:
    assert tokens.expiry(token) is None


def test_an_expired_token_is_named_with_its_time_and_a_live_one_is_not() -> None:
    past = NOW - datetime.timedelta(seconds=5)
    assert tokens.expired_note(past, NOW) == "expired at 2026-11-28T07:59:55Z"
    assert tokens.expired_note(NOW + datetime.timedelta(seconds=5), NOW) is None
    assert tokens.expired_note(None, NOW) is None


def test_a_token_ending_within_the_hour_gets_one_warning_line() -> None:
    soon = NOW + datetime.timedelta(minutes=12)
    line = tokens.lifetime_warning(soon, "cluster b: the token in PM_T", NOW)
    assert line is not None
    assert line.startswith("cluster b: the token in PM_T expires at 2026-11-28T08:12:00Z, in 12 min")
    assert "\n" not in line
    assert tokens.lifetime_warning(NOW + tokens.EXPIRY_WARNING + datetime.timedelta(seconds=1), "x", NOW) is None
    assert tokens.lifetime_warning(NOW - datetime.timedelta(seconds=1), "x", NOW) is None  # refused, not warned
    assert tokens.lifetime_warning(None, "x", NOW) is None


def test_a_refusal_of_an_expired_token_names_its_expiry_and_other_refusals_keep_their_words() -> None:
    from pulsar_migration.admin import AuthRejected, PulsarAdmin

    from tests.unit.test_admin_errors import _Answers

    refusal = b"<html><body>HTTP ERROR 401 Unauthorized</body></html>"
    gone = jwt({"sub": "pm-admin", "exp": int(datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC).timestamp())})
    for token, why in ((gone, "the token expired at 2026-01-02T03:04:05Z"),
                       (jwt({"sub": "pm-admin"}), "the token is missing, wrong or expired")):
        client = PulsarAdmin("http://127.0.0.1:1", token=token, name="cluster-b", credential="the token in PM_T")
        client._session = _Answers([(401, refusal)])  # type: ignore[assignment]
        with pytest.raises(AuthRejected) as raised:
            client.get("/tenants")
        assert str(raised.value) == f"cluster cluster-b: HTTP 401 on GET /tenants with the token in PM_T: {why}"
        assert token not in str(raised.value)


def test_a_token_file_is_read_at_each_call_trimmed_and_fails_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "t.token"
    path.write_text("first\n")
    assert tokens.read_file(str(path)) == "first"
    path.write_text("  second  \n")  # renewed in place
    assert tokens.read_file(str(path)) == "second"
    path.write_text("\n")
    with pytest.raises(tokens.TokenFileError, match=r"^file .*t\.token is empty$"):
        tokens.read_file(str(path), attempts=1)
    with pytest.raises(tokens.TokenFileError, match=r"^file .*gone\.token does not exist$"):
        tokens.read_file(str(tmp_path / "gone.token"))


def test_a_token_from_a_file_is_warned_about_as_renewable() -> None:
    line = tokens.lifetime_warning(NOW + datetime.timedelta(minutes=12), "cluster b: the token in file /t", NOW,
                                   renewable=True)
    assert line is not None and line.startswith("cluster b: the token in file /t expires at 2026-11-28T08:12:00Z")
    assert "needs a fresh token in the file" in line


def test_an_admin_client_renews_a_refused_token_from_its_source_once() -> None:
    """401 with the old token, the source holds a new one: asked again with it (one renewal per refusal); a
    source still holding the refused token leaves the refusal as it was."""
    from pulsar_migration.admin import AuthRejected, PulsarAdmin

    from tests.unit.test_admin_errors import _Answers

    refusal = b"<html><body>HTTP ERROR 401 Unauthorized</body></html>"
    held = ["new"]
    client = PulsarAdmin("http://127.0.0.1:1", token="old", name="cluster-b", credential="the token in file /t",
                         token_source=lambda: held[0])
    answers = _Answers([(401, refusal), (200, b'["public"]')])
    answers.headers = {"Authorization": "Bearer old"}  # its own, not the class's shared one
    client._session = answers  # type: ignore[assignment]
    assert client.get("/tenants", retry=False) == ["public"]
    assert answers.calls == 2 and answers.headers["Authorization"] == "Bearer new"
    again = _Answers([(401, refusal)])
    again.headers = {"Authorization": "Bearer new"}
    client._session = again  # type: ignore[assignment]
    with pytest.raises(AuthRejected, match="with the token in file /t: the token is missing, wrong or expired"):
        client.get("/tenants", retry=False)
    assert again.calls == 1  # the source's token is the refused one: not asked again


class _ByToken:
    """A stand-in session answering 401 to the old token (after both callers have sent it) and 200 to another."""

    def __init__(self, refused: bytes = b"<html>HTTP ERROR 401</html>") -> None:
        self.headers = {"Authorization": "Bearer old"}
        self.refused = refused
        self.together = threading.Barrier(2, timeout=5)

    def request(self, *_args: object, **_kwargs: object) -> Any:
        from tests.unit.test_admin_errors import _response

        if self.headers["Authorization"] == "Bearer old":
            self.together.wait()  # both calls go out with the old token before either renews it
            return _response(self.refused, 401)
        return _response(b'["public"]', 200)


def test_calls_refused_together_renew_the_token_once() -> None:
    from pulsar_migration.admin import PulsarAdmin

    reads: list[str] = []

    def source() -> str:
        reads.append("new")
        return "new"

    client = PulsarAdmin("http://127.0.0.1:1", token="old", name="cluster-b", token_source=source)
    client._session = _ByToken()  # type: ignore[assignment]
    results: list[Any] = []
    callers = [threading.Thread(target=lambda: results.append(client.get("/tenants", retry=False)))
               for _ in range(2)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(10)
    assert results == [["public"], ["public"]]
    assert reads == ["new"]  # one read of the source for both refusals


def test_a_role_without_the_permission_is_not_renewed() -> None:
    from pulsar_migration.admin import AuthRejected, PulsarAdmin

    reads: list[str] = []
    client = PulsarAdmin("http://127.0.0.1:1", token="old", name="cluster-b",
                         token_source=lambda: reads.append("new") or "new")
    session = _ByToken(b'{"reason": "Unauthorized to validateTenantOperation for operation [LIST_TENANTS]"}')
    session.together = threading.Barrier(1)
    client._session = session  # type: ignore[assignment]
    with pytest.raises(AuthRejected, match="its role lacks the permission"):
        client.get("/tenants", retry=False)
    assert reads == []


def test_an_issuer_that_does_not_answer_is_an_unreachable_cluster_not_a_refusal(tmp_path: Path) -> None:
    from pulsar_migration.admin import ClusterUnreachable
    from pulsar_migration.oauth2 import OAuth2Spec
    from pulsar_migration.spec import ClusterSpec

    credentials = tmp_path / "c.json"
    credentials.write_text('{"client_id": "tools", "client_secret": "s3cret"}')
    cluster = ClusterSpec("b", "http://127.0.0.1:1", "pulsar://127.0.0.1:1",
                          oauth2=OAuth2Spec("http://127.0.0.1:1/", str(credentials)))
    with pytest.raises(ClusterUnreachable) as raised:
        cluster.token()
    assert str(raised.value) == "cluster b: OAuth2 issuer http://127.0.0.1:1/ is unreachable: ConnectionError"
