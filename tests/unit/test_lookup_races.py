"""The lookup service when a hold, a flip or a shutdown meets a request already under way: the upstream clusters
are scripted (pure service logic). The real-broker cutovers are in tests/integration/test_switch_live.py."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from pulsar_migration.lookup.config import LookupConfig
from pulsar_migration.lookup.service import HoldChange, create_app

from tests.integration.lookup_helpers import TOKEN, LookupProcess, free_port

LOOKUP = "/lookup/v2/topic/persistent/acme/ns/t"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


def config(tmp_path: Path, **extra: object) -> LookupConfig:
    return LookupConfig.from_dict({
        "clusters": {"a": {"http_url": "http://a.invalid"}, "b": {"http_url": "http://b.invalid"}},
        "default_cluster": "a", "database_url": f"sqlite:///{tmp_path / 'routes.db'}", "hold_timeout_s": 5, **extra})


def answering(broker: str, calls: list[str], unloading_s: float = 0.0) -> httpx.MockTransport:
    """A cluster whose lookups answer `broker`, after 503s (an unload under way) for the first `unloading_s`."""
    started = time.monotonic()

    def upstream(request: httpx.Request) -> httpx.Response:
        calls.append(broker)
        if time.monotonic() - started < unloading_s:
            return httpx.Response(503, json={"reason": "Namespace bundle is being unloaded"})
        return httpx.Response(200, json={"brokerUrl": f"pulsar://{broker}:6650"})

    return httpx.MockTransport(upstream)


async def serving(app: Any, clusters: dict[str, httpx.MockTransport],
                  scenario: Callable[[httpx.AsyncClient], Awaitable[Any]]) -> Any:
    """`scenario(service)` against the app, its clusters answered by `clusters`."""
    async with app.router.lifespan_context(app):
        app.state.http = {name: httpx.AsyncClient(transport=transport) for name, transport in clusters.items()}
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://svc") as service:
            return await scenario(service)


def test_a_lookup_out_at_the_source_when_the_switch_holds_and_flips_is_answered_with_the_target(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The source answers 503 while the fence unloads it; a lookup that reached it just before the hold kept
    retrying there and, before, was answered with the source's broker after the flip (a client connecting there
    after the quiet check publishes where nothing is copied any more). Now its answer is dropped and it parks."""
    monkeypatch.setenv("PM_LOOKUP_ADMIN_TOKEN", TOKEN)
    app = create_app(config(tmp_path))
    calls: list[str] = []

    async def scenario(svc: httpx.AsyncClient) -> tuple[httpx.Response, list[str], str]:
        out = asyncio.create_task(svc.get(LOOKUP))
        await asyncio.sleep(0.1)
        assert (await svc.post("/api/v1/routes/acme/hold", json={}, headers=ADMIN)).status_code == 200
        await asyncio.sleep(0.5)
        flip = await svc.put("/api/v1/routes/acme", json={"cluster": "b"}, headers=ADMIN)
        assert flip.json()["released"] is True
        answer = await out
        return answer, list(calls), (await svc.get("/metrics")).text

    answer, seen, metrics = asyncio.run(serving(app, {"a": answering("broker-a", calls, unloading_s=1.5),
                                                      "b": answering("broker-b", calls)}, scenario))
    assert answer.status_code == 200 and answer.json()["brokerUrl"] == "pulsar://broker-b:6650", answer.text
    assert seen[0] == "broker-a" and seen[-1] == "broker-b"
    assert "pulsar_lookup_rerouted_total 1" in metrics
    assert "pulsar_lookup_requests_total{kind=\"lookup\",cluster=\"a\"" not in metrics  # the dropped one: uncounted


def test_a_lookup_under_way_is_not_dropped_by_another_tenants_hold(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PM_LOOKUP_ADMIN_TOKEN", TOKEN)
    app = create_app(config(tmp_path))
    calls: list[str] = []

    async def scenario(svc: httpx.AsyncClient) -> httpx.Response:
        out = asyncio.create_task(svc.get(LOOKUP))
        await asyncio.sleep(0.1)
        await svc.post("/api/v1/routes/other/hold", json={}, headers=ADMIN)
        await svc.put("/api/v1/routes/other", json={"cluster": "b"}, headers=ADMIN)
        return await out

    answer = asyncio.run(serving(app, {"a": answering("broker-a", calls, unloading_s=0.5),
                                       "b": answering("broker-b", calls)}, scenario))
    assert answer.json()["brokerUrl"] == "pulsar://broker-a:6650" and set(calls) == {"broker-a"}


def test_a_redirect_the_service_does_not_follow_keeps_its_location(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """From an https cluster to a plain http broker the token may not follow: the client gets the redirect, and
    it needs the Location to go on."""
    monkeypatch.setenv("PM_LOOKUP_ADMIN_TOKEN", TOKEN)
    app = create_app(LookupConfig.from_dict({"clusters": {"a": {"http_url": "https://a.invalid"}},
                                             "default_cluster": "a",
                                             "database_url": f"sqlite:///{tmp_path / 'routes.db'}"}))

    def upstream(request: httpx.Request) -> httpx.Response:
        return httpx.Response(307, headers={"Location": "http://broker-2:8080" + request.url.raw_path.decode()})

    answer = asyncio.run(serving(app, {"a": httpx.MockTransport(upstream)}, lambda svc: svc.get(LOOKUP)))
    assert answer.status_code == 307 and answer.headers["location"] == "http://broker-2:8080" + LOOKUP


def test_parked_requests_are_answered_503_at_shutdown_and_not_forwarded(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PM_LOOKUP_ADMIN_TOKEN", TOKEN)
    app = create_app(config(tmp_path))
    calls: list[str] = []

    async def scenario() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://svc") as svc:
            async with app.router.lifespan_context(app):
                app.state.http = {"a": httpx.AsyncClient(transport=answering("broker-a", calls)),
                                  "b": httpx.AsyncClient(transport=answering("broker-b", calls))}
                app.state.router.hold("acme", HoldChange())
                parked = asyncio.create_task(svc.get(LOOKUP))
                await asyncio.sleep(0.1)
            return await parked

    answer = asyncio.run(scenario())
    assert answer.status_code == 503 and "stopping" in answer.json()["reason"] and calls == []


def test_a_sigterm_answers_the_parked_requests_before_the_graceful_shutdown_gives_up(tmp_path: Path) -> None:
    """The real process: uvicorn waits 5 s for requests under way and then cancels them (a bare 500); parked ones
    (for up to hold_timeout_s) are answered 503 at the signal instead."""
    port = free_port()
    (tmp_path / "lookup.json").write_text(json.dumps({
        "clusters": {"a": {"http_url": "http://127.0.0.1:9"}}, "default_cluster": "a", "hold_timeout_s": 20,
        "database_url": f"sqlite:///{tmp_path / 'routes.db'}", "port": port}))
    service = LookupProcess(tmp_path / "lookup.json", port)
    service.start()
    answers: list[httpx.Response] = []
    try:
        assert service.api("POST", "/routes/acme/hold", json={"reason": "test"}).status_code == 200
        parked = threading.Thread(target=lambda: answers.append(httpx.get(service.url + LOOKUP, timeout=30)))
        parked.start()
        time.sleep(1.0)
        asked_at = time.monotonic()
    finally:
        output = service.stop()
    parked.join(30)
    assert answers and answers[0].status_code == 503, (answers, output[-2000:])
    assert "stopping" in answers[0].json()["reason"]
    assert time.monotonic() - asked_at < 5  # at the signal, not after the 5 s grace
