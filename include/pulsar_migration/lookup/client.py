"""A small client of the lookup service's admin API, for the switch step and the DAG (requests, bearer token)."""

from __future__ import annotations

from typing import Any

import requests

from pulsar_migration.admin import tls_failure


class LookupServiceError(RuntimeError):
    """The lookup service refused a call or could not be reached (one line)."""


class LookupAdmin:
    def __init__(self, url: str, token: str | None, *, timeout_s: float = 30.0, verify: bool | str = True) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        # Passed with every request: REQUESTS_CA_BUNDLE in the environment would win over a session's own.
        self.verify = verify
        self._session = requests.Session()
        if token:
            self._session.headers["Authorization"] = f"Bearer {token}"

    def close(self) -> None:
        self._session.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            resp = self._session.request(method, self.url + path, timeout=self.timeout_s, verify=self.verify,
                                         **kwargs)
        except requests.RequestException as exc:
            tls = tls_failure(exc, "lookup", "lookup service") if isinstance(exc, requests.exceptions.SSLError) \
                else None
            raise LookupServiceError(f"TLS handshake with the lookup service at {self.url} failed: {tls}" if tls else
                                     f"lookup service at {self.url} is unreachable: {type(exc).__name__}") from None
        if resp.status_code == 401:
            raise LookupServiceError(f"lookup service at {self.url} refused the admin token (HTTP 401)")
        if resp.status_code >= 300:
            raise LookupServiceError(f"{method} {path} on the lookup service failed with HTTP {resp.status_code}: "
                                     f"{resp.text[:300]}")
        return resp.json()

    def health(self) -> dict[str, Any]:
        return dict(self._call("GET", "/health"))

    def route(self, tenant: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/api/v1/routes/{tenant}"))

    def set_route(self, tenant: str, cluster: str, *, reason: str, actor: str = "pulsar-migration",
                  release: bool = True) -> dict[str, Any]:
        return dict(self._call("PUT", f"/api/v1/routes/{tenant}", json={"cluster": cluster, "reason": reason,
                                                                        "actor": actor, "release": release}))

    def hold(self, tenant: str, *, reason: str, actor: str = "pulsar-migration") -> dict[str, Any]:
        return dict(self._call("POST", f"/api/v1/routes/{tenant}/hold", json={"reason": reason, "actor": actor}))

    def release(self, tenant: str, *, reason: str, actor: str = "pulsar-migration") -> dict[str, Any]:
        return dict(self._call("POST", f"/api/v1/routes/{tenant}/release", json={"reason": reason, "actor": actor}))
