"""A fault-injecting TCP proxy on loopback: slow and broken connections between a job and a cluster.

    python -m localdev.faulty_proxy --listen 18083 --upstream 8083 [--latency-ms 20] [--delay-ms 25]
        [--cut-every-s 2]

Each accepted connection is forwarded to the upstream port by two pump threads. Faults:

* latency: every chunk read from either side is held `latency_s` before it is written on (a slow link,
  felt most by request/response traffic such as admin calls and lookups: it also bounds throughput, one
  chunk per `latency_s` each way);
* delay: every chunk is written on `delay_s` after it was read, chunks in flight meanwhile (a far link: the
  round trip grows by twice `delay_s`, the bandwidth does not shrink);
* cuts: `cut_all()` resets every open connection at once (an RST to both ends, as when a load balancer or
  NAT drops its table), `cutting(every_s)` does so periodically from a background thread;
* refusal: while `refusing` is set, each new connection is reset as soon as it is accepted (a cluster
  that is down behind a listener that still answers).

Counters (accepted, cut, refused, forwarded bytes) let a test show that its faults really happened.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import queue
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

CHUNK = 64 * 1024
HOST = "127.0.0.1"


@dataclass
class ProxyCounters:
    accepted: int = 0
    cut: int = 0
    refused: int = 0
    forwarded_bytes: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, name: str, n: int = 1) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + n)

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return {"accepted": self.accepted, "cut": self.cut, "refused": self.refused,
                    "forwarded_bytes": self.forwarded_bytes}


def _reset(sock: socket.socket) -> None:
    """Closes `sock` with an RST (linger 0) and wakes a thread blocked reading it."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)  # a blocked recv() returns; nothing is sent to the peer yet
    with contextlib.suppress(OSError):
        sock.close()


class FaultyProxy:
    """Forwards 127.0.0.1:`listen_port` to 127.0.0.1:`upstream_port` with injectable faults."""

    def __init__(self, listen_port: int, upstream_port: int, *, latency_s: float = 0.0, delay_s: float = 0.0) -> None:
        self.listen_port = listen_port
        self.upstream_port = upstream_port
        self.latency_s = latency_s
        self.delay_s = delay_s
        self.refusing = False
        self.counters = ProxyCounters()
        self._pumps: dict[tuple[socket.socket, socket.socket], int] = {}  # open pair -> live pumps
        self._lock = threading.Lock()
        self._server: socket.socket | None = None
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> FaultyProxy:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((HOST, self.listen_port))
        server.listen(128)
        server.settimeout(0.2)  # the accept loop notices stop() within this
        self._server = server
        self._spawn(self._accept_loop, f"proxy-accept-{self.listen_port}")
        log.info("proxy %d -> %d up (latency %.0f ms, delay %.0f ms)", self.listen_port, self.upstream_port,
                 self.latency_s * 1000, self.delay_s * 1000)
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._server is not None:
            self._server.close()
        self.cut_all(count=False)
        for thread in self._threads:
            thread.join(5)

    def __enter__(self) -> FaultyProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- faults ------------------------------------------------------------------------------------

    def cut_all(self, *, count: bool = True) -> int:
        """Resets every open connection; returns how many."""
        with self._lock:
            pairs = list(self._pumps)
            self._pumps.clear()
        for client, upstream in pairs:
            _reset(client)
            _reset(upstream)
        if count and pairs:
            self.counters.add("cut", len(pairs))
        return len(pairs)

    @contextlib.contextmanager
    def cutting(self, every_s: float) -> Iterator[None]:
        """Cuts all open connections every `every_s` seconds while the block runs."""
        done = threading.Event()

        def loop() -> None:
            while not done.wait(every_s):
                n = self.cut_all()
                log.info("proxy %d: cut %d connections", self.listen_port, n)

        thread = threading.Thread(target=loop, name=f"proxy-cutter-{self.listen_port}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join(every_s + 5)

    # -- forwarding --------------------------------------------------------------------------------

    def _spawn(self, target: object, name: str, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)  # type: ignore[arg-type]
        thread.start()
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]

    def _accept_loop(self) -> None:
        assert self._server is not None
        while not self._stopped.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed by stop()
            client.settimeout(None)
            self.counters.add("accepted")
            if self.refusing:
                self.counters.add("refused")
                _reset(client)
                continue
            try:
                upstream = socket.create_connection((HOST, self.upstream_port), timeout=5)
                upstream.settimeout(None)
            except OSError:
                _reset(client)  # the upstream is down: the client sees what it would see without the proxy
                continue
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pair = (client, upstream)
            with self._lock:
                self._pumps[pair] = 2
            self._spawn(self._pump, f"proxy-up-{self.listen_port}", client, upstream, pair)
            self._spawn(self._pump, f"proxy-down-{self.listen_port}", upstream, client, pair)

    def _pump(self, src: socket.socket, dst: socket.socket, pair: tuple[socket.socket, socket.socket]) -> None:
        line = _DelayLine(dst, self.delay_s, f"proxy-delay-{self.listen_port}") if self.delay_s else None
        try:
            while data := src.recv(CHUNK):
                if self.latency_s:
                    time.sleep(self.latency_s)
                if line is not None:
                    line.put(data)
                else:
                    dst.sendall(data)
                self.counters.add("forwarded_bytes", len(data))
            if line is not None:
                line.close()  # what is in flight arrives, then the orderly close
            else:
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)  # pass the orderly close on
        except OSError:  # one side reset, or cut_all() closed both: reset the other side too
            if line is not None:
                line.abandon()
            with self._lock:
                self._pumps.pop(pair, None)
            _reset(src)
            _reset(dst)
            return
        with self._lock:  # the second pump to finish closes the pair
            left = self._pumps.get(pair, 0) - 1
            if left > 0:
                self._pumps[pair] = left
            else:
                self._pumps.pop(pair, None)
        if left <= 0:
            for sock in pair:
                with contextlib.suppress(OSError):
                    sock.close()


class _DelayLine:
    """Writes each chunk to `dst` `delay_s` after it was put, in order, from a thread of its own; at most
    DELAY_LINE_CHUNKS in flight (then put() waits: the sender feels the far side's backpressure)."""

    STOP = b""

    def __init__(self, dst: socket.socket, delay_s: float, name: str) -> None:
        self.dst = dst
        self.delay_s = delay_s
        self.chunks: queue.Queue[tuple[float, bytes | None]] = queue.Queue(DELAY_LINE_CHUNKS)
        self.error: OSError | None = None
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def put(self, data: bytes) -> None:
        if self.error is not None:
            raise self.error
        self.chunks.put((time.monotonic() + self.delay_s, data))

    def close(self) -> None:
        """Delivers what is in flight, then shuts `dst` for writing; raises what a write met."""
        self.chunks.put((time.monotonic() + self.delay_s, None))
        self.thread.join()
        if self.error is not None:
            raise self.error

    def abandon(self) -> None:
        with contextlib.suppress(queue.Full):
            self.chunks.put_nowait((0.0, self.STOP))

    def _run(self) -> None:
        while True:
            due, data = self.chunks.get()
            if data == self.STOP:
                return
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                if data is None:
                    with contextlib.suppress(OSError):
                        self.dst.shutdown(socket.SHUT_WR)
                    return
                self.dst.sendall(data)
            except OSError as exc:
                self.error = exc
                return


DELAY_LINE_CHUNKS = 512  # up to 32 MiB in flight each way


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localdev.faulty_proxy", description=__doc__.split("\n")[0])
    parser.add_argument("--listen", type=int, required=True, help="port to listen on (127.0.0.1)")
    parser.add_argument("--upstream", type=int, required=True, help="port to forward to (127.0.0.1)")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="hold each chunk this long")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="deliver each chunk this long after it came")
    parser.add_argument("--cut-every-s", type=float, default=0.0, help="reset all connections this often")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        proxy = FaultyProxy(args.listen, args.upstream, latency_s=args.latency_ms / 1000,
                            delay_s=args.delay_ms / 1000).start()
    except OSError as exc:
        print(f"error: cannot listen on {HOST}:{args.listen}: {exc.strerror}", file=sys.stderr)
        return 1
    try:
        with proxy.cutting(args.cut_every_s) if args.cut_every_s > 0 else contextlib.nullcontext():
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    finally:
        proxy.stop()


if __name__ == "__main__":
    raise SystemExit(main())
