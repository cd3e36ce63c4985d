"""KeepAliveGetter against a small local HTTP server: 2xx answers over one kept connection per thread, the
token header sent, None for everything the admin client's full path must judge, a closed connection healed."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from pulsar_migration import admin as admin_module
from pulsar_migration.admin import ClusterUnreachable, EntryUnanswered, NotFound, PulsarAdmin
from pulsar_migration.keepalive_get import KeepAliveGetter


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    peers: set[int] = set()
    auth_seen: list[str | None] = []

    def do_GET(self) -> None:
        Handler.peers.add(self.client_address[1])
        Handler.auth_seen.append(self.headers.get("Authorization"))
        path = self.path.split("?", 1)[0]  # a redirect to the owner adds ?authoritative=true
        if path.endswith("/missing") or "/ledger/404/" in path:
            self._answer(404, b'{"reason": "Message not found"}')
        elif path.endswith("/lastMessageId"):
            self._answer(200, b'{"ledgerId": 7, "entryId": 1}')
        elif "/ledger/7/entry/1" in path:
            time.sleep(1.5)  # never in time (a broker's open request)
            self._answer(200, b"late")
        elif path.endswith("/close"):
            self._answer(200, b"bye", close=True)
        else:
            self._answer(200, b"payload", extra={"X-Pulsar-deliver-at-time": "2026-01-01T00:00:00Z"})

    def _answer(self, status: int, body: bytes, close: bool = False, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Type", "application/json")
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    Handler.peers.clear()
    Handler.auth_seen.clear()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_answers_come_over_one_kept_connection_with_the_token(server: str) -> None:
    getter = KeepAliveGetter(server, {"Authorization": "Bearer t0k"}, timeout_s=5)
    for _ in range(20):
        status, headers, body = getter.get("/admin/v2/entry") or (0, {}, b"")
        assert status == 200 and body == b"payload" and headers["X-Pulsar-deliver-at-time"].startswith("2026")
    assert len(Handler.peers) == 1 and set(Handler.auth_seen) == {"Bearer t0k"}
    getter.close()


def test_each_thread_keeps_its_own_connection(server: str) -> None:
    getter = KeepAliveGetter(server, {}, timeout_s=5)
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: getter.get("/e"), range(200)))
    assert all(a is not None and a[0] == 200 for a in answers)
    assert 1 <= len(Handler.peers) <= 4
    getter.close()


def test_an_error_status_or_no_server_is_left_to_the_caller(server: str) -> None:
    getter = KeepAliveGetter(server, {}, timeout_s=5)
    assert getter.get("/missing") is None
    assert getter.get("/e") is not None  # the connection survives an error answer
    assert KeepAliveGetter("http://127.0.0.1:9", {}, timeout_s=2).get("/e") is None


def test_a_connection_the_server_closes_is_opened_again(server: str) -> None:
    getter = KeepAliveGetter(server, {}, timeout_s=5)
    assert getter.get("/close") is not None
    assert getter.get("/e") is not None and getter.get("/e") is not None
    assert len(Handler.peers) == 2


def test_the_admin_client_raises_its_typed_error_for_what_the_getter_leaves(server: str) -> None:
    admin = PulsarAdmin(server, name="cluster-x", retries=0)
    assert admin.entry_headers("persistent://t/ns/topic", 1, 2) == {"X-Pulsar-deliver-at-time": "2026-01-01T00:00:00Z"}
    with pytest.raises(NotFound, match=r"cluster-x.*HTTP 404: Message not found"):
        admin.entry_headers("persistent://t/ns/topic", 404, 0)
    admin.close()


def test_an_entry_the_broker_never_answers_for_is_unanswered_once_and_not_asked_again(
    server: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pulsar 4.0.8 leaves the read of a compressed chunk's entry open: 5 s (here 0.3 s), no retries, while the
    broker answers for the topic; then not asked again. A broker that does not answer at all is unreachable."""
    monkeypatch.setattr(admin_module, "ENTRY_ANSWER_S", 0.3)
    admin = PulsarAdmin(server, name="cluster-x", retries=0)
    started = time.monotonic()
    with pytest.raises(EntryUnanswered, match=r"cluster-x does not show entry 7:1 of persistent://t/ns/topic"):
        admin.entry_headers("persistent://t/ns/topic", 7, 1)
    assert time.monotonic() - started < 3
    asked = len(Handler.auth_seen)
    with pytest.raises(EntryUnanswered):
        admin.entry_headers("persistent://t/ns/topic", 7, 1)
    assert len(Handler.auth_seen) == asked  # not asked again
    assert admin.entry_headers("persistent://t/ns/topic", 7, 0)  # other entries are
    admin.close()
    down = PulsarAdmin("http://127.0.0.1:9", name="cluster-y", retries=0)
    with pytest.raises(ClusterUnreachable):
        down.entry_headers("persistent://t/ns/topic", 7, 1)
