"""Token authentication for the local clusters: a secret key and tokens made by the distribution's own
`bin/pulsar tokens` commands, kept under var/auth/ (mode 600, never in git).

* `secret.key` — the HS256 key every local authenticated cluster verifies tokens with (one issuer for the
  local pair, so each broker's own client token also works on its peer for geo-replication);
* `<role>.token` — a token whose subject is the role: `pm-admin` (the tools' superuser) and `tenant-admin`
  (the role tenants' clients use).

`broker_overrides()` is what a standalone.conf needs to require those tokens and authorize by role.
"""

from __future__ import annotations

import logging
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from localdev.paths import var_dir

log = logging.getLogger(__name__)

SUPERUSER_ROLE = "pm-admin"
TENANT_ADMIN_ROLE = "tenant-admin"
TOKEN_PROVIDER = "org.apache.pulsar.broker.authentication.AuthenticationProviderToken"
TOKEN_CLIENT_PLUGIN = "org.apache.pulsar.client.impl.auth.AuthenticationToken"
TOOL_TIMEOUT_S = 120.0


class AuthSetupError(RuntimeError):
    """The key or a token could not be made."""


def auth_dir() -> Path:
    return var_dir() / "auth"


def token_file(role: str, root: Path | None = None) -> Path:
    """Where the local issuer keeps `role`'s token (under `root`, by default var/auth/)."""
    return (root or auth_dir()) / f"{role}.token"


@dataclass(frozen=True)
class LocalAuth:
    """The local token issuer: where its key and tokens live, and the distribution that makes them."""

    pulsar_home: Path
    root: Path

    @classmethod
    def default(cls, pulsar_home: Path) -> LocalAuth:
        return cls(pulsar_home, auth_dir())

    @property
    def secret_key(self) -> Path:
        return self.root / "secret.key"

    def token_file(self, role: str) -> Path:
        return token_file(role, self.root)

    def token(self, role: str) -> str:
        """The role's token, made on first use."""
        path = self.token_file(role)
        if not path.is_file():
            self._write_private(path, self.create_token(role))
        return path.read_text().strip()

    def ensure(self) -> LocalAuth:
        """The key and the two standing tokens exist (idempotent: existing ones are kept)."""
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        if not self.secret_key.is_file():
            self._tokens_tool("create-secret-key", "--output", str(self.secret_key))
            os.chmod(self.secret_key, 0o600)
            log.info("made a token secret key at %s", self.secret_key)
        for role in (SUPERUSER_ROLE, TENANT_ADMIN_ROLE):
            self.token(role)
        return self

    def create_token(self, role: str, expiry: str | None = None) -> str:
        """A fresh token for `role` (expiry like "5s" or "1h"; None: never expires), signed by the local key."""
        args = ["create", "--secret-key", f"file://{self.secret_key}", "--subject", role]
        if expiry:
            args += ["--expiry-time", expiry]
        token = self._tokens_tool(*args).strip().splitlines()[-1].strip()
        if token.count(".") != 2:
            raise AuthSetupError(f"bin/pulsar tokens create printed no token for role {role}")
        return token

    def broker_overrides(self) -> dict[str, str]:
        """standalone.conf keys: token authentication, authorization by role, and the broker's own client
        (its internal admin calls and geo-replication to peers) authenticated as the superuser."""
        return {
            "authenticationEnabled": "true",
            "authenticationProviders": TOKEN_PROVIDER,
            "tokenSecretKey": f"file://{self.secret_key}",
            "authorizationEnabled": "true",
            "superUserRoles": SUPERUSER_ROLE,
            "brokerClientAuthenticationPlugin": TOKEN_CLIENT_PLUGIN,
            "brokerClientAuthenticationParameters": f"file://{self.token_file(SUPERUSER_ROLE)}",
        }

    def client_conf(self, role: str, admin_url: str, service_url: str) -> Path:
        """A client.conf for the distribution's own tools (`PULSAR_CLIENT_CONF`), reading the token from its
        file, so that no token is ever an argument of `bin/pulsar-admin` or `bin/pulsar-client`."""
        path = self.root / f"client-{role}-{admin_url.rsplit(':', 1)[-1]}.conf"
        self._write_private(path, "\n".join([
            f"webServiceUrl={admin_url}", f"brokerServiceUrl={service_url}",
            f"authPlugin={TOKEN_CLIENT_PLUGIN}", f"authParams=file://{self.token_file(role)}", "",
        ]))
        return path

    def _tokens_tool(self, *args: str) -> str:
        cmd = [str(self.pulsar_home / "bin" / "pulsar"), "tokens", *args]
        env = {**os.environ, "PULSAR_MEM": "-Xms64m -Xmx256m"}  # a JVM per call: keep it small
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=TOOL_TIMEOUT_S, check=False)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise AuthSetupError(f"bin/pulsar tokens {args[0]} failed (exit {proc.returncode}): {' | '.join(tail)}")
        return proc.stdout

    @staticmethod
    def _write_private(path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(text)
