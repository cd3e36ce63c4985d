"""MigrationSpec: what to migrate, from where to where. Load, validate (one-line errors), JSON schema.

The spec names environment variables that hold tokens, never tokens. Validation runs in two passes:
the JSON schema (structure, types, unknown and missing fields) and then semantic checks the schema
cannot express (source and target among the clusters, regexes compile, URL schemes).

    python -m pulsar_migration.spec schema            # prints the JSON schema
    python -m pulsar_migration.spec validate FILE     # exit 0, or one error line and exit 2
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import logging
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import jsonschema

from pulsar_migration import oauth2, tokens
from pulsar_migration.admin import AuthRejected, ClusterUnreachable, PulsarAdmin, TlsSettings
from pulsar_migration.oauth2 import OAuth2Spec
from pulsar_migration.throttle import Caps

if TYPE_CHECKING:
    import pulsar
    from pyspark.sql import SparkSession

    from pulsar_migration.lookup.client import LookupAdmin

log = logging.getLogger(__name__)


class SpecError(ValueError):
    """The spec is invalid or its environment is incomplete; the message is one line naming the problem."""


# Pulsar's NamedEntity pattern for tenant, namespace and cluster names (Java's \w is ASCII-only).
PULSAR_NAME_PATTERN = r"^[-=:.A-Za-z0-9_]+$"
ENV_VAR_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
REPLICATION_MODES = ("copy", "geo")
ADMIN_CONCURRENCY_DEFAULT = 8
ADMIN_CONCURRENCY_MAX = 64
COPY_MAX_IN_FLIGHT_DEFAULT = 5000
GEO_TIMEOUT_DEFAULT_S = 600
PROGRESS_INTERVAL_DEFAULT_S = 30

_NAME_RULE = "letters, digits and - = : . _ only"
_NULLABLE_PATH = {"type": ["string", "null"], "minLength": 1, "default": None}
_TOKEN_ENV = {
    "type": ["string", "null"],
    "pattern": ENV_VAR_PATTERN,
    "default": None,
    "description": "Name of the environment variable holding the auth token (never the token); null = no auth.",
}

SPEC_JSON_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "MigrationSpec",
    "description": "Moves one Pulsar tenant from a source cluster to a target cluster (see DESIGN.md section 2).",
    "type": "object",
    "additionalProperties": False,
    "required": ["tenant", "source", "target", "clusters"],
    "properties": {
        "tenant": {
            "title": "Tenant",
            "description": "The Pulsar tenant to migrate.",
            "type": "string",
            "pattern": PULSAR_NAME_PATTERN,
        },
        "source": {"title": "Source cluster", "description": "Key in `clusters` of the cluster to migrate from.",
                   "type": "string", "minLength": 1},
        "target": {"title": "Target cluster", "description": "Key in `clusters` of the cluster to migrate to.",
                   "type": "string", "minLength": 1},
        "clusters": {
            "title": "Clusters",
            "description": "Connection settings per cluster name; must hold at least source and target.",
            "type": "object",
            "propertyNames": {"pattern": PULSAR_NAME_PATTERN},
            "additionalProperties": {
                "title": "Cluster",
                "type": "object",
                "additionalProperties": False,
                "required": ["admin_url", "service_url"],
                "properties": {
                    "admin_url": {"title": "Admin URL", "description": "http:// or https:// web service URL.",
                                  "type": "string"},
                    "service_url": {"title": "Service URL",
                                    "description": "pulsar:// or pulsar+ssl:// broker service URL.",
                                    "type": "string"},
                    "token_env": {"title": "Token variable", **_TOKEN_ENV},
                    "token_file": {
                        **_NULLABLE_PATH, "title": "Token file",
                        "description": "File holding the auth token instead of token_env, read at each use: a "
                                       "token renewed in place (a secrets agent, a projected service-account "
                                       "token) keeps a long run going. It must exist where the steps run."},
                    "oauth2": {
                        "title": "OAuth2 client credentials",
                        "description": "Instead of a token: access tokens from an OAuth2 issuer (Pulsar's "
                                       "client-credentials flow); the client id and secret stay in credentials_file.",
                        "type": ["object", "null"], "default": None, "additionalProperties": False,
                        "required": ["issuer_url", "credentials_file"],
                        "properties": {
                            "issuer_url": {"title": "Issuer URL", "type": "string", "minLength": 1,
                                           "description": "Serves /.well-known/openid-configuration."},
                            "credentials_file": {"title": "Credentials file", "type": "string", "minLength": 1,
                                                 "description": "JSON with client_id and client_secret (Pulsar's "
                                                                "key file); it must exist where the steps run."},
                            "audience": {"title": "Audience", "type": ["string", "null"], "default": None},
                            "scope": {"title": "Scope", "type": ["string", "null"], "default": None},
                        },
                    },
                    "listener_name": {
                        "title": "Listener name",
                        "description": "The broker `advertisedListeners` entry clients connect through (a cluster "
                                       "reached over NAT, a load balancer or a proxy port); null = its internal one.",
                        "type": ["string", "null"], "default": None, "pattern": r"^[A-Za-z0-9_.-]+$"},
                    "tls": {
                        "title": "TLS",
                        "description": "TLS settings for admin and client connections; null = defaults "
                                       "(system CAs, verified).",
                        "type": ["object", "null"],
                        "default": None,
                        "additionalProperties": False,
                        "properties": {
                            "trust_certs_file": {**_NULLABLE_PATH, "title": "CA bundle",
                                                 "description": "PEM file of trusted CAs; null = system CAs."},
                            "allow_insecure": {"title": "Allow insecure", "type": "boolean", "default": False,
                                               "description": "Skip certificate verification (tests only)."},
                            "cert_file": {**_NULLABLE_PATH, "title": "Client certificate",
                                          "description": "PEM client certificate for mutual TLS."},
                            "key_file": {**_NULLABLE_PATH, "title": "Client key",
                                         "description": "PEM private key of cert_file."},
                        },
                    },
                },
            },
        },
        "namespaces": {
            "title": "Namespaces",
            "description": "Short namespace names (`ns1`, not `tenant/ns1`) to migrate; null = all of the tenant's.",
            "type": ["array", "null"],
            "default": None,
            "minItems": 1,
            "uniqueItems": True,
            "items": {"type": "string", "pattern": PULSAR_NAME_PATTERN},
        },
        "topics": {
            "title": "Topic filter",
            "description": "A topic `<namespace>/<topic>` is selected when some include regex matches "
                           "(re.search) and no exclude regex does.",
            "type": "object",
            "default": {"include": [".*"], "exclude": []},
            "additionalProperties": False,
            "properties": {
                "include": {"type": "array", "items": {"type": "string"}, "default": [".*"],
                            "description": "Regexes; a topic must match at least one."},
                "exclude": {"type": "array", "items": {"type": "string"}, "default": [],
                            "description": "Regexes; a topic matching any is skipped."},
            },
        },
        "replication": {
            "title": "Replication",
            "type": "object",
            "default": {"mode": "copy"},
            "additionalProperties": False,
            "properties": {
                "mode": {"enum": list(REPLICATION_MODES), "default": "copy",
                         "description": "copy = read and re-publish with a position map; "
                                        "geo = Pulsar geo-replication, drained."},
            },
        },
        "lookup": {
            "title": "Lookup service",
            "type": "object",
            "default": {"url": None, "token_env": None},
            "additionalProperties": False,
            "properties": {
                "url": {"type": ["string", "null"], "default": None,
                        "description": "http(s):// base URL of the lookup service; null = no lookup switch."},
                "token_env": {"title": "Admin token variable", **_TOKEN_ENV},
                "trust_certs_file": {"type": ["string", "null"], "default": None,
                                     "description": "PEM of the authority that signed an https:// lookup "
                                                    "service's certificate; null = the system's trust store."},
            },
        },
        "options": {
            "title": "Options",
            "description": "Step options; each known option is declared here and unknown keys are rejected.",
            "type": "object",
            "default": {},
            # Closed on purpose: a typo must fail validation, not be ignored. A step that needs a new
            # option adds it here (type, title, description, default) and a MigrationSpec property.
            "additionalProperties": False,
            "properties": {
                "proceed_on_conflict": {
                    "title": "Proceed on conflict",
                    "type": "boolean",
                    "default": False,
                    "description": "Continue when the target already holds a resource that differs from the "
                                   "source (the difference is reported, not overwritten).",
                },
                "admin_concurrency": {
                    "title": "Admin concurrency",
                    "type": "integer",
                    "minimum": 1,
                    "maximum": ADMIN_CONCURRENCY_MAX,
                    "default": ADMIN_CONCURRENCY_DEFAULT,
                    "description": "Admin API calls in flight per Spark task.",
                },
                "copy_max_in_flight": {
                    "title": "Messages in flight per partition",
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 1_000_000,
                    "default": COPY_MAX_IN_FLIGHT_DEFAULT,
                    "description": "Copy mode: messages sent to a target partition and not yet acknowledged.",
                },
                "copy_max_mb_per_s": {
                    "title": "Copy rate limit (MB/s)",
                    "type": ["number", "null"],
                    "exclusiveMinimum": 0,
                    "default": None,
                    "description": "Copy mode and backfills: the most source payload the run reads per second, in "
                                   "MB (10^6 bytes), over all its partitions; null = as fast as it goes. Not "
                                   "applied to the cutover's deltas (they hold the tenant's clients). Geo mode is "
                                   "capped by Pulsar's own replicator dispatch rate instead.",
                },
                "copy_max_msgs_per_s": {
                    "title": "Copy rate limit (messages/s)",
                    "type": ["number", "null"],
                    "exclusiveMinimum": 0,
                    "default": None,
                    "description": "Copy mode and backfills: the most source messages the run reads per second, "
                                   "over all its partitions (small messages cost brokers per message more than per "
                                   "byte); null = no such cap. Applied like copy_max_mb_per_s, and with it.",
                },
                "progress_interval_s": {
                    "title": "Progress log interval (s)",
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 3600,
                    "default": PROGRESS_INTERVAL_DEFAULT_S,
                    "description": "Copy mode and backfills: how often a running copy logs what it has copied so "
                                   "far (each engine process, each partition on the Python path).",
                },
                "delayed_delivery_horizon_s": {
                    "title": "Delayed-delivery horizon (s)",
                    "type": "integer",
                    "minimum": -1,
                    "default": -1,
                    "description": "Copy mode: the Python client cannot read a message's delivery time, so unbatched "
                                   "entries published within this many seconds are looked up one by one through "
                                   "the admin API to keep it. -1 = every unbatched entry (exact, slower); "
                                   "0 = never (delayed messages become due at once on the target).",
                },
                "copy_engine": {
                    "title": "Copy engine",
                    "type": "string",
                    "enum": ["auto", "java", "python"],
                    "default": "auto",
                    "description": "Copy mode: 'java' moves whole entries with the Pulsar Java client (needs a "
                                   "JDK and a Pulsar distribution's lib/, found through PULSAR_HOME); 'python' "
                                   "re-publishes every message through the Python client; 'auto' takes java when "
                                   "it is available.",
                },
                "trust_source_entry_filters": {
                    "title": "Trust source entry filters",
                    "type": "boolean",
                    "default": False,
                    "description": "Replicate topics that pass through broker entry filters on the source. The "
                                   "broker applies them to the step's readers too (subscriptions named "
                                   "pm-copy-reader-*), so a message they reject for those is lost by a copy, and no "
                                   "hash can see it; set this only for filters that pass every message to them. "
                                   "Without it such a run fails before writing anything.",
                },
                "geo_timeout_s": {
                    "title": "Geo-replication timeout (s)",
                    "type": "integer",
                    "minimum": 1,
                    "default": GEO_TIMEOUT_DEFAULT_S,
                    "description": "Geo mode: how long to wait for every partition's replication backlog to drain.",
                },
                "backfill_sink": {
                    "title": "Backfill sink",
                    "type": "string",
                    "enum": ["pulsar", "parquet"],
                    "default": "pulsar",
                    "description": "backfill_window: where a window's messages go. pulsar: the target cluster, "
                                   "exactly once by the copy rules of replicate_topics; parquet: the archive at "
                                   "archive_path, partitioned by tenant/namespace/topic/date.",
                },
                "archive_path": {
                    "title": "Archive path",
                    "type": ["string", "null"],
                    "default": None,
                    "description": "Root of the Parquet archive (path or URI Spark can write, e.g. s3a://...), "
                                   "written by backfill_window (sink parquet) and read by restore_window.",
                },
                "follows_run_dir": {
                    "title": "Continue from run dir",
                    "type": ["string", "null"],
                    "default": None,
                    "description": "replicate_topics: the run dir of an earlier migration of this tenant between "
                                   "the same clusters that was rolled back (or stopped before its switch). Its "
                                   "position map, and its rollback's with sides swapped, seed this run's once, so "
                                   "the copy continues after what the target holds and progress sync translates "
                                   "every position, those of messages published on the target between the flips "
                                   "included. Needed after a rollback: the target then holds messages that carry "
                                   "no source position.",
                },
                "backfill_state_dir": {
                    "title": "Backfill state dir",
                    "type": ["string", "null"],
                    "default": None,
                    "description": "backfill_window to a cluster: where the position map lives across windows "
                                   "(null: `_state/<tenant>.<source>.<target>` next to the run dir).",
                },
            },
        },
    },
}

_VALIDATOR = jsonschema.Draft202012Validator(SPEC_JSON_SCHEMA)


# -- model ---------------------------------------------------------------------------------------


def _check_readable(where: str, path: str) -> None:
    """SpecError when the file the spec names at `where` is missing or unreadable here."""
    if not os.path.isfile(path):
        raise SpecError(f"spec: {where} file {path} does not exist")
    if not os.access(path, os.R_OK):
        raise SpecError(f"spec: {where} file {path} is not readable")


@dataclass(frozen=True)
class TlsSpec:
    trust_certs_file: str | None = None
    allow_insecure: bool = False
    cert_file: str | None = None
    key_file: str | None = None

    def settings(self) -> TlsSettings:
        """The admin client's TLS settings (`verify` is False, a CA bundle path, or True)."""
        verify: bool | str = False if self.allow_insecure else (self.trust_certs_file or True)
        return TlsSettings(verify=verify, cert_file=self.cert_file, key_file=self.key_file)

    def files(self) -> dict[str, str]:
        """The file paths these settings name, by field (trust_certs_file, cert_file, key_file)."""
        named = {"trust_certs_file": self.trust_certs_file, "cert_file": self.cert_file, "key_file": self.key_file}
        return {name: path for name, path in named.items() if path}

    def to_dict(self) -> dict[str, Any]:
        return {"trust_certs_file": self.trust_certs_file, "allow_insecure": self.allow_insecure,
                "cert_file": self.cert_file, "key_file": self.key_file}


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    admin_url: str
    service_url: str
    token_env: str | None = None
    tls: TlsSpec | None = None
    listener_name: str | None = None
    token_file: str | None = None
    oauth2: OAuth2Spec | None = None

    @classmethod
    def from_entry(cls, name: str, entry: Mapping[str, Any]) -> ClusterSpec:
        """One entry of the spec's `clusters` mapping (admin_url, service_url, token_env or token_file, tls,
        listener_name)."""
        tls, oauth = entry.get("tls"), entry.get("oauth2")
        return cls(name=name, admin_url=entry["admin_url"], service_url=entry["service_url"],
                   token_env=entry.get("token_env"), tls=TlsSpec(**tls) if tls is not None else None,
                   listener_name=entry.get("listener_name"), token_file=entry.get("token_file"),
                   oauth2=OAuth2Spec(**oauth) if oauth is not None else None)

    def token(self) -> str | None:
        """The token now (None without auth): from the environment, or read from token_file at each call.
        SpecError when the variable is unset or the file missing, unreadable or empty; with oauth2, the issuer's
        access token (cached), AuthRejected in one line when the issuer gives none."""
        if self.oauth2:
            try:
                return oauth2.access_token(self.oauth2)
            except oauth2.IssuerUnreachable as exc:  # an outage: the step fails (exit 1), a re-run may pass
                raise ClusterUnreachable(f"cluster {self.name}: {exc}", None, self.oauth2.issuer_url) from exc
            except oauth2.OAuth2Error as exc:  # the credentials: a human must change them (exit 2)
                raise AuthRejected(f"cluster {self.name}: {exc}", None, self.oauth2.issuer_url) from exc
        if self.token_file:
            try:
                return tokens.read_file(self.token_file)
            except tokens.TokenFileError as exc:
                raise SpecError(f"spec: clusters.{self.name}.token_file {exc}") from exc
        if not self.token_env:
            return None
        token = os.environ.get(self.token_env)
        if not token:
            raise SpecError(f"spec: environment variable {self.token_env} (token for {self.name}) is not set")
        return token

    @property
    def credential(self) -> str:
        """Where this cluster's token comes from, for the one line a refusal prints (never the token)."""
        if self.oauth2:
            return f"an OAuth2 token from {self.oauth2.issuer_url}"
        if self.token_file:
            return f"the token in file {self.token_file}"
        return f"the token in {self.token_env}" if self.token_env else "no token (token_env is null)"

    def client_token(self) -> str:
        """token_file's token for the Pulsar client's supplier, which the C++ client calls at each connection:
        it must not raise (the binding prints the error and sends an empty token, which the broker refuses)."""
        try:
            return self.token() or ""
        except SpecError as exc:
            log.error("%s", exc)
            return ""

    def _fresh_oauth2_token(self) -> str:
        assert self.oauth2 is not None
        return oauth2.access_token(self.oauth2, fresh=True)

    def expired_token_note(self) -> str | None:
        """`the token in VAR (cluster X) expired at T` once its `exp` has passed (None otherwise, or without one)."""
        if self.oauth2:  # fetched again when refused: its expiry explains nothing
            return None
        try:
            token = self.token() if self.token_file else os.environ.get(self.token_env) if self.token_env else None
        except SpecError:
            return None
        expired = tokens.expired_note(tokens.expiry(token))
        return f"{self.credential} (cluster {self.name}) {expired}" if expired else None

    def check_tls_files(self) -> None:
        """SpecError naming the first TLS file this cluster names that is missing or unreadable here."""
        for name, path in (self.tls.files() if self.tls else {}).items():
            _check_readable(f"clusters.{self.name}.tls.{name}", path)

    def admin(self, *, token: str | None = None, **kwargs: Any) -> PulsarAdmin:
        """An admin client for this cluster; kwargs go to PulsarAdmin (timeout_s, retries). `token` instead of
        the one in the environment variable, for a caller that holds it (PulsarHook: the connection's)."""
        tls = self.tls.settings() if self.tls else None
        credential = "the given token" if token else self.credential
        # A token file is read again when the cluster refuses the token in use (renewed in place meanwhile).
        source = None if token else self.token if self.token_file else self._fresh_oauth2_token if self.oauth2 else None
        return PulsarAdmin(self.admin_url, token=token or self.token(), tls=tls, name=self.name,
                           credential=credential, token_source=source, **kwargs)

    def pulsar_client(self, url: str | None = None, **kwargs: Any) -> pulsar.Client:
        """A pulsar.Client on service_url (or `url`, e.g. the lookup service in front of this cluster) with this
        cluster's auth and TLS; kwargs go to pulsar.Client."""
        import pulsar  # deferred: the C++ client is only needed by steps that move messages

        if self.oauth2:  # the client runs the flow itself, from the same issuer and credentials file
            kwargs.setdefault("authentication", pulsar.AuthenticationOauth2(self.oauth2.client_params()))
        token: Any = None if self.oauth2 else self.token()
        if token and self.token_file:
            token = self.client_token  # read at each connection: a token renewed in the file reaches new ones
        # The client's own INFO log is per connection and per producer; a Python logger here could
        # deadlock (the C++ log thread needs the GIL while a blocking call holds it).
        kwargs.setdefault("logger", pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
        if token:
            kwargs.setdefault("authentication", pulsar.AuthenticationToken(token))
        if self.listener_name:
            kwargs.setdefault("listener_name", self.listener_name)
        if self.tls:
            kwargs.setdefault("tls_allow_insecure_connection", self.tls.allow_insecure)
            if self.tls.trust_certs_file:
                kwargs.setdefault("tls_trust_certs_file_path", self.tls.trust_certs_file)
            if self.tls.cert_file:
                kwargs.setdefault("tls_certificate_file_path", self.tls.cert_file)
            if self.tls.key_file:
                kwargs.setdefault("tls_private_key_file_path", self.tls.key_file)
        return pulsar.Client(url or self.service_url, **kwargs)

    def to_dict(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"admin_url": self.admin_url, "service_url": self.service_url,
                                 "token_env": self.token_env,
                                 "tls": self.tls.to_dict() if self.tls else None}
        if self.listener_name:  # only when set: a spec without one keeps the hash its run directories record
            entry["listener_name"] = self.listener_name
        if self.token_file:  # likewise
            entry["token_file"] = self.token_file
        if self.oauth2:  # likewise
            entry["oauth2"] = self.oauth2.to_dict()
        return entry


@dataclass(frozen=True)
class TopicFilter:
    include: tuple[re.Pattern[str], ...] = (re.compile(".*"),)
    exclude: tuple[re.Pattern[str], ...] = ()

    @classmethod
    def of(cls, include: Sequence[str] = (".*",), exclude: Sequence[str] = ()) -> TopicFilter:
        """A filter from regex strings."""
        return cls(tuple(re.compile(p) for p in include), tuple(re.compile(p) for p in exclude))

    def selects(self, local_name: str) -> bool:
        """Whether `<namespace>/<topic>` (e.g. "ns1/orders") is migrated."""
        return any(p.search(local_name) for p in self.include) and not any(p.search(local_name) for p in self.exclude)

    def to_dict(self) -> dict[str, list[str]]:
        return {"include": [p.pattern for p in self.include], "exclude": [p.pattern for p in self.exclude]}


@dataclass(frozen=True)
class MigrationSpec:
    tenant: str
    source: str
    target: str
    clusters: dict[str, ClusterSpec]
    namespaces: tuple[str, ...] | None = None
    topics: TopicFilter = field(default_factory=TopicFilter)
    replication_mode: str = "copy"
    lookup_url: str | None = None
    lookup_token_env: str | None = None
    lookup_trust_certs_file: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    # rollback_lookup's reverse spec (sides swapped); never in the document.
    rolling_back: bool = False

    @property
    def source_cluster(self) -> ClusterSpec:
        return self.clusters[self.source]

    @property
    def target_cluster(self) -> ClusterSpec:
        return self.clusters[self.target]

    @property
    def proceed_on_conflict(self) -> bool:
        return bool(self.options.get("proceed_on_conflict", False))

    @property
    def admin_concurrency(self) -> int:
        """Admin API calls in flight per Spark task (options.admin_concurrency, validated 1..64)."""
        return int(self.options.get("admin_concurrency", ADMIN_CONCURRENCY_DEFAULT))

    @property
    def copy_max_in_flight(self) -> int:
        return int(self.options.get("copy_max_in_flight", COPY_MAX_IN_FLIGHT_DEFAULT))

    @property
    def progress_interval_s(self) -> int:
        """Seconds between a running copy's progress lines (options.progress_interval_s)."""
        return int(self.options.get("progress_interval_s", PROGRESS_INTERVAL_DEFAULT_S))

    @property
    def trust_source_entry_filters(self) -> bool:
        """Copy topics behind source entry filters anyway (options.trust_source_entry_filters)."""
        return bool(self.options.get("trust_source_entry_filters", False))

    @property
    def copy_caps(self) -> Caps:
        """The run's rate caps (options.copy_max_mb_per_s and copy_max_msgs_per_s)."""
        msgs = self.options.get("copy_max_msgs_per_s")
        return Caps(self.copy_max_bytes_per_s, float(msgs) if msgs is not None else None)

    @property
    def copy_max_bytes_per_s(self) -> float | None:
        """The run's cap on source payload bytes read per second (options.copy_max_mb_per_s); None: no cap."""
        mb = self.options.get("copy_max_mb_per_s")
        return float(mb) * 1e6 if mb is not None else None

    @property
    def delayed_delivery_horizon_s(self) -> int:
        return int(self.options.get("delayed_delivery_horizon_s", -1))

    @property
    def copy_engine(self) -> str:
        return str(self.options.get("copy_engine", "auto"))

    @property
    def backfill_sink(self) -> str:
        return str(self.options.get("backfill_sink", "pulsar"))

    @property
    def archive_path(self) -> str | None:
        return self.options.get("archive_path")

    @property
    def follows_run_dir(self) -> str | None:
        return self.options.get("follows_run_dir")

    @property
    def geo_timeout_s(self) -> int:
        return int(self.options.get("geo_timeout_s", GEO_TIMEOUT_DEFAULT_S))

    def namespace_selected(self, namespace: str) -> bool:
        """Whether a namespace is migrated; takes the short name, or `tenant/ns` of this spec's tenant."""
        tenant, slash, short = namespace.rpartition("/")
        if slash and tenant != self.tenant:
            return False
        return self.namespaces is None or short in self.namespaces

    def lookup_token(self) -> str | None:
        """The lookup service's admin token from the environment (None without auth)."""
        if not self.lookup_token_env:
            return None
        token = os.environ.get(self.lookup_token_env)
        if not token:
            raise SpecError(f"spec: environment variable {self.lookup_token_env} (token for the lookup service) "
                            "is not set")
        return token

    def check_environment(self) -> None:
        """SpecError naming the first token variable that is referenced but unset, or the first TLS file that
        is missing or unreadable (run where the clients are built: the Spark driver)."""
        ordered = [self.source, self.target, *(n for n in self.clusters if n not in (self.source, self.target))]
        for name in ordered:
            cluster = self.clusters[name]
            if cluster.oauth2:  # the issuer is asked at the step's first call, not here
                _check_readable(f"clusters.{name}.oauth2.credentials_file", cluster.oauth2.credentials_file)
            else:
                cluster.token()
            cluster.check_tls_files()
        self.lookup_token()
        if self.lookup_trust_certs_file:
            _check_readable("lookup.trust_certs_file", self.lookup_trust_certs_file)

    def lookup_admin(self) -> LookupAdmin:
        """A client of the lookup service's admin API (lookup.url) with its token and authority."""
        from pulsar_migration.lookup.client import LookupAdmin

        assert self.lookup_url is not None
        return LookupAdmin(self.lookup_url, self.lookup_token(), verify=self.lookup_trust_certs_file or True)

    def check_credentials(self) -> None:
        """AuthRejected (one line naming the cluster and the variable) when the source or target refuses the
        credentials: checked before a step touches anything, so a bad token changes nothing anywhere."""
        for name in dict.fromkeys([self.source, self.target]):
            try:
                admin = self.clusters[name].admin(timeout_s=10.0, retries=0)
            except ClusterUnreachable:  # an OAuth2 issuer not answering: the first real call reports it
                log.debug("credential check on %s inconclusive", name, exc_info=True)
                continue
            try:
                admin.check_credentials()
            finally:
                admin.close()
            cluster = self.clusters[name]
            warning = None if cluster.oauth2 else tokens.lifetime_warning(  # OAuth2 tokens are fetched anew
                admin.token_expiry, f"cluster {name}: {admin.credential}", renewable=bool(cluster.token_file))
            if warning:
                log.warning("%s", warning)

    def expired_tokens_note(self) -> str | None:
        """Why a run that stopped may have stopped: the source's or target's token expired while it ran."""
        notes = [note for name in dict.fromkeys([self.source, self.target])
                 if (note := self.clusters[name].expired_token_note())]
        return "; ".join(notes) if notes else None

    # -- (de)serialisation -----------------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: Any) -> MigrationSpec:
        """Validates a parsed document (SpecError, one line) and builds the spec, defaults filled in."""
        _check_schema(data)
        d = copy.deepcopy(data)
        clusters = {name: ClusterSpec.from_entry(name, c) for name, c in d["clusters"].items()}
        topics = d.get("topics") or {}
        lookup = d.get("lookup") or {}
        namespaces = d.get("namespaces")
        spec_fields = {
            "tenant": d["tenant"],
            "source": d["source"],
            "target": d["target"],
            "clusters": clusters,
            "namespaces": tuple(namespaces) if namespaces is not None else None,
            "include": list(topics.get("include", [".*"])),
            "exclude": list(topics.get("exclude", [])),
            "lookup_url": lookup.get("url"),
            "replication_mode": (d.get("replication") or {}).get("mode", "copy"),
            "options": d.get("options") or {},
        }
        _check_semantics(spec_fields)
        return cls(
            tenant=d["tenant"],
            source=d["source"],
            target=d["target"],
            clusters=clusters,
            namespaces=spec_fields["namespaces"],
            topics=TopicFilter.of(spec_fields["include"], spec_fields["exclude"]),
            replication_mode=spec_fields["replication_mode"],
            lookup_url=lookup.get("url"),
            lookup_token_env=lookup.get("token_env"),
            lookup_trust_certs_file=lookup.get("trust_certs_file"),
            options=dict(d.get("options") or {}),
        )

    @classmethod
    def from_json(cls, text: str, origin: str = "the document") -> MigrationSpec:
        try:
            data = json.loads(text, object_pairs_hook=_no_duplicate_keys)
        except json.JSONDecodeError as exc:
            raise SpecError(f"spec: {origin} is not valid JSON: {exc}") from exc
        return cls.from_dict(data)

    @classmethod
    def load(cls, path_or_uri: str, spark: SparkSession | None = None) -> MigrationSpec:
        """Reads and validates a spec file: a local path or file:// URI (others through Spark's Hadoop FS)."""
        from pulsar_migration import rundir

        try:
            text = rundir.read_uri(path_or_uri, spark)
        except (OSError, ValueError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
            raise SpecError(f"spec: cannot read {path_or_uri}: {reason}") from exc
        return cls.from_json(text, origin=path_or_uri)

    def to_dict(self) -> dict[str, Any]:
        """The full document, defaults filled in; from_dict(to_dict()) == self."""
        return {
            "tenant": self.tenant,
            "source": self.source,
            "target": self.target,
            "clusters": {name: c.to_dict() for name, c in self.clusters.items()},
            "namespaces": list(self.namespaces) if self.namespaces is not None else None,
            "topics": self.topics.to_dict(),
            "replication": {"mode": self.replication_mode},
            # trust_certs_file only when set: a spec without one keeps the hash its run directories record
            "lookup": {"url": self.lookup_url, "token_env": self.lookup_token_env,
                       **({"trust_certs_file": self.lookup_trust_certs_file} if self.lookup_trust_certs_file
                          else {})},
            "options": copy.deepcopy(self.options),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def spec_hash(self) -> str:
        """First 16 hex digits of the sha256 of the canonical JSON (identifies the spec in reports)."""
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


# -- validation ----------------------------------------------------------------------------------


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise SpecError(f"spec: duplicate field {key!r}")
        result[key] = value
    return result


def _check_schema(data: Any) -> None:
    errors = list(_VALIDATOR.iter_errors(data))
    if errors:
        raise SpecError(_describe(min(errors, key=_error_rank)))


# At one depth, an unknown field explains more than the missing one it was probably meant to be.
_VALIDATOR_RANK = {"additionalProperties": 0, "propertyNames": 1, "required": 2, "type": 3}


def _error_rank(error: jsonschema.ValidationError) -> tuple[int, int, str]:
    kind = "propertyNames" if "propertyNames" in error.schema_path else str(error.validator)
    return len(error.absolute_path), _VALIDATOR_RANK.get(kind, 9), _where(error.absolute_path)


def _where(path: Any) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    for pytype, name in ((dict, "object"), (list, "array"), (str, "string"), (int, "integer"), (float, "number")):
        if isinstance(value, pytype):
            return name
    return type(value).__name__


def _describe(error: jsonschema.ValidationError) -> str:
    """One line for the first schema error, in the spec's own terms."""
    where = _where(error.absolute_path)
    at = f"in {where}" if where else "at top level"
    kind = str(error.validator)
    schema = error.schema if isinstance(error.schema, dict) else {}
    if "propertyNames" in error.schema_path:
        return f"spec: cluster name {error.instance!r} in {where} is not a valid Pulsar name ({_NAME_RULE})"
    if kind == "additionalProperties":
        unknown = [k for k in error.instance if k not in schema.get("properties", {})]
        names = ", ".join(repr(k) for k in unknown)
        return f"spec: unknown field{'s' if len(unknown) > 1 else ''} {names} {at}"
    if kind == "required":
        missing = [k for k in error.validator_value if k not in error.instance]
        names = ", ".join(repr(k) for k in missing)
        suffix = f" in {where}" if where else ""
        return f"spec: missing field{'s' if len(missing) > 1 else ''} {names}{suffix}"
    subject = where or "the document"
    if kind == "type":
        expected = error.validator_value
        expected = " or ".join(expected) if isinstance(expected, list) else expected
        return f"spec: {subject} must be {expected}, got {_json_type(error.instance)}"
    if kind == "pattern":
        if where.endswith("token_env"):
            # Never echo the value: a token pasted here by mistake must not reach a log.
            return f"spec: {where} must be the name of an environment variable (letters, digits, _), not a token"
        if where.startswith("namespaces[") and "/" in str(error.instance):
            short = str(error.instance).rsplit("/", 1)[-1]
            return f"spec: {where} {error.instance!r} must be a short name without '/' (e.g. {short!r})"
        return f"spec: {where} {error.instance!r} is not a valid Pulsar name ({_NAME_RULE})"
    if kind == "enum":
        allowed = ", ".join(repr(v) for v in error.validator_value)
        return f"spec: {where} must be one of {allowed}, got {error.instance!r}"
    if kind in ("minimum", "maximum"):
        low, high = schema.get("minimum"), schema.get("maximum")
        if low is not None and high is not None:
            return f"spec: {where} must be between {low} and {high}, got {error.instance!r}"
        bound = f"at least {low}" if kind == "minimum" else f"at most {high}"
        return f"spec: {where} must be {bound}, got {error.instance!r}"
    if kind == "exclusiveMinimum":
        return f"spec: {where} must be above {error.validator_value}, got {error.instance!r}"
    if kind == "minLength":
        return f"spec: {where} must not be empty"
    if kind == "minItems" and where == "namespaces":
        return "spec: namespaces must list at least one namespace, or be null for all"
    if kind == "uniqueItems":
        return f"spec: {where} lists a value twice"
    return f"spec: {subject}: {error.message}"


def _check_semantics(s: dict[str, Any]) -> None:
    clusters: dict[str, ClusterSpec] = s["clusters"]
    known = ", ".join(sorted(clusters)) or "none"
    for role in ("source", "target"):
        if s[role] not in clusters:
            raise SpecError(f"spec: {role} {s[role]!r} is not one of clusters ({known})")
    if s["source"] == s["target"]:
        raise SpecError(f"spec: source and target are both {s['source']!r}; they must differ")
    for name, c in clusters.items():
        _check_url(f"clusters.{name}.admin_url", c.admin_url, ("http", "https"))
        _check_url(f"clusters.{name}.service_url", c.service_url, ("pulsar", "pulsar+ssl"))
        given = tokens.credentials_given(c.to_dict())
        if len(given) > 1:
            raise SpecError(f"spec: clusters.{name} sets {' and '.join(given)}; give one")
        if c.oauth2:
            _check_url(f"clusters.{name}.oauth2.issuer_url", c.oauth2.issuer_url, ("http", "https"))
        if c.tls and c.tls.key_file and not c.tls.cert_file:
            raise SpecError(f"spec: clusters.{name}.tls.key_file is set but cert_file is not")
    if s["lookup_url"] is not None:
        _check_url("lookup.url", s["lookup_url"], ("http", "https"))
    for cap in ("copy_max_mb_per_s", "copy_max_msgs_per_s"):
        if s["replication_mode"] == "geo" and s["options"].get(cap) is not None:
            raise SpecError(f"spec: options.{cap} caps copy mode only; cap geo-replication with the source "
                            "namespaces' replicator dispatch rate "
                            "(pulsar-admin namespaces set-replicator-dispatch-rate)")
    for kind in ("include", "exclude"):
        for i, pattern in enumerate(s[kind]):
            try:
                re.compile(pattern)
            except re.error as exc:
                raise SpecError(f"spec: topics.{kind}[{i}] is not a valid regex: {exc}") from exc


def _check_url(where: str, url: str, schemes: tuple[str, ...]) -> None:
    parsed = urlparse(url)
    if parsed.scheme not in schemes or not parsed.netloc:
        wanted = " or ".join(f"{s}://host:port" for s in schemes)
        raise SpecError(f"spec: {where} {url!r} must look like {wanted}")


# -- CLI -----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pulsar_migration.spec", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("schema", help="print the spec's JSON schema")
    validate = commands.add_parser("validate", help="validate a spec file")
    validate.add_argument("file")
    validate.add_argument("--check-env", action="store_true",
                          help="also require every token variable to be set and every TLS file to be readable")
    args = parser.parse_args(argv)

    if args.command == "schema":
        sys.stdout.write(json.dumps(SPEC_JSON_SCHEMA, indent=2) + "\n")
        return 0
    try:
        spec = MigrationSpec.load(args.file)
        if args.check_env:
            spec.check_environment()
    except SpecError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    sys.stdout.write(f"ok: {args.file}: tenant {spec.tenant}, {spec.source} -> {spec.target}, "
                     f"spec {spec.spec_hash()}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
