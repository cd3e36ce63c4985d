"""The fault-injecting proxy itself, against a loopback echo server: it forwards, delays, cuts and refuses."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
from localdev.faulty_proxy import FaultyProxy


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def echo_port() -> Iterator[int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    port = int(server.getsockname()[1])

    def serve(conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(65536):
                    conn.sendall(data)
            except OSError:
                pass

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield port
    server.close()


def roundtrip(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        got = b""
        while data := s.recv(65536):
            got += data
        return got


def test_forwards_both_ways_and_passes_the_orderly_close_on(echo_port: int) -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB
    with FaultyProxy(free_port(), echo_port) as proxy:
        assert roundtrip(proxy.listen_port, payload) == payload
        assert proxy.counters.snapshot()["forwarded_bytes"] == 2 * len(payload)


def test_latency_holds_each_chunk(echo_port: int) -> None:
    with FaultyProxy(free_port(), echo_port, latency_s=0.1) as proxy:
        started = time.monotonic()
        assert roundtrip(proxy.listen_port, b"ping") == b"ping"
        assert time.monotonic() - started >= 0.2  # one chunk each way


def test_a_delay_line_holds_each_chunk_but_keeps_many_in_flight(echo_port: int) -> None:
    """delay_s: the round trip grows by twice the delay, but a stream of many chunks is not held one by one (as
    latency_s holds them): it arrives whole, in order, about one round trip late, and the close is passed on."""
    payload = bytes(range(256)) * 4096 * 4  # 4 MiB: 64 chunks or more each way
    with FaultyProxy(free_port(), echo_port, delay_s=0.05) as proxy:
        started = time.monotonic()
        assert roundtrip(proxy.listen_port, b"ping") == b"ping"
        assert time.monotonic() - started >= 0.1
        started = time.monotonic()
        assert roundtrip(proxy.listen_port, payload) == payload
        assert time.monotonic() - started < 64 * 0.05  # held one chunk at a time it would take 3.2 s each way


def test_cut_all_resets_open_connections(echo_port: int) -> None:
    with FaultyProxy(free_port(), echo_port) as proxy:
        s = socket.create_connection(("127.0.0.1", proxy.listen_port), timeout=5)
        s.sendall(b"x")
        assert s.recv(1) == b"x"
        assert proxy.cut_all() == 1
        # A send after the reset fails with ECONNRESET or, once the RST has been processed, EPIPE; or the read finds
        # the connection closed (seen once on a loaded host, clean clone of c3dce1a): each means cut, no echo.
        try:
            s.sendall(b"y")
            echoed = s.recv(1)
        except (ConnectionResetError, BrokenPipeError):
            echoed = b""
        assert echoed == b""
        s.close()
        assert proxy.counters.snapshot()["cut"] == 1
        assert roundtrip(proxy.listen_port, b"again") == b"again"  # new connections still pass


def test_refusing_resets_each_new_connection(echo_port: int) -> None:
    with FaultyProxy(free_port(), echo_port) as proxy:
        proxy.refusing = True
        with pytest.raises((ConnectionResetError, BrokenPipeError, OSError)):  # which one depends on timing
            roundtrip(proxy.listen_port, b"x")
        assert proxy.counters.snapshot()["refused"] == 1
