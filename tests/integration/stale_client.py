"""A producer that reaches a broker without asking the lookup service, once: what a client does whose lookup
was answered just before the switch's hold and whose connection arrives after the fence.

It speaks just enough of Pulsar's binary protocol (CONNECT, PRODUCER, PING/PONG; PulsarApi.proto) to hold a
producer open on a topic. Unlike the Java, C++ and Python clients it never reconnects: when the broker closes
its producer (an unload) it stays closed, as a real client would once its next lookup is parked by the hold.
The broker is real; only the client is this small.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

CONNECT, CONNECTED, PRODUCER, ERROR, CLOSE_PRODUCER, PRODUCER_SUCCESS, PING, PONG = 2, 3, 5, 14, 15, 17, 18, 19
PROTOCOL_VERSION = 12


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, value: int | bytes) -> bytes:
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def _command(kind: int, body: bytes) -> bytes:
    """One frame: total size, command size, BaseCommand{type, <the command's own field = kind>}."""
    cmd = _field(1, kind) + _field(kind, body)
    return struct.pack(">II", 4 + len(cmd), len(cmd)) + cmd


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def _type_of(cmd: bytes) -> int:
    key, at = _read_varint(cmd, 0)
    assert key == 1 << 3, f"BaseCommand does not start with its type: {cmd[:8]!r}"
    return _read_varint(cmd, at)[0]


class StaleProducer:
    """Connects straight to `host:port` and opens producer `name` on `topic`; `received` lists the command
    types the broker sent (CLOSE_PRODUCER when an unload took the producer away)."""

    def __init__(self, host: str, port: int, topic: str, name: str) -> None:
        self.sock = socket.create_connection((host, port), timeout=10)
        self.received: list[int] = []
        self._lock = threading.Lock()
        self._send(_command(CONNECT, _field(1, b"stale-lookup-test") + _field(4, PROTOCOL_VERSION)))
        assert self._read() == CONNECTED, self.received
        self._send(_command(PRODUCER, _field(1, topic.encode()) + _field(2, 1) + _field(3, 1)
                            + _field(4, name.encode())))
        answer = self._read()
        assert answer == PRODUCER_SUCCESS, f"the broker refused the producer (command {answer})"
        self.sock.settimeout(None)
        self._reader = threading.Thread(target=self._serve, daemon=True)
        self._reader.start()

    def _send(self, frame: bytes) -> None:
        with self._lock:
            self.sock.sendall(frame)

    def _exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            data += chunk
        return data

    def _read(self) -> int:
        total, size = struct.unpack(">II", self._exactly(8))
        kind = _type_of(self._exactly(size))
        self._exactly(total - 4 - size)  # a payload (none expected here)
        self.received.append(kind)
        return kind

    def _serve(self) -> None:
        try:
            while True:
                if self._read() == PING:
                    self._send(_command(PONG, b""))
        except (ConnectionError, OSError):
            return

    def closed_by_broker(self, timeout_s: float = 0.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while CLOSE_PRODUCER not in self.received and time.monotonic() < deadline:
            time.sleep(0.05)
        return CLOSE_PRODUCER in self.received

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
