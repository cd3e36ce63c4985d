"""The admin client on a cluster of several brokers: the broker at the admin URL answers calls about topics it does
not own with a 307 to the owner. Against two local HTTP servers (the first redirects, the second is
test_keepalive_get's broker): the token goes along on every path, and an entry the owner never shows gives up
after ENTRY_ANSWER_S as on one broker (two real brokers: tests/integration/test_two_brokers.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from pulsar_migration import admin as admin_module
from pulsar_migration.admin import EntryUnanswered, PulsarAdmin

from tests.unit.test_keepalive_get import Handler as OwnerHandler


def serve(handler: type[BaseHTTPRequestHandler]) -> tuple[ThreadingHTTPServer, str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


@pytest.fixture
def first_broker() -> Iterator[str]:
    OwnerHandler.auth_seen.clear()
    owner, owner_url = serve(OwnerHandler)

    class Redirecting(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self.send_response(307)
            separator = "&" if "?" in self.path else "?"
            self.send_header("Location", f"{owner_url}{self.path}{separator}authoritative=true")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    first, first_url = serve(Redirecting)
    yield first_url
    for httpd in (first, owner):
        httpd.shutdown()
        httpd.server_close()


def test_the_token_follows_the_redirect_to_the_owner_on_both_paths(first_broker: str) -> None:
    admin = PulsarAdmin(first_broker, token="t0ken", name="cluster-x", retries=0)
    try:
        assert admin.get("/persistent/t/ns/topic/stats", expect_json=False) == b"payload"  # kept-alive, then full
        assert admin.get("/persistent/t/ns/topic/stats", params={"x": "1"}, expect_json=False) == b"payload"
        assert admin.entry_headers("persistent://t/ns/topic", 7, 0) == {
            "X-Pulsar-deliver-at-time": "2026-01-01T00:00:00Z"}
    finally:
        admin.close()
    assert OwnerHandler.auth_seen and set(OwnerHandler.auth_seen) == {"Bearer t0ken"}


def test_an_entry_the_owner_never_shows_gives_up_as_on_one_broker(first_broker: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admin_module, "ENTRY_ANSWER_S", 0.3)
    admin = PulsarAdmin(first_broker, token="t0ken", name="cluster-x", retries=0, timeout_s=30)
    started = time.monotonic()
    try:
        with pytest.raises(EntryUnanswered, match="cluster-x does not show entry 7:1"):
            admin.entry_headers("persistent://t/ns/topic", 7, 1)
    finally:
        admin.close()
    assert time.monotonic() - started < 5  # not the full path's 30 s


def test_schema_paths_quote_the_topic_name_twice() -> None:
    """Pulsar's schemas resource decodes the name twice: 'plus+sign' quoted once reads as 'plus sign'."""
    from pulsar_migration.admin import seg, seg_twice

    assert seg("plus+sign") == "plus%2Bsign" and seg_twice("plus+sign") == "plus%252Bsign"
    assert seg_twice("per%cent") == "per%2525cent" and seg_twice("plain-name") == "plain-name"


def test_cursors_are_matched_to_subscriptions_by_their_decoded_names() -> None:
    """internalStats lists cursors URL-encoded ('a+b' as 'a%2Bb', 'sp ace' as 'sp+ace'): each subscription still
    finds its cursor (matched by the stored name, such subscriptions were left out of the sync)."""
    from pulsar_migration.progress.cursors import cursor_states

    names = {"a+b": "a%2Bb", "sp ace": "sp+ace", "p%c": "p%25c", "plain": "plain",
             "заказы": "%D0%B7%D0%B0%D0%BA%D0%B0%D0%B7%D1%8B"}
    stats = {"subscriptions": {name: {"type": "Exclusive", "isDurable": True} for name in names}}
    internal = {"cursors": {stored: {"markDeletePosition": f"5:{i}", "individuallyDeletedMessages": "[]"}
                            for i, stored in enumerate(names.values())}}
    states = cursor_states("persistent://t/ns/x", stats, internal, 0)
    assert sorted(states) == sorted(names)
    assert [str(states[name].mark_delete) for name in names] == [f"5:{i}" for i in range(len(names))]
