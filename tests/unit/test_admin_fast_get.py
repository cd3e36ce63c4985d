"""The admin client's calls go over a kept-alive http.client connection first: a 2xx answer is the result and a
final error status its typed error; a retryable status, a redirect or no answer take the full `requests` path
(retries, redirects). Against a real local HTTP server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from pulsar_migration.admin import AdminError, Conflict, NotFound, PulsarAdmin


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

    def do_POST(self) -> None:
        self.seen.append((self.path, self.headers.get("User-Agent", "")))
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path.endswith("/echo"):
            echoed = {"body": json.loads(body) if body else None, "type": self.headers.get("Content-Type")}
            self._answer(200, json.dumps(echoed).encode(), "application/json")
        elif self.path.endswith("/conflict"):
            self._answer(409, b'{"reason": "This topic already exists"}', "application/json")
        elif self.path.endswith("/busy"):
            self._answer(503, b'{"reason": "busy"}', "application/json")

    do_PUT = do_POST

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


def test_writes_send_json_and_final_errors_are_typed_without_a_second_send(server: str) -> None:
    admin = PulsarAdmin(server, name="local", retries=0)
    try:
        assert admin.post("/x/echo", {"ledgerId": 3, "entryId": 0}) == {
            "body": {"ledgerId": 3, "entryId": 0}, "type": "application/json"}
        assert admin.put("/x/echo") == {"body": None, "type": None}
        assert admin.post("/x/echo", True)["body"] is True
        with pytest.raises(Conflict, match="already exists"):
            admin.put("/x/conflict")
        assert [path for path, _ in _Handler.seen].count("/admin/v2/x/conflict") == 1  # not sent again
        assert _via_requests() == 0
    finally:
        admin.close()


def test_a_retryable_answer_to_a_write_takes_the_full_path(server: str) -> None:
    admin = PulsarAdmin(server, name="local", retries=0)
    try:
        with pytest.raises(AdminError, match="503"):
            admin.post("/x/busy", {"a": 1})
        assert _via_requests() == 1  # the full path asked once more, with its own retry policy
    finally:
        admin.close()
