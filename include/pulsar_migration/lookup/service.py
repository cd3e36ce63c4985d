"""The lookup service's HTTP side (FastAPI): what Pulsar clients ask over HTTP, forwarded to the cluster that
owns the tenant, and a token-protected admin API for routes and holds.

Client endpoints (an `http://` service URL makes C++, Python and Java clients use these, FACTS.md):
`GET /lookup/v2/topic/{domain}/{tenant}/{ns}/{topic}`, `GET /admin/v2/{domain}/{tenant}/{ns}/{topic}/partitions`,
`GET /admin/v2/namespaces/{tenant}/{ns}/topics`, `GET /admin/v2/schemas/{tenant}/{ns}/{topic}/schema[/{v}]`.
Each is forwarded to the owning cluster's HTTP URL, with the client's own `Authorization` header when it sent
one (else the service's token for that cluster, if configured); redirects (to the owner broker) are followed here, since
clients do not carry credentials across hosts; a 200 lookup answer always carries `brokerUrl` and
`brokerUrlTls`, so the data connection goes straight to the brokers.

A held tenant's requests are parked, not refused: C++ clients treat any HTTP error as a failed connect and
back off exponentially (up to 60 s), while a late answer costs them nothing. They are answered the moment
the hold is released (a route change releases it), or after `hold_timeout_s` with a 503 naming the hold.

Admin API (`Authorization: Bearer <token>`; anything else is 401 and changes nothing):
`GET /api/v1/routes`, `GET|PUT|DELETE /api/v1/routes/{tenant}`, `POST /api/v1/routes/{tenant}/hold`,
`POST /api/v1/routes/{tenant}/release`, `GET /api/v1/routes/{tenant}/history`. Unauthenticated:
`GET /health`, `GET /metrics` (Prometheus text format).

One instance per database: routes and holds are cached in memory and written through.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import Any

import httpx
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, Field

from pulsar_migration.admin import MAX_REDIRECTS, token_may_follow
from pulsar_migration.lookup.config import ClusterTarget, ConfigError, LookupConfig
from pulsar_migration.lookup.metrics import Metrics
from pulsar_migration.lookup.store import Route, RouteStore

log = logging.getLogger(__name__)

DOMAINS = ("persistent", "non-persistent")
TRANSIENT_STATUS = frozenset({500, 502, 503})
TRANSIENT_RETRY_FIRST_S = 0.025
TRANSIENT_RETRY_MAX_S = 0.4
# A request whose tenant is held or routed elsewhere while it is out is asked again, at most this often.
MAX_REROUTES = 5
# The admin API's bodies are a few hundred bytes; anything far larger is a mistake or an attack, refused
# (413) before it is read into memory.
MAX_BODY_BYTES = 64 * 1024
# Pulsar's own rule for tenant names (NamedEntity), with a length bound for routes the service stores.
TENANT_NAME = re.compile(r"[-=:.\w]{1,255}")


class BodyLimit:
    """ASGI middleware: 413 for a request whose body (declared or streamed) exceeds `limit` bytes."""

    def __init__(self, app: Any, limit: int = MAX_BODY_BYTES) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._refuse(send)
            return
        if declared is not None or scope["method"] in ("GET", "HEAD"):
            await self.app(scope, receive, send)  # a declared length within the limit is enforced by the server
            return
        # A streamed body: read it here, up to the limit (bodies are small), then hand it on whole.
        chunks, seen, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunks.append(message.get("body", b""))
            seen += len(chunks[-1])
            if seen > self.limit:
                await self._refuse(send)
                return
            more = message.get("more_body", False)
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Any) -> None:
        body = json.dumps({"reason": f"request body larger than {self.limit} bytes"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class RouteChange(BaseModel):
    cluster: str
    reason: str = Field(default="", max_length=1000)
    actor: str = Field(default="api", max_length=255)
    release: bool = True  # a flip answers the tenant's parked lookups at once


class HoldChange(BaseModel):
    reason: str = Field(default="", max_length=1000)
    actor: str = Field(default="api", max_length=255)


class Router:
    """Routes and holds in memory, written through to the store; the parked requests' events."""

    def __init__(self, config: LookupConfig, store: RouteStore) -> None:
        self.config = config
        self.store = store
        self.routes = {tenant: route.cluster for tenant, route in store.all().items()}
        self.holds: dict[str, asyncio.Event] = {tenant: asyncio.Event() for tenant in store.held()}
        # Bumped by every hold, release and route change of a tenant: a lookup forwarded under an older one may
        # carry the cluster a switch just fenced, and is asked again (see forward).
        self.generations: dict[str, int] = {}
        self.closing = False  # set at shutdown: parked requests are answered 503 instead of forwarded

    def cluster_of(self, tenant: str) -> str:
        return self.routes.get(tenant, self.config.default_cluster)

    def generation(self, tenant: str) -> int:
        return self.generations.get(tenant, 0)

    def _changed(self, tenant: str) -> None:
        self.generations[tenant] = self.generation(tenant) + 1

    def set_route(self, tenant: str, change: RouteChange) -> tuple[Route, str | None]:
        route, before = self.store.set(tenant, change.cluster, actor=change.actor, reason=change.reason)
        self.routes[tenant] = change.cluster
        self._changed(tenant)
        return route, before

    def delete_route(self, tenant: str, actor: str, reason: str) -> str | None:
        before = self.store.delete(tenant, actor=actor, reason=reason)
        self.routes.pop(tenant, None)
        self._changed(tenant)
        return before

    def close_parked(self) -> None:
        """At shutdown: every parked request is answered (503) now, not forwarded, and none parks any more."""
        self.closing = True
        for event in self.holds.values():
            event.set()

    async def wait_released(self, tenant: str, metrics: Metrics) -> bool:
        """False: answer 503 (the hold outlasted hold_timeout_s, or the service is stopping)."""
        if self.closing:
            return False
        event = self.holds.get(tenant)
        if event is None:
            return True
        metrics.parked += 1
        metrics.parked_total += 1
        started = time.monotonic()
        try:
            await asyncio.wait_for(event.wait(), self.config.hold_timeout_s)
            return not self.closing
        except TimeoutError:
            metrics.hold_timeouts_total += 1
            return False
        finally:
            metrics.parked -= 1
            metrics.park_seconds.observe(time.monotonic() - started)

    def hold(self, tenant: str, change: HoldChange) -> bool:
        self.store.set_hold(tenant, True, cluster=self.cluster_of(tenant), actor=change.actor, reason=change.reason)
        self._changed(tenant)
        if tenant in self.holds:
            return False
        self.holds[tenant] = asyncio.Event()
        log.info("tenant %s held by %s: %s", tenant, change.actor, change.reason)
        return True

    def release(self, tenant: str, actor: str, reason: str) -> bool:
        self.store.set_hold(tenant, False, cluster=self.cluster_of(tenant), actor=actor, reason=reason)
        self._changed(tenant)
        event = self.holds.pop(tenant, None)
        if event is None:
            return False
        event.set()
        log.info("tenant %s released by %s (to %s): %s", tenant, actor, self.cluster_of(tenant), reason)
        return True


def answer_parked_soon(app: FastAPI) -> None:
    """From a signal handler: the parked requests are answered (503) on the event loop. Without this, uvicorn's
    graceful shutdown waits its few seconds for them and then cancels them (a bare 500) before the app's own
    shutdown runs."""
    router, loop = getattr(app.state, "router", None), getattr(app.state, "loop", None)
    if router is not None and loop is not None:
        loop.call_soon_threadsafe(router.close_parked)


async def get_following(http: httpx.AsyncClient, url: str, headers: dict[str, str]) -> httpx.Response:
    """GET, following a broker's redirects to the topic's owner with the same headers: httpx drops the
    Authorization header on a redirect to another host or port, and on a cluster of several brokers every lookup
    of a topic the forwarded-to broker does not own is one (the owner then answered 401)."""
    resp = await http.get(url, headers=headers)
    for _ in range(MAX_REDIRECTS):
        if not resp.is_redirect or "location" not in resp.headers:
            break
        target = resp.url.join(resp.headers["location"])
        if not token_may_follow(str(resp.url), str(target)):
            break  # the client gets the redirect
        resp = await http.get(target, headers=headers)
    return resp


def create_app(config: LookupConfig, store: RouteStore | None = None) -> FastAPI:
    """The service; `store` defaults to one on `config.database_url` (closed at shutdown)."""
    admin_token = config.admin_token()
    for cluster in config.clusters.values():
        cluster.token()  # a missing cluster token variable stops the start, not the first lookup
    own_store = store is None
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        route_store = store or RouteStore(config.database_url)
        app.state.router = Router(config, route_store)
        app.state.loop = asyncio.get_running_loop()
        # One forwarding client per cluster: each trusts its own authority and shows its own certificate.
        app.state.http = {name: httpx.AsyncClient(follow_redirects=False, timeout=config.forward_timeout_s,
                                                  verify=cluster.ssl_context(),
                                                  limits=httpx.Limits(max_connections=200,
                                                                      max_keepalive_connections=50))
                          for name, cluster in config.clusters.items()}
        log.info("lookup service: %d route(s), %d held, default cluster %s, clusters %s",
                 len(app.state.router.routes), len(app.state.router.holds), config.default_cluster,
                 sorted(config.clusters))
        try:
            yield
        finally:
            app.state.router.close_parked()  # (already done at the signal when served by __main__)
            for client in app.state.http.values():
                await client.aclose()
            if own_store:
                route_store.close()

    app = FastAPI(title="Pulsar tenant lookup service", lifespan=lifespan, docs_url="/api/docs",
                  openapi_url="/api/openapi.json")
    app.add_middleware(BodyLimit)

    def router_of(request: Request) -> Router:
        return request.app.state.router

    def require_token(request: Request) -> None:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), admin_token.encode()):
            metrics.unauthorized_total += 1
            raise HTTPException(401, "missing or wrong admin token", headers={"WWW-Authenticate": "Bearer"})
        tenant = request.path_params.get("tenant")
        if tenant is not None and not TENANT_NAME.fullmatch(tenant):
            raise HTTPException(400, "tenant must be a Pulsar tenant name: 1-255 of letters, digits, - = : . _")

    # -- what clients ask ------------------------------------------------------------------------

    async def forward(request: Request, tenant: str, kind: str) -> Response:
        router = router_of(request)
        started = time.monotonic()
        for _ in range(MAX_REROUTES):
            if not await router.wait_released(tenant, metrics):
                if router.closing:
                    return JSONResponse({"reason": "the lookup service is stopping"}, status_code=503)
                return JSONResponse({"reason": f"tenant {tenant} is held for a cluster switch longer than "
                                               f"{config.hold_timeout_s:.0f}s"}, status_code=503)
            generation = router.generation(tenant)
            answer = await forward_once(request, config.clusters[router.cluster_of(tenant)], kind, started,
                                        lambda generation=generation: router.generation(tenant) != generation)
            if answer is not None:
                return answer
            # A hold or a route change came while this request was out: its answer may name the cluster a switch
            # has just fenced (a client connecting there after the quiet check would publish where nothing is
            # copied any more), so it parks or is routed again instead.
            metrics.rerouted_total += 1
        return JSONResponse({"reason": f"tenant {tenant}'s route changed {MAX_REROUTES} times while its request "
                                       "was forwarded"}, status_code=503)

    async def forward_once(request: Request, cluster: ClusterTarget, kind: str, started: float,
                           stale: Callable[[], bool]) -> Response | None:
        """The request forwarded to `cluster`; None when `stale()` turned true meanwhile (the answer is dropped)."""
        raw_path = request.scope.get("raw_path") or request.url.path.encode()
        url = cluster.http_url + raw_path.decode("latin-1")
        if request.url.query:
            url += "?" + request.url.query
        headers = {"Accept": "application/json"}
        # The client's own credentials, when it sent any: the cluster then authorizes the lookup as that
        # role, so routing through this service never widens what a client may see. The service's token
        # for the cluster serves clients that send none.
        client_auth = request.headers.get("authorization")
        try:
            # Off the event loop: a token file may be read again, an OAuth2 issuer asked (once per token life).
            token = None if client_auth or not cluster.has_token else await asyncio.to_thread(cluster.token)
        except ConfigError as exc:
            return JSONResponse({"reason": str(exc)}, status_code=502)
        if client_auth:
            headers["Authorization"] = client_auth
        elif token:
            headers["Authorization"] = f"Bearer {token}"
        http = request.app.state.http[cluster.name]
        try:
            resp = await get_following(http, url, headers)
            # An unload or a bundle move makes the broker answer 5xx for a moment: retried here, with a short
            # backoff, rather than handed to a client that would back off for seconds.
            delay, give_up = TRANSIENT_RETRY_FIRST_S, time.monotonic() + config.transient_retry_s
            while resp.status_code in TRANSIENT_STATUS and time.monotonic() + delay < give_up and not stale():
                metrics.transient_retries_total += 1
                await asyncio.sleep(delay)
                delay = min(delay * 2, TRANSIENT_RETRY_MAX_S)
                resp = await get_following(http, url, headers)
        except httpx.HTTPError as exc:
            if stale():
                return None
            metrics.forward_errors_total += 1
            return JSONResponse({"reason": f"cluster {cluster.name} is unreachable: {type(exc).__name__}"},
                                status_code=502)
        if stale():
            return None
        metrics.count(kind, cluster.name, resp.status_code, time.monotonic() - started)
        if kind == "lookup" and resp.status_code == 200:
            body = resp.json()
            body.setdefault("brokerUrl", "")
            body["brokerUrlTls"] = body.get("brokerUrlTls") or ""  # the C++ client needs both keys
            return JSONResponse(body)
        # A redirect not followed here (to plain http from https, or past MAX_REDIRECTS) keeps its Location.
        passed = {"location": resp.headers["location"]} if resp.is_redirect and "location" in resp.headers else None
        return Response(resp.content, status_code=resp.status_code, headers=passed,
                        media_type=resp.headers.get("content-type", "application/json"))

    @app.get("/lookup/v2/topic/{domain}/{tenant}/{namespace}/{topic:path}", include_in_schema=False)
    async def lookup(request: Request, domain: str, tenant: str, namespace: str, topic: str) -> Response:
        return await forward(request, tenant, "lookup")

    @app.get("/admin/v2/namespaces/{tenant}/{namespace}/topics", include_in_schema=False)
    async def namespace_topics(request: Request, tenant: str, namespace: str) -> Response:
        return await forward(request, tenant, "topics")

    @app.get("/admin/v2/schemas/{tenant}/{namespace}/{topic}/schema", include_in_schema=False)
    async def schema(request: Request, tenant: str, namespace: str, topic: str) -> Response:
        return await forward(request, tenant, "schema")

    @app.get("/admin/v2/schemas/{tenant}/{namespace}/{topic}/schema/{version}", include_in_schema=False)
    async def schema_version(request: Request, tenant: str, namespace: str, topic: str, version: str) -> Response:
        return await forward(request, tenant, "schema")

    @app.get("/admin/v2/{domain}/{tenant}/{namespace}/{topic}/partitions", include_in_schema=False)
    async def partitions(request: Request, domain: str, tenant: str, namespace: str, topic: str) -> Response:
        if domain not in DOMAINS:
            raise HTTPException(404, f"unknown topic domain {domain}")
        return await forward(request, tenant, "partitions")

    # -- operations ------------------------------------------------------------------------------

    @app.get("/health")
    async def health(request: Request) -> dict[str, Any]:
        router = router_of(request)
        return {"status": "ok", "routes": len(router.routes), "held": sorted(router.holds),
                "default_cluster": config.default_cluster, "clusters": sorted(config.clusters)}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus(request: Request) -> str:
        return metrics.render(held_tenants=len(router_of(request).holds))

    auth = [Depends(require_token)]

    @app.get("/api/v1/routes", dependencies=auth)
    async def list_routes(request: Request) -> dict[str, Any]:
        router = router_of(request)
        return {"default_cluster": config.default_cluster, "held": sorted(router.holds),
                "routes": [asdict(r) for r in router.store.all().values()]}

    @app.get("/api/v1/routes/{tenant}", dependencies=auth)
    async def get_route(request: Request, tenant: str) -> dict[str, Any]:
        router = router_of(request)
        route = router.store.get(tenant)
        return {"tenant": tenant, "cluster": router.cluster_of(tenant), "default": route is None,
                "held": tenant in router.holds, "route": asdict(route) if route else None}

    @app.put("/api/v1/routes/{tenant}", dependencies=auth)
    async def set_route(request: Request, tenant: str, change: RouteChange) -> dict[str, Any]:
        if change.cluster not in config.clusters:
            raise HTTPException(400, f"unknown cluster {change.cluster!r}; known: {sorted(config.clusters)}")
        router = router_of(request)
        route, before = router.set_route(tenant, change)
        log.info("route %s: %s -> %s by %s: %s", tenant, before, change.cluster, change.actor, change.reason)
        released = change.release and tenant in router.holds and router.release(
            tenant, change.actor, f"route set to {change.cluster}")
        return {"route": asdict(route), "before": before, "released": released}

    @app.delete("/api/v1/routes/{tenant}", dependencies=auth)
    async def delete_route(request: Request, tenant: str, actor: str = "api", reason: str = "") -> dict[str, Any]:
        router = router_of(request)
        before = router.delete_route(tenant, actor, reason)
        return {"tenant": tenant, "before": before, "cluster": router.cluster_of(tenant)}

    @app.post("/api/v1/routes/{tenant}/hold", dependencies=auth)
    async def hold(request: Request, tenant: str, change: HoldChange) -> dict[str, Any]:
        changed = router_of(request).hold(tenant, change)
        return {"tenant": tenant, "held": True, "changed": changed}

    @app.post("/api/v1/routes/{tenant}/release", dependencies=auth)
    async def release(request: Request, tenant: str, change: HoldChange) -> dict[str, Any]:
        changed = router_of(request).release(tenant, change.actor, change.reason)
        return {"tenant": tenant, "held": False, "changed": changed}

    @app.get("/api/v1/routes/{tenant}/history", dependencies=auth)
    async def history(request: Request, tenant: str, limit: int = 100) -> dict[str, Any]:
        return {"tenant": tenant, "events": [asdict(e) for e in router_of(request).store.history(tenant, limit)]}

    return app
