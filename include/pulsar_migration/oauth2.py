"""OAuth2 client credentials: a cluster whose brokers take access tokens from an identity provider (Okta, Auth0,
Keycloak, StreamNative Cloud...). The flow is Pulsar's own (`AuthenticationOAuth2` in the Java client,
`AuthOauth2` in the C++ one): the issuer's `/.well-known/openid-configuration` names its token endpoint, a form
POST of `grant_type=client_credentials` with the client id and secret (and audience, scope) answers an
`access_token` with its `expires_in`.

The client id and secret live in a credentials file (Pulsar's key-file format, `{"client_id", "client_secret"}`),
never in the spec. Admin calls take the token from here (cached until shortly before it expires, fetched again
when a cluster refuses it); the Python and Java Pulsar clients run the same flow themselves from the same file.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import requests

log = logging.getLogger(__name__)

# A cached token is fetched again this long before its expiry (at most a tenth of its life), so no call goes out
# with one about to lapse.
EXPIRY_MARGIN_S = 30.0
DEFAULT_EXPIRES_IN_S = 3600.0  # an answer without expires_in (the Java client assumes no expiry either)
TIMEOUT_S = 15.0


class OAuth2Error(ValueError):
    """The issuer refused the client or could not be reached (one line: issuer, client id, reason; no secret)."""


class IssuerUnreachable(OAuth2Error):
    """No answer from the issuer, or none a client could use (an outage, not the credentials: a re-run may pass)."""


@dataclass(frozen=True)
class OAuth2Spec:
    """A cluster's OAuth2 client-credentials settings (the spec's `clusters.<name>.oauth2`)."""

    issuer_url: str
    credentials_file: str
    audience: str | None = None
    scope: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"issuer_url": self.issuer_url, "credentials_file": self.credentials_file,
                "audience": self.audience, "scope": self.scope}

    def client_params(self) -> str:
        """The parameters of the Python client's `AuthenticationOauth2` (its C++ flow reads the file itself)."""
        params = {"issuer_url": self.issuer_url, "private_key": self.credentials_file}
        return json.dumps({**params, **self.extras()})

    def broker_params(self) -> str:
        """The parameters of the Java client's `AuthenticationOAuth2` (a peer registration's replication)."""
        params = {"type": "client_credentials", "issuerUrl": self.issuer_url,
                  "privateKey": f"file://{self.credentials_file}"}
        return json.dumps({**params, **self.extras()})

    def extras(self) -> dict[str, str]:
        """audience and scope, where set: every party of the flow takes them under these names."""
        return {k: v for k, v in (("audience", self.audience), ("scope", self.scope)) if v}

    def _credentials(self) -> tuple[str, str]:
        try:
            with open(self.credentials_file, encoding="utf-8") as handle:
                data = json.load(handle)
        except FileNotFoundError:
            raise OAuth2Error(f"OAuth2 credentials file {self.credentials_file} does not exist") from None
        except (OSError, ValueError) as exc:
            raise OAuth2Error(f"OAuth2 credentials file {self.credentials_file} is not readable JSON "
                              f"({type(exc).__name__})") from None
        if not isinstance(data, dict) or not data.get("client_id") or not data.get("client_secret"):
            raise OAuth2Error(f"OAuth2 credentials file {self.credentials_file} lacks client_id or client_secret")
        return str(data["client_id"]), str(data["client_secret"])


_lock = threading.Lock()
_tokens: dict[OAuth2Spec, tuple[str, float]] = {}  # settings -> (access token, monotonic time to fetch anew)
_endpoints: dict[str, str] = {}  # issuer URL -> token endpoint


def access_token(spec: OAuth2Spec, *, fresh: bool = False) -> str:
    """The access token for `spec`: the cached one unless it is about to lapse (or `fresh`: a cluster refused it),
    else a new one from the issuer. OAuth2Error in one line when that fails."""
    with _lock:
        cached = _tokens.get(spec)
        if cached and not fresh and cached[1] > time.monotonic():
            return cached[0]
        token, lifetime = _fetch(spec)
        _tokens[spec] = (token, time.monotonic() + lifetime - min(EXPIRY_MARGIN_S, lifetime / 10))
        return token


def _fetch(spec: OAuth2Spec) -> tuple[str, float]:
    client_id, secret = spec._credentials()
    form = {"grant_type": "client_credentials", "client_id": client_id, "client_secret": secret}
    form.update(spec.extras())
    endpoint = _token_endpoint(spec.issuer_url)
    where = f"OAuth2 issuer {spec.issuer_url}"
    try:
        resp = requests.post(endpoint, data=form, headers={"Accept": "application/json"}, timeout=TIMEOUT_S)
    except requests.RequestException as exc:
        raise IssuerUnreachable(f"{where} is unreachable at {endpoint}: {type(exc).__name__}") from None
    try:
        body = resp.json()
    except ValueError:
        body = {}
    if resp.status_code != 200 or not isinstance(body, dict) or not body.get("access_token"):
        reason = body.get("error_description") or body.get("error") if isinstance(body, dict) else None
        raise OAuth2Error(f"{where} gave client {client_id} no token (HTTP {resp.status_code}"
                          f"{': ' + str(reason) if reason else ''})")
    expires_in = body.get("expires_in")
    lifetime = float(expires_in) if isinstance(expires_in, (int, float)) and expires_in > 0 else DEFAULT_EXPIRES_IN_S
    log.info("%s: a token for client %s, valid %.0f s", where, client_id, lifetime)
    return str(body["access_token"]), lifetime


def _token_endpoint(issuer_url: str) -> str:
    """The issuer's token endpoint, from its OpenID configuration (asked once per process)."""
    if issuer_url in _endpoints:
        return _endpoints[issuer_url]
    url = issuer_url.rstrip("/") + "/.well-known/openid-configuration"
    try:
        resp = requests.get(url, headers={"Accept": "application/json"}, timeout=TIMEOUT_S)
        endpoint = resp.json().get("token_endpoint") if resp.status_code == 200 else None
    except requests.RequestException as exc:
        raise IssuerUnreachable(f"OAuth2 issuer {issuer_url} is unreachable: {type(exc).__name__}") from None
    except (ValueError, AttributeError):
        endpoint = None
    if not endpoint:
        raise IssuerUnreachable(f"OAuth2 issuer {issuer_url} names no token_endpoint at {url} "
                                f"(HTTP {resp.status_code})")
    _endpoints[issuer_url] = str(endpoint)
    return _endpoints[issuer_url]
