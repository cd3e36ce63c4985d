"""A local OAuth2 issuer for the authenticated pair: client credentials in, access tokens out.

It speaks what Pulsar's clients ask of an identity provider (`AuthenticationOAuth2` in Java, `AuthOauth2` in C++):
`GET /.well-known/openid-configuration` names the token endpoint; `POST /oauth/token` with
`grant_type=client_credentials`, `client_id` and `client_secret` (form-encoded) answers `access_token`,
`token_type` and `expires_in`. The access token is a JWT for the client's role signed with the local pair's
HS256 secret key (localdev.pulsar_auth), so the brokers take it as they take the tokens `bin/pulsar tokens`
makes: no broker setting changes. Loopback only; it counts what it issued and refused, per client, so a test
can tell that each client really ran the flow.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import psutil


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def hs256_token(key: bytes, subject: str, lifetime_s: float) -> str:
    """A JWT for `subject` expiring `lifetime_s` from now, signed HS256 with `key` (as `bin/pulsar tokens`)."""
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    claims = _b64(json.dumps({"sub": subject, "exp": int(time.time() + lifetime_s)}).encode())
    signature = hmac.new(key, f"{header}.{claims}".encode(), hashlib.sha256).digest()
    return f"{header}.{claims}.{_b64(signature)}"


def caller_group(client_port: int, server_port: int) -> int:
    """The process group of the local process whose socket at `client_port` talks to `server_port` (-1 unknown)."""
    try:
        connections = psutil.net_connections(kind="tcp")
    except psutil.Error:  # not allowed to see other processes' sockets here: unknown, the token still issued
        return -1
    for conn in connections:
        if conn.laddr and conn.laddr.port == client_port and conn.raddr and conn.raddr.port == server_port and conn.pid:
            with contextlib.suppress(ProcessLookupError):
                return os.getpgid(conn.pid)
    return -1


@dataclass
class Client:
    secret: str
    role: str


@dataclass
class LocalIssuer:
    """Issues tokens for registered clients; `lifetime_s` is each token's life (short ones test renewal)."""

    secret_key: Path
    lifetime_s: float = 3600.0
    clients: dict[str, Client] = field(default_factory=dict)
    issued: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)
    tokens: list[str] = field(default_factory=list)  # every access token issued, for tests that look for leaks
    # Per process group, the tokens issued to its processes (a local cluster's broker is a group of its own): tells
    # a broker's own exchanges from the tools'.
    callers: Counter[int] = field(default_factory=Counter)
    _server: ThreadingHTTPServer | None = None

    def add_client(self, client_id: str, secret: str, role: str, credentials_file: Path) -> Path:
        """Registers a client and writes its credentials file (Pulsar's key-file format, mode 0600)."""
        self.clients[client_id] = Client(secret, role)
        credentials_file.write_text(json.dumps({"type": "client_credentials", "client_id": client_id,
                                                "client_secret": secret}))
        credentials_file.chmod(0o600)
        return credentials_file

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/"

    def start(self) -> LocalIssuer:
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: Any) -> None:  # quiet: tests read the counters
                pass

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/.well-known/openid-configuration":
                    self._answer(200, {"issuer": issuer.url, "token_endpoint": issuer.url + "oauth/token",
                                       "grant_types_supported": ["client_credentials"]})
                else:
                    self._answer(404, {"error": "not_found"})

            def do_POST(self) -> None:
                if self.path != "/oauth/token":
                    self._answer(404, {"error": "not_found"})
                    return
                length = int(self.headers.get("Content-Length") or 0)
                form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
                client = issuer.clients.get(form.get("client_id", ""))
                if form.get("grant_type") != "client_credentials":
                    self._answer(400, {"error": "unsupported_grant_type"})
                    return
                if client is None or not hmac.compare_digest(client.secret, form.get("client_secret", "")):
                    issuer.refused[form.get("client_id", "")] += 1
                    self._answer(401, {"error": "invalid_client", "error_description": "unknown client or secret"})
                    return
                issuer.issued[form["client_id"]] += 1
                issuer.callers[caller_group(self.client_address[1], self.server.server_address[1])] += 1
                token = hs256_token(issuer.secret_key.read_bytes(), client.role, issuer.lifetime_s)
                issuer.tokens.append(token)
                self._answer(200, {"access_token": token, "token_type": "Bearer",
                                   "expires_in": int(issuer.lifetime_s)})

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True, name="oauth2-issuer").start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
