"""The lookup service's handling of a broker's transient 5xx (an unload, a bundle move): retried inside the
service with a short backoff, so clients, which back off for seconds after an HTTP error, never see it; a
lasting error is passed on once the retry budget is spent. The upstream is scripted (pure service logic);
the real-broker behaviour is in tests/integration/test_lookup_service.py and benchmarks/switch_stall.py."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient
from pulsar_migration.lookup.config import LookupConfig
from pulsar_migration.lookup.service import create_app

LOOKUP = "/lookup/v2/topic/persistent/acme/ns/t"
ANSWER = {"brokerUrl": "pulsar://broker-a:6650", "httpUrl": "http://broker-a:8080"}


def client_for(tmp_path_factory: pytest.TempPathFactory, failures: int, retry_s: float,
               monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[TestClient, list[int]]]:
    monkeypatch.setenv("PM_LOOKUP_ADMIN_TOKEN", "t")
    config = LookupConfig.from_dict({
        "clusters": {"a": {"http_url": "http://a.invalid"}}, "default_cluster": "a", "transient_retry_s": retry_s,
        "database_url": f"sqlite:///{tmp_path_factory.mktemp('routes') / 'r.db'}"})
    calls: list[int] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) <= failures:
            return httpx.Response(500, json={"reason": "Namespace bundle is being unloaded"})
        return httpx.Response(200, json=ANSWER)

    app = create_app(config)
    with TestClient(app) as client:
        app.state.http = {"a": httpx.AsyncClient(transport=httpx.MockTransport(upstream))}
        yield client, calls


@pytest.fixture
def make(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    opened: list[Iterator[tuple[TestClient, list[int]]]] = []

    def factory(failures: int, retry_s: float) -> tuple[TestClient, list[int]]:
        gen = client_for(tmp_path_factory, failures, retry_s, monkeypatch)
        opened.append(gen)
        return next(gen)

    yield factory
    for gen in opened:
        next(gen, None)


def test_a_brief_broker_error_is_retried_inside_the_service(make: object) -> None:
    client, calls = make(failures=3, retry_s=5.0)  # type: ignore[operator]
    resp = client.get(LOOKUP)
    assert resp.status_code == 200 and resp.json()["brokerUrl"] == ANSWER["brokerUrl"]
    assert resp.json()["brokerUrlTls"] == ""  # the C++ client needs both keys
    assert len(calls) == 4
    assert "pulsar_lookup_transient_retries_total 3" in client.get("/metrics").text


def test_a_lasting_error_is_passed_on_when_the_budget_is_spent(make: object) -> None:
    client, calls = make(failures=1000, retry_s=0.3)  # type: ignore[operator]
    resp = client.get(LOOKUP)
    assert resp.status_code == 500 and "unloaded" in resp.text
    assert 2 <= len(calls) <= 8  # 25, 50, 100 ms ... within 0.3 s


def test_a_lookup_whose_token_file_is_gone_gets_a_502_naming_it(tmp_path_factory: pytest.TempPathFactory,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The service's credential for a cluster, read at each lookup: once it cannot be read, the client gets one
    line saying why instead of a lookup the cluster would refuse; the token goes along while it can."""
    monkeypatch.setenv("PM_LOOKUP_ADMIN_TOKEN", "t")
    token_file = tmp_path_factory.mktemp("token") / "a.token"
    token_file.write_text("file-token\n")
    config = LookupConfig.from_dict({
        "clusters": {"a": {"http_url": "http://a.invalid", "token_file": str(token_file)}}, "default_cluster": "a",
        "database_url": f"sqlite:///{tmp_path_factory.mktemp('routes') / 'r.db'}"})
    sent: list[str | None] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        sent.append(request.headers.get("authorization"))
        return httpx.Response(200, json=ANSWER)

    app = create_app(config)
    with TestClient(app) as client:
        app.state.http = {"a": httpx.AsyncClient(transport=httpx.MockTransport(upstream))}
        assert client.get(LOOKUP).status_code == 200
        assert client.get(LOOKUP, headers={"Authorization": "Bearer the-clients"}).status_code == 200
        token_file.unlink()
        gone = client.get(LOOKUP)
    assert sent == ["Bearer file-token", "Bearer the-clients"]
    assert gone.status_code == 502
    assert gone.json()["reason"] == f"lookup config: clusters.a.token_file file {token_file} does not exist"
