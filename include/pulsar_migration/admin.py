"""Pulsar admin REST v2 client: token auth, TLS, bounded retries, typed errors.

One instance per cluster, normally built by `ClusterSpec.admin()` (pulsar_migration.spec), which reads
the token from the environment variable the spec names. Tokens never appear in arguments of a
process and are never logged.
"""

from __future__ import annotations

import json
import logging
import re
import ssl
import threading
import time
from collections.abc import Callable, Container
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote, urljoin, urlparse, urlsplit

import requests
import requests.adapters
import requests.structures

from pulsar_migration import tokens
from pulsar_migration.keepalive_get import KeepAliveGetter, tls_context
from pulsar_migration.positions import Position

log = logging.getLogger(__name__)
T = TypeVar("T")
# A request retried after its answer was lost on a cut connection can meet the first one still fencing the
# subscription: "412 Subscription Busy: Failed to fence subscription". Asked again, with a growing pause.
BUSY_ATTEMPTS = 5


def asked_again_while_busy(call: Callable[[], T], what: str, attempts: int = BUSY_ATTEMPTS) -> T:
    """`call()`, asked again while the broker answers that the subscription is busy (412 "Busy"). Only for
    requests that are safe to repeat (a create that tolerates "exists", a cursor reset to the same place)."""
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except AdminError as exc:
            if exc.status != 412 or "Busy" not in str(exc) or attempt == attempts:
                raise
            log.info("%s: the subscription is busy (attempt %d): asking again", what, attempt)
            time.sleep(0.5 * attempt)
    raise AssertionError("unreachable")

RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
POOL_MAXSIZE = 64
# A broker that has just restarted after a crash recovers each topic's open ledger when the topic is first
# loaded; until its bookie answers, that load fails with HTTP 500 "Error while recovering ledger" (seen in CI
# right after a SIGKILLed standalone came back). Such answers are asked again for this long, not 4 times.
RECOVERING_LEDGER_WAIT_S = 30.0
RECOVERING_LEDGER_MARKERS = (b"Error while recovering ledger", b"Error while opening ledger")
# Answers of a topic between owners (an unload, a bundle moving; seen on 4.0.8 during namespace unloads, 28 in
# 7,086 calls): asked again for up to RECOVERING_LEDGER_WAIT_S, like a ledger still recovering. The broker did
# nothing for such a call, so a write is safe to send again too.
TRANSIENT_ANSWERS = ((500, RECOVERING_LEDGER_MARKERS), (412, (b"Can't find owner",)))
# An entry's metadata read answers within milliseconds, or never (EntryUnanswered): waiting the general timeout
# and its retries took about 3 minutes a lookup before the run failed as "cluster unreachable".
ENTRY_ANSWER_S = 5.0


class AdminError(RuntimeError):
    """An admin call failed; `status` is the HTTP status, or None when the cluster was unreachable."""

    def __init__(self, message: str, status: int | None = None, path: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.path = path


class ClusterUnreachable(AdminError):
    """No HTTP answer from the admin URL (connection refused, DNS, timeout)."""


class EntryUnanswered(AdminError):
    """The broker answers other calls but not the read of one stored entry's metadata within ENTRY_ANSWER_S.
    Pulsar 4.0.8 never answers `GET .../ledger/{l}/entry/{e}` for a chunk of a compressed chunked message (it
    fails decompressing the chunk inside a callback and leaves the request open): what the entry holds is
    unknown, not missing."""


class AuthRejected(AdminError):
    """401 or 403: the cluster refused the credentials (missing, wrong or expired token; a role without the
    permission). Retrying cannot help: a human must change the token or the role."""


class NotFound(AdminError):
    """404 from the admin API."""


class Conflict(AdminError):
    """409 from the admin API (e.g. the resource already exists)."""


@dataclass(frozen=True)
class TlsSettings:
    """TLS options for the admin client (`verify` may be a CA bundle path)."""

    verify: bool | str = True
    cert_file: str | None = None
    key_file: str | None = None

    def context(self) -> ssl.SSLContext:
        return tls_context(self.verify, self.cert_file, self.key_file)


def _transient(status: int, content: bytes) -> bool:
    """An answer of a topic in passing (TRANSIENT_ANSWERS): asked again for a while."""
    return any(status == code and any(marker in content for marker in markers) for code, markers in TRANSIENT_ANSWERS)


def _final_error(status: int, content: bytes) -> bool:
    """An error answer the full path would not ask again about (nor follow, as a redirect)."""
    return status >= 400 and status not in RETRYABLE_STATUS and not _transient(status, content)


def _response(answer: tuple[int, dict[str, str], bytes]) -> requests.Response:
    resp = requests.Response()
    resp.status_code, resp._content = answer[0], answer[2]
    resp.headers = requests.structures.CaseInsensitiveDict(answer[1])
    return resp


def _body(headers: Any, content: bytes, expect_json: bool) -> Any:
    """A successful answer's body: bytes unless JSON is expected; JSON when it is JSON; else text."""
    if not expect_json or not content:
        return content if not expect_json else None
    ctype = headers.get("Content-Type") or headers.get("content-type") or ""
    if "json" in ctype or content[:1] in (b"{", b"["):
        return json.loads(content)
    return content.decode(_charset(ctype))


def _charset(content_type: str) -> str:
    for part in content_type.split(";")[1:]:
        key, _, value = part.strip().partition("=")
        if key.lower() == "charset" and value:
            return value.strip('"')
    return "utf-8"


def seg(name: str) -> str:
    """Quotes one path segment (topic and subscription names may hold characters URLs reserve)."""
    return quote(name, safe="")


def seg_twice(name: str) -> str:
    """Quotes a topic's local name for the `/schemas/...` endpoints, or a subscription name in a topic's
    `/subscription/...` paths: Pulsar 4.0 decodes those twice (the framework, then its own code again). Quoted once,
    a name with '%' failed or was not found, and one with '+' named another ('a+b' read as 'a b': sync_metadata
    created subscription 'a b' on the target)."""
    return seg(seg(name))


def schema_path(tenant: str, namespace: str, local_name: str) -> str:
    """`/schemas/t/ns/name` for the admin API, the topic's name quoted twice (seg_twice)."""
    return f"/schemas/{seg(tenant)}/{seg(namespace)}/{seg_twice(local_name)}"


def base_topic(topic: str, partition: int) -> str:
    """`persistent://t/ns/name-partition-N` -> `persistent://t/ns/name` for a partition (`partition` >= 0); a
    non-partitioned topic (-1) is its own base, whatever its name."""
    return topic.rsplit("-partition-", 1)[0] if partition >= 0 else topic


# Every setting of the broker answering (its superuser role needed), values as strings.
RUNTIME_CONFIGURATION = "/brokers/configuration/runtime"


REDIRECT_STATUS = frozenset({301, 302, 303, 307, 308})
MAX_REDIRECTS = 5


def _header(headers: dict[str, str], name: str) -> str | None:
    return next((v for k, v in headers.items() if k.lower() == name.lower()), None)


def token_may_follow(old_url: str, new_url: str) -> bool:
    """Whether a token sent to `old_url` goes along on a redirect to `new_url`: to any broker the cluster redirects to
    (the topic's owner), but never from https to plain http."""
    return not (urlparse(old_url).scheme == "https" and urlparse(new_url).scheme != "https")


class ClusterSession(requests.Session):
    """A session that keeps its token on a broker's redirect to the topic's owner (another host or port of the
    cluster): requests drops it there, and every call about a topic the admin URL's broker does not own came back
    401 on a cluster of more than one broker. Pulsar's own admin client sends it to the owner too. Not kept when
    the redirect would carry it from https to plain http."""

    def should_strip_auth(self, old_url: str, new_url: str) -> bool:
        return not token_may_follow(old_url, new_url)


_SSL_REASON = re.compile(r"\[SSL: ([A-Z0-9_]+)\] (.*?)\s*\(_ssl\.c")


def tls_failure(exc: BaseException, fields: str, server: str = "broker") -> str | None:
    """What a failed TLS handshake means and which spec fields (`fields`: e.g. "clusters.a.tls") to look at;
    None: no SSL reason in `exc`."""
    found = _SSL_REASON.search(str(exc))
    if found is None:
        if "EOF occurred in violation of protocol" not in str(exc):
            return None
        # The server hung up inside the handshake before its alert was read (TLS 1.3 sends it late).
        return (f"the {server} closed the connection in the TLS handshake; a {server} that requires a client "
                f"certificate does so without one: {fields}.cert_file and key_file")
    code, text = found.groups()
    if code == "CERTIFICATE_VERIFY_FAILED":
        return (f"the {server}'s certificate is not trusted ({text}); name the authority that signed it in "
                f"{fields}.trust_certs_file")
    if "ALERT" in code:
        return (f"the {server} refused the client's certificate or the lack of one ({text}); a {server} that "
                f"requires one takes it from {fields}.cert_file and key_file")
    return text


NOT_PERMITTED = "its role lacks the permission (the tools need a superuser role)"


class PulsarAdmin:
    """Minimal, explicit Pulsar admin client over `requests`."""

    def __init__(
        self,
        admin_url: str,
        *,
        token: str | None = None,
        tls: TlsSettings | None = None,
        timeout_s: float = 30.0,
        retries: int = 4,
        name: str | None = None,
        credential: str | None = None,
        token_source: Callable[[], str | None] | None = None,
    ) -> None:
        self.admin_url = admin_url.rstrip("/")
        self.name = name or self.admin_url
        # Where the token came from ("the token in $VAR"), for the one line an auth failure prints; never the token.
        self.credential = credential or ("the token" if token else "no token")
        self.token_expiry = tokens.expiry(token)  # the JWT's `exp`, to name it when the cluster refuses the token
        self.timeout_s = timeout_s
        self.retries = retries
        self._tls = tls
        self._getter: KeepAliveGetter | None = None
        self._entry_getters: dict[str, KeepAliveGetter] = {}  # by broker: the admin URL's, and owners redirected to
        self._getter_lock = threading.Lock()
        # Where a fresh token comes from when the cluster refuses this one (a token file renewed in place).
        self._token_source = token_source
        self._token = token
        self._retired: list[KeepAliveGetter] = []  # getters with an old token: other threads may still use them
        self._renew_lock = threading.Lock()
        self._unanswered: set[tuple[str, int, int]] = set()  # entries asked for in vain: not asked again
        self._session = ClusterSession()
        # One client serves many threads (driver paths, the switch's fence): keep a connection per thread
        # alive instead of the default 10, which would reconnect on every call beyond that.
        adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=POOL_MAXSIZE)
        self._session.mount("http://", adapter)
        self._session.mount("https://", adapter)
        if token:
            self._session.headers["Authorization"] = f"Bearer {token}"
        # Passed with every request: a session's own `verify` loses to REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE in the
        # environment (requests merges those over it), and the spec's private authority would then not be trusted.
        self._verify: bool | str | None = tls.verify if tls is not None else None
        if tls is not None:
            if tls.cert_file:
                self._session.cert = (tls.cert_file, tls.key_file) if tls.key_file else tls.cert_file

    def close(self) -> None:
        self._session.close()
        for getter in (self._getter, *self._entry_getters.values(), *self._retired):
            if getter is not None:
                getter.close()

    # -- transport -------------------------------------------------------------------------------

    def request(self, method: str, path: str, *, json_body: Any = None, params: dict[str, Any] | None = None,
                expect_json: bool = True, retry: bool = True, raw_response: bool = False) -> Any:
        """Calls `/admin/v2{path}` (or `path` itself when it starts with `/admin` or `/lookup`).

        `raw_response` returns the successful `requests.Response` itself (for headers). A refused token is
        renewed from the token source once, when it holds another one, and the call asked again."""
        kwargs = {"json_body": json_body, "params": params, "expect_json": expect_json, "retry": retry,
                  "raw_response": raw_response}
        used = self._token
        try:
            return self._request(method, path, **kwargs)
        except AuthRejected as exc:
            # Only a refused token (401 without "not permitted"): a role without the right keeps its refusal.
            if exc.status != 401 or NOT_PERMITTED in str(exc) or not self._renew_token(used):
                raise
            log.info("%s: the cluster refused the token; %s holds another one: asking again", self.name,
                     self.credential)
            return self._request(method, path, **kwargs)

    def _renew_token(self, used: str | None) -> bool:
        """Takes the token source's token when it differs from `used`, the one a refused call went with (True),
        else False. Calls refused together renew once: the first reads the source, the others find it done."""
        if self._token_source is None:
            return False
        with self._renew_lock:
            if self._token != used:
                return True  # another thread's refused call renewed it meanwhile
            try:
                fresh = self._token_source()
            except ValueError:  # the file is gone or empty now, the issuer gives none: the refusal stands
                return False
            if not fresh or fresh == used:
                return False
            with self._getter_lock:
                self._token, self.token_expiry = fresh, tokens.expiry(fresh)
                self._session.headers["Authorization"] = f"Bearer {fresh}"
                self._retired.extend(g for g in (self._getter, *self._entry_getters.values()) if g is not None)
                self._getter, self._entry_getters = None, {}  # the next ones carry the new token
        return True

    def _request(self, method: str, path: str, *, json_body: Any, params: dict[str, Any] | None,
                 expect_json: bool, retry: bool, raw_response: bool) -> Any:
        full_path = path if path.startswith(("/admin", "/lookup")) else f"/admin/v2{path}"
        if retry and params is None and not raw_response:
            # The fast path: `requests` spends about 2 ms of client CPU on a call, which the cutover's phases pay
            # per partition while clients wait. A 2xx answer is the result and a final error status its typed
            # error; a retryable one, a redirect or no answer at all take the full path below, which retries.
            body = None if json_body is None else json.dumps(json_body).encode()
            answer = self._kept_alive().send(method, full_path, body, "application/json" if body else None)
            if answer is not None and (answer[0] < 300 or _final_error(answer[0], answer[2])):
                if answer[0] < 300:
                    return _body(answer[1], answer[2], expect_json)
                return self._result(method, path, _response(answer), expect_json)
        url = self.admin_url + full_path
        attempts = self.retries + 1 if retry else 1
        last_error: Exception | None = None
        recovering_until: float | None = None
        attempt = 0
        while attempt < attempts:
            attempt += 1
            try:
                resp = self._session.request(method, url, json=json_body, params=params, timeout=self.timeout_s,
                                             verify=self._verify)
            except requests.RequestException as exc:
                last_error = exc
                if attempt < attempts:
                    time.sleep(min(0.25 * 2 ** (attempt - 1), 4.0))
                    continue
                tls = tls_failure(exc, f"clusters.{self.name}.tls") \
                    if isinstance(exc, requests.exceptions.SSLError) else None
                raise ClusterUnreachable(
                    f"cluster {self.name}: TLS handshake with {self.admin_url} failed: {tls}" if tls else
                    f"cluster {self.name} is unreachable at {self.admin_url}: {type(exc).__name__}", None, path
                ) from exc
            if retry and _transient(resp.status_code, resp.content):
                recovering_until = recovering_until or time.monotonic() + RECOVERING_LEDGER_WAIT_S
                if time.monotonic() < recovering_until:
                    log.info("%s: %s %s: the topic is between owners or still recovering its ledger (HTTP %d); "
                             "asking again", self.name, method, path, resp.status_code)
                    attempts = max(attempts, attempt + 1)
                    time.sleep(1.0)
                    continue
            if resp.status_code in RETRYABLE_STATUS and attempt < attempts:
                time.sleep(min(0.25 * 2 ** (attempt - 1), 4.0))
                continue
            if raw_response and resp.status_code < 300:
                return resp
            return self._result(method, path, resp, expect_json)
        raise ClusterUnreachable(f"cluster {self.name}: {last_error}", None, path)  # pragma: no cover

    def _result(self, method: str, path: str, resp: requests.Response, expect_json: bool) -> Any:
        if resp.status_code < 300:
            return _body(resp.headers, resp.content, expect_json)
        reason = _reason(resp)
        if resp.status_code in (401, 403):
            # Pulsar answers 401 both when it cannot authenticate the token (an HTML error page) and when the
            # role may not do the call (JSON "Unauthorized to ..."): only the body tells them apart.
            not_permitted = resp.status_code == 403 or reason.startswith("Unauthorized to")
            expired = tokens.expired_note(self.token_expiry)
            why = (NOT_PERMITTED if not_permitted
                   else f"the token {expired}" if expired
                   else "the token is missing, wrong or expired")
            raise AuthRejected(f"cluster {self.name}: HTTP {resp.status_code} on {method} {path} with "
                               f"{self.credential}: {why}", resp.status_code, path)
        message = f"{method} {path} on {self.name} failed with HTTP {resp.status_code}: {reason}"
        if resp.status_code == 404:
            raise NotFound(message, 404, path)
        if resp.status_code == 409:
            raise Conflict(message, 409, path)
        raise AdminError(message, resp.status_code, path)

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.request("GET", path, **kwargs)

    def put(self, path: str, body: Any = None, **kwargs: Any) -> Any:
        return self.request("PUT", path, json_body=body, **kwargs)

    def post(self, path: str, body: Any = None, **kwargs: Any) -> Any:
        return self.request("POST", path, json_body=body, **kwargs)

    def delete(self, path: str, **kwargs: Any) -> Any:
        return self.request("DELETE", path, **kwargs)

    def force_delete(self, path: str, refusals: Container[int], wait_s: float) -> None:
        """Force-deletes `path`, asking again for up to `wait_s` while the broker answers a status in `refusals`
        (a namespace or tenant whose topics are still going away); already gone counts as deleted."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.delete(path, params={"force": "true"}, expect_json=False)
                return
            except NotFound:
                return
            except AdminError as exc:
                if exc.status not in refusals or time.monotonic() > deadline:
                    raise
                log.info("%s not deletable yet (HTTP %s): asking again", path, exc.status)
                time.sleep(0.5)

    def topic_path(self, topic: str) -> str:
        """`persistent://t/ns/name` -> `/persistent/t/ns/name` with each segment quoted."""
        domain, _, rest = topic.partition("://")
        return "/" + "/".join([domain, *(seg(part) for part in rest.split("/", 2))])

    def last_message_id(self, topic: str) -> dict[str, Any]:
        """`{ledgerId, entryId, batchIndex, ...}` of the topic's last message (entryId -1: none yet)."""
        return dict(self.get(f"{self.topic_path(topic)}/lastMessageId"))

    def last_entry(self, topic: str) -> Position | None:
        """The entry of the topic's last message (None: the topic holds none)."""
        last = self.last_message_id(topic)
        ledger, entry = int(last.get("ledgerId", -1)), int(last.get("entryId", -1))
        return Position(ledger, entry) if ledger >= 0 and entry >= 0 else None

    def entry_headers(self, topic: str, ledger: int, entry: int) -> dict[str, str]:
        """The `X-Pulsar-*` metadata headers of one stored entry (one broker read of the entry). EntryUnanswered
        when no answer comes within ENTRY_ANSWER_S while the broker answers for the topic otherwise."""
        key = (topic, ledger, entry)
        if key in self._unanswered:
            raise self._unanswered_error(key)
        path = f"/admin/v2{self.topic_path(topic)}/ledger/{ledger}/entry/{entry}"
        answer = self._kept_alive(entries=True).send("GET", path)
        hops = 0
        while answer is not None and answer[0] in REDIRECT_STATUS and hops < MAX_REDIRECTS \
                and _header(answer[1], "Location"):
            # Another broker owns the topic: ask it with the same give-up (the full path would wait out its timeout
            # and retries on an entry the owner never shows).
            location = urlsplit(urljoin(self.admin_url + path, _header(answer[1], "Location")))
            answer = self._kept_alive(entries=True, base=f"{location.scheme}://{location.netloc}").send(
                "GET", location.path + (f"?{location.query}" if location.query else ""))
            hops += 1
        if answer is None:  # no answer at all: a broker down, or one that never answers for this entry
            self.last_message_id(topic)  # ClusterUnreachable (after the usual retries) when it is the broker
            self._unanswered.add(key)
            raise self._unanswered_error(key)
        # An error status: the full path retries and raises the typed error.
        headers = answer[1] if answer[0] < 300 else self.request("GET", path, raw_response=True).headers
        return {k: v for k, v in headers.items() if k.lower().startswith("x-pulsar-")}

    def _unanswered_error(self, key: tuple[str, int, int]) -> EntryUnanswered:
        topic, ledger, entry = key
        return EntryUnanswered(
            f"cluster {self.name} does not show entry {ledger}:{entry} of {topic} within {ENTRY_ANSWER_S:.0f}s while "
            "it answers for the topic (Pulsar 4.0 never shows a chunk of a compressed chunked message)", None,
            f"{topic}@{ledger}:{entry}")

    def _kept_alive(self, *, entries: bool = False, base: str | None = None) -> KeepAliveGetter:
        with self._getter_lock:
            if entries:
                base = base or self.admin_url
                if base not in self._entry_getters:
                    self._entry_getters[base] = self._new_getter(ENTRY_ANSWER_S, base)
                return self._entry_getters[base]
            if self._getter is None:
                self._getter = self._new_getter(self.timeout_s, self.admin_url)
            return self._getter

    def _new_getter(self, timeout_s: float, base: str) -> KeepAliveGetter:
        context = (self._tls or TlsSettings()).context() if base.startswith("https:") else None
        auth = self._session.headers.get("Authorization")
        keep = auth and token_may_follow(self.admin_url, base)
        return KeepAliveGetter(base, {"Authorization": str(auth)} if keep else {}, timeout_s, context)

    # -- clusters --------------------------------------------------------------------------------

    def check_credentials(self) -> None:
        """AuthRejected when the cluster refuses this client's credentials; anything else (even unreachable)
        is left to the first real call, which reports it in its own words."""
        try:
            self.request("GET", "/tenants", retry=False)  # read-only, and only a superuser may
        except AuthRejected:
            raise
        except AdminError:
            log.debug("credential check on %s inconclusive", self.name, exc_info=True)

    def healthy(self) -> bool:
        """True when the broker answers its health check (a round trip through its heartbeat topic)."""
        try:
            return self.request("GET", "/brokers/health", expect_json=False, retry=False).strip() == b"ok"
        except AdminError:
            return False

    def clusters(self) -> list[str]:
        return list(self.get("/clusters"))

    def cluster(self, name: str) -> dict[str, Any]:
        return dict(self.get(f"/clusters/{seg(name)}"))

    def upsert_cluster(self, name: str, data: dict[str, Any]) -> str:
        """Registers (PUT) or updates (POST) a cluster; returns "created", "updated" or "unchanged"."""
        try:
            current = self.cluster(name)
        except NotFound:
            self.put(f"/clusters/{seg(name)}", data)
            return "created"
        if all(current.get(k) == v for k, v in data.items()):
            return "unchanged"
        self.post(f"/clusters/{seg(name)}", data)
        return "updated"


# A proxy or gateway may echo a request body (e.g. a cluster registration with auth parameters) into its
# error page; error reasons travel into reports and logs, so anything token-like is masked.
_SECRET_PATTERN = re.compile(r"(token:|Bearer\s+|authenticationParameters\W+)[^\s\"',}]+", re.IGNORECASE)


def _reason(resp: requests.Response) -> str:
    try:
        body = resp.json()
        if isinstance(body, dict) and "reason" in body:
            return _SECRET_PATTERN.sub(r"\1***", str(body["reason"]))
    except ValueError:
        pass
    return _SECRET_PATTERN.sub(r"\1***", (resp.text or resp.reason or "").strip()[:300])
