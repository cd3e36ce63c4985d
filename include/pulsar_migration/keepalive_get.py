"""GETs over one kept-alive `http.client` connection per thread, for the admin client's hottest read (the
copy's per-entry header lookup). Measured against a local broker: about 0.35 ms of client CPU per call where
`requests` spends about 2.1 ms, so the lookups stop being bound by the client's own CPU.

Only a 2xx answer is returned; anything else (no answer, an error status) is left to the caller's full path,
which retries and turns it into a typed error. The TLS context is at least as strict as `requests`' (the same
CA bundle, the same client certificate), so nothing this accepts would be refused there.
"""

from __future__ import annotations

import http.client
import logging
import ssl
import threading
import weakref
from urllib.parse import urlsplit

import requests.certs

log = logging.getLogger(__name__)


def tls_context(verify: bool | str, cert_file: str | None, key_file: str | None) -> ssl.SSLContext:
    """`requests`' semantics: True checks against its CA bundle, a path against that bundle, False not at all."""
    if verify is False:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context = ssl.create_default_context(cafile=verify if isinstance(verify, str) else requests.certs.where())
    if cert_file:
        context.load_cert_chain(cert_file, key_file)
    return context


class KeepAliveGetter:
    """`get(path)` -> (status, headers, body) of a 2xx answer, or None for the caller to take its full path."""

    def __init__(self, base_url: str, headers: dict[str, str], timeout_s: float,
                 tls: ssl.SSLContext | None = None) -> None:
        parts = urlsplit(base_url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or "localhost"
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        self._headers = dict(headers)
        self._timeout_s = timeout_s
        self._tls = tls or (tls_context(True, None, None) if self._https else None)
        self._local = threading.local()
        self._lock = threading.Lock()
        # Weak: a connection whose thread has ended (pools come and go) is closed when collected, not kept open.
        self._open: weakref.WeakSet[http.client.HTTPConnection] = weakref.WeakSet()

    def _connection(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            if self._https:
                conn = http.client.HTTPSConnection(self._host, self._port, timeout=self._timeout_s, context=self._tls)
            else:
                conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout_s)
            self._local.conn = conn
            with self._lock:
                self._open.add(conn)
        return conn

    def _drop(self, conn: http.client.HTTPConnection) -> None:
        conn.close()
        self._local.conn = None
        with self._lock:
            self._open.discard(conn)

    def get(self, path: str) -> tuple[int, dict[str, str], bytes] | None:
        """A 2xx answer to GET `path`, or None (no answer, or any other status)."""
        answer = self.send("GET", path)
        return answer if answer is not None and 200 <= answer[0] < 300 else None

    def send(self, method: str, path: str, body: bytes | None = None,
             content_type: str | None = None) -> tuple[int, dict[str, str], bytes] | None:
        """(status, headers, body) of whatever the server answered, or None when no answer came."""
        headers = dict(self._headers)
        if content_type:
            headers["Content-Type"] = content_type
        # A kept-alive connection the server has since closed fails once: then one fresh connection is tried.
        # A fresh connection that fails, or a request not answered in time, goes straight to the caller's full
        # path (a hung broker would otherwise cost a second timeout before it).
        while True:
            fresh = getattr(self._local, "conn", None) is None
            conn = self._connection()
            try:
                conn.request(method, self._prefix + path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                log.debug("kept-alive %s %s: %s", method, path, type(exc).__name__)
                self._drop(conn)
                if fresh or isinstance(exc, TimeoutError):  # a server that did not answer: not a closed connection
                    return None
                continue
            if resp.will_close:
                self._drop(conn)
            return resp.status, dict(resp.getheaders()), data

    def close(self) -> None:
        with self._lock:
            conns, self._open = list(self._open), weakref.WeakSet()
        for conn in conns:
            conn.close()
