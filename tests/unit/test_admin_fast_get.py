"""The admin client's plain GETs go over a kept-alive http.client connection; anything but a 2xx answer
takes the full `requests` path (retries, redirects, typed errors). Against a real local HTTP server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from pulsar_migration.admin import NotFound, PulsarAdmin


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as Pulsar's Jetty
    seen: list[tuple[str, str]] = []

    def do_GET(self) -> None:
        self.seen.append((self.path, self.headers.get("User-Agent", "")))
        if self.path.endswith("/json"):
            self._answer(200, json.dumps({"ok": 1}).encode(), "application/json")
        elif self.path.endswith("/text"):
            self._answer(200, "h\u00e9".encode("latin-1"), "text/plain; charset=ISO-8859-1")
        elif self.path.endswith("/missing"):
            self._answer(404, b'{"reason": "Topic not found"}', "application/json")
        elif self.path.endswith("/moved"):
            self.send_response(307)
            self.send_header("Location", "/admin/v2/x/json")
            self.send_header("Content-Length", "0")
            self.end_headers()

    def _answer(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    _Handler.seen.clear()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def _via_requests() -> int:
    return sum(1 for _, agent in _Handler.seen if agent.startswith("python-requests"))


def test_a_plain_get_answers_json_without_requests(server: str) -> None:
    admin = PulsarAdmin(server, name="local")
    try:
        assert admin.get("/x/json") == {"ok": 1}
        assert admin.get("/x/json") == {"ok": 1}
        assert _via_requests() == 0 and len(_Handler.seen) == 2
        assert admin.get("/x/text") == "h\u00e9"  # the charset the server named
        assert admin.get("/x/json", expect_json=False) == b'{"ok": 1}'
    finally:
        admin.close()


def test_errors_and_redirects_take_the_full_path(server: str) -> None:
    admin = PulsarAdmin(server, name="local", retries=0)
    try:
        with pytest.raises(NotFound, match="Topic not found"):
            admin.get("/x/missing")
        assert admin.get("/x/moved") == {"ok": 1}  # requests follows the broker's redirect
        assert _via_requests() >= 2
    finally:
        admin.close()
