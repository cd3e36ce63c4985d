"""Lookup service configuration: a JSON file (`--config` or `PM_LOOKUP_CONFIG`), environment overrides.

    {
      "clusters": {"cluster-a": {"http_url": "http://127.0.0.1:8081", "token_env": null}, ...},
      "default_cluster": "cluster-a",
      "database_url": "sqlite:///var/lookup/routes.db",
      "admin_token_env": "PM_LOOKUP_ADMIN_TOKEN",
      "hold_timeout_s": 20, "forward_timeout_s": 10, "host": "127.0.0.1", "port": 8090
    }

`http_url` is where the service forwards a cluster's lookups (a broker's or the cluster's HTTP service
URL); `token_env` names the variable holding a token the service sends there, or `token_file` a file holding
it, read at each forwarded lookup (a token renewed in place), or `oauth2` an issuer and credentials file
(pulsar_migration.oauth2, as the spec's). The admin API's token is read from
`admin_token_env` at start; the service refuses to start without it.

TLS, both optional: a cluster's `"tls": {"trust_certs_file", "cert_file", "key_file", "allow_insecure"}` for an
`https://` http_url signed by a private authority or requiring client certificates (the spec's cluster `tls`);
a top-level `"tls": {"cert_file", "key_file"}` makes the service itself answer over HTTPS. Clients whose service
URL is `https://` connect to the brokers' TLS ports (`brokerUrlTls` of the answer), plain ones to `brokerUrl`.
"""

from __future__ import annotations

import json
import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pulsar_migration import oauth2, tokens
from pulsar_migration.oauth2 import OAuth2Spec

CONFIG_ENV = "PM_LOOKUP_CONFIG"
DEFAULT_TOKEN_ENV = "PM_LOOKUP_ADMIN_TOKEN"
# C++ and Java clients time a lookup out after 30 s (operationTimeout): a parked lookup must be answered
# well before, or the client counts a failure and backs off.
MAX_HOLD_TIMEOUT_S = 25.0


class ConfigError(ValueError):
    """A configuration the service cannot run with (one line)."""


TLS_CLIENT_KEYS = frozenset({"trust_certs_file", "cert_file", "key_file", "allow_insecure"})
TLS_SERVER_KEYS = frozenset({"cert_file", "key_file"})


@dataclass(frozen=True)
class ClusterTarget:
    name: str
    http_url: str
    token_env: str | None = None
    tls: dict[str, Any] | None = None  # TLS_CLIENT_KEYS
    token_file: str | None = None
    oauth2: OAuth2Spec | None = None

    def ssl_context(self) -> ssl.SSLContext | bool:
        """What the forwarding client verifies this cluster with (True: the system's trust store)."""
        from pulsar_migration.spec import TlsSpec  # the spec's reading of the same four keys

        return TlsSpec(**self.tls).settings().context() if self.tls else True

    @property
    def has_token(self) -> bool:
        """Whether lookups forwarded here carry the service's own credential."""
        return bool(self.oauth2 or self.token_file or self.token_env)

    def token(self) -> str | None:
        if self.oauth2:  # cached until shortly before it lapses: the issuer is asked about once per token life
            try:
                return oauth2.access_token(self.oauth2)
            except oauth2.OAuth2Error as exc:
                raise ConfigError(f"lookup config: clusters.{self.name}: {exc}") from exc
        if self.token_file:
            try:
                return tokens.read_file(self.token_file)
            except tokens.TokenFileError as exc:
                raise ConfigError(f"lookup config: clusters.{self.name}.token_file {exc}") from exc
        if not self.token_env:
            return None
        token = os.environ.get(self.token_env)
        if not token:
            raise ConfigError(f"environment variable {self.token_env} (token for cluster {self.name}) is not set")
        return token


@dataclass(frozen=True)
class LookupConfig:
    clusters: dict[str, ClusterTarget]
    default_cluster: str
    database_url: str = "sqlite:///var/lookup/routes.db"
    admin_token_env: str = DEFAULT_TOKEN_ENV
    hold_timeout_s: float = 20.0
    forward_timeout_s: float = 10.0
    # A broker answers a lookup with 5xx while the topic's bundle is being unloaded or loaded; clients back
    # off exponentially on such an error, so the service retries it itself for up to this long.
    transient_retry_s: float = 5.0
    host: str = "127.0.0.1"
    port: int = 8090
    tls: dict[str, str] | None = None  # TLS_SERVER_KEYS: the service answers over HTTPS
    extra: dict[str, Any] = field(default_factory=dict)

    def admin_token(self) -> str:
        token = os.environ.get(self.admin_token_env)
        if not token:
            raise ConfigError(f"environment variable {self.admin_token_env} (the lookup service's admin token) "
                              "is not set")
        return token

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LookupConfig:
        if not isinstance(data, dict):
            raise ConfigError("lookup config: expected a JSON object")
        raw = data.get("clusters")
        if not isinstance(raw, dict) or not raw:
            raise ConfigError("lookup config: 'clusters' must name at least one cluster")
        clusters = {}
        for name, c in raw.items():
            if not isinstance(c, dict) or not str(c.get("http_url", "")).startswith(("http://", "https://")):
                raise ConfigError(f"lookup config: clusters.{name}.http_url must be an http(s) URL")
            given = tokens.credentials_given(c)
            if len(given) > 1:
                raise ConfigError(f"lookup config: clusters.{name} sets {' and '.join(given)}; give one")
            try:
                oauth = OAuth2Spec(**c["oauth2"]) if c.get("oauth2") else None
            except TypeError:
                raise ConfigError(f"lookup config: clusters.{name}.oauth2 must be an object with issuer_url and "
                                  "credentials_file (audience, scope optional)") from None
            clusters[name] = ClusterTarget(name, str(c["http_url"]).rstrip("/"), c.get("token_env"),
                                           _tls_entry(f"clusters.{name}.tls", c.get("tls"), TLS_CLIENT_KEYS),
                                           c.get("token_file"), oauth)
        default = data.get("default_cluster")
        if default not in clusters:
            raise ConfigError(f"lookup config: default_cluster {default!r} is not one of {sorted(clusters)}")
        hold = float(data.get("hold_timeout_s", 20.0))
        if not 0 < hold <= MAX_HOLD_TIMEOUT_S:
            raise ConfigError(f"lookup config: hold_timeout_s must be in (0, {MAX_HOLD_TIMEOUT_S:.0f}] (clients give "
                              "up on a lookup after 30 s)")
        retry = float(data.get("transient_retry_s", 5.0))
        if not 0 <= retry <= MAX_HOLD_TIMEOUT_S:
            raise ConfigError(f"lookup config: transient_retry_s must be in [0, {MAX_HOLD_TIMEOUT_S:.0f}]")
        serving = _tls_entry("tls", data.get("tls"), TLS_SERVER_KEYS)
        if serving is not None and not (serving.get("cert_file") and serving.get("key_file")):
            raise ConfigError("lookup config: tls needs both cert_file and key_file to answer over HTTPS")
        known = {"clusters", "default_cluster", "database_url", "admin_token_env", "hold_timeout_s",
                 "forward_timeout_s", "transient_retry_s", "host", "port", "tls"}
        return cls(clusters=clusters, default_cluster=default,
                   database_url=str(data.get("database_url", "sqlite:///var/lookup/routes.db")),
                   admin_token_env=str(data.get("admin_token_env", DEFAULT_TOKEN_ENV)), hold_timeout_s=hold,
                   forward_timeout_s=float(data.get("forward_timeout_s", 10.0)), transient_retry_s=retry,
                   host=str(data.get("host", "127.0.0.1")), port=int(data.get("port", 8090)), tls=serving,
                   extra={k: v for k, v in data.items() if k not in known})

    @classmethod
    def load(cls, path: str | Path | None = None) -> LookupConfig:
        where = path or os.environ.get(CONFIG_ENV)
        if not where:
            raise ConfigError(f"no lookup config: pass --config FILE or set {CONFIG_ENV}")
        try:
            data = json.loads(Path(where).read_text())
        except FileNotFoundError:
            raise ConfigError(f"lookup config {where} does not exist") from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"lookup config {where} is not valid JSON: {exc}") from None
        overrides = {"PM_LOOKUP_DATABASE_URL": "database_url", "PM_LOOKUP_PORT": "port", "PM_LOOKUP_HOST": "host"}
        if isinstance(data, dict):
            data.update({key: os.environ[env] for env, key in overrides.items() if os.environ.get(env)})
        return cls.from_dict(data)


def _tls_entry(where: str, value: Any, keys: frozenset[str]) -> dict[str, Any] | None:
    """A TLS object of the config (None when absent); ConfigError for an unknown key or a file that is not there."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - keys:
        raise ConfigError(f"lookup config: {where} must be an object with keys from {sorted(keys)}")
    for key in ("trust_certs_file", "cert_file", "key_file"):
        if value.get(key) and not os.path.isfile(value[key]):
            raise ConfigError(f"lookup config: {where}.{key} file {value[key]} does not exist")
    return dict(value)
