"""TLS for a local cluster: a private certificate authority, a broker certificate it signs (for 127.0.0.1 and
localhost) and a client certificate for mutual TLS, kept under var/tls/ (keys mode 600, never in git).

A cluster started with `broker_overrides(cluster)` serves TLS on its own ports (web 8443+i, broker 6751+i) and
refuses a TLS connection that shows no certificate signed by the authority; its plain ports stay for the local
tooling (health checks, the peers' registrations). `spec_entry` is how a migration spec reaches it over TLS only:
a client that does not trust the private authority, or shows no client certificate, gets nowhere.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from localdev.paths import var_dir

VALID_DAYS = 3650
CLIENT_ROLE = "pm-admin"


def tls_dir() -> Path:
    return var_dir() / "tls"


def web_tls_port(index: int) -> int:
    return 8443 + index


def broker_tls_port(index: int) -> int:
    return 6751 + index


@dataclass(frozen=True)
class LocalTls:
    """The local authority and the two certificates it signs (made once, kept)."""

    root: Path

    @classmethod
    def default(cls) -> LocalTls:
        return cls(tls_dir())

    @property
    def ca_cert(self) -> Path:
        return self.root / "ca.cert.pem"

    @property
    def broker_cert(self) -> Path:
        return self.root / "broker.cert.pem"

    @property
    def broker_key(self) -> Path:
        return self.root / "broker.key-pk8.pem"

    @property
    def client_cert(self) -> Path:
        return self.root / "client.cert.pem"

    @property
    def client_key(self) -> Path:
        return self.root / "client.key-pk8.pem"

    def ensure(self) -> LocalTls:
        """All five files exist (idempotent: a complete set is kept, a partial one made again)."""
        files = (self.ca_cert, self.broker_cert, self.broker_key, self.client_cert, self.client_key)
        if all(path.is_file() for path in files):
            return self
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        ca_key = _new_key()
        ca_name = _name("pm-local-ca")
        ca = _sign(_builder(ca_name, ca_name, ca_key)
                   .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True), ca_key)
        broker_key = _new_key()
        broker = _sign(_builder(_name("pm-local-broker"), ca_name, broker_key)
                       .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                                   x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                                      critical=False)
                       .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False),
                       ca_key)
        client_key = _new_key()
        client = _sign(_builder(_name(CLIENT_ROLE), ca_name, client_key)
                       .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False),
                       ca_key)
        for path, cert in ((self.ca_cert, ca), (self.broker_cert, broker), (self.client_cert, client)):
            path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        for path, key in ((self.broker_key, broker_key), (self.client_key, client_key)):
            _write_private(path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()))
        return self

    def broker_settings(self, index: int) -> dict[str, str]:
        """Broker settings for TLS ports beside the plain ones, client certificates required on them."""
        return {
            "brokerServicePortTls": str(broker_tls_port(index)), "webServicePortTls": str(web_tls_port(index)),
            "tlsCertificateFilePath": str(self.broker_cert), "tlsKeyFilePath": str(self.broker_key),
            "tlsTrustCertsFilePath": str(self.ca_cert), "tlsRequireTrustedClientCertOnConnect": "true",
            "tlsAllowInsecureConnection": "false",
        }

    def broker_overrides(self, index: int) -> str:
        """broker_settings as PM_PULSAR_CONF_<NAME> settings (pulsar_local.start_with_overrides)."""
        return ",".join(f"{key}={value}" for key, value in self.broker_settings(index).items())

    def spec_entry(self, index: int, *, client_certificate: bool = True) -> dict[str, Any]:
        """A spec's `clusters` entry reaching local cluster `index` over TLS only."""
        tls: dict[str, Any] = {"trust_certs_file": str(self.ca_cert), "allow_insecure": False,
                               "cert_file": None, "key_file": None}
        if client_certificate:
            tls.update(cert_file=str(self.client_cert), key_file=str(self.client_key))
        return {"admin_url": f"https://127.0.0.1:{web_tls_port(index)}",
                "service_url": f"pulsar+ssl://127.0.0.1:{broker_tls_port(index)}", "token_env": None, "tls": tls}

    def client_conf(self, index: int) -> Path:
        """A client.conf for the distribution's own tools (`PULSAR_CLIENT_CONF`) over TLS with the client
        certificate (the TLS authentication plugin only shows it: the broker authenticates nobody)."""
        path = self.root / f"client-{index}.conf"
        path.write_text("\n".join([
            f"webServiceUrl=https://127.0.0.1:{web_tls_port(index)}",
            f"brokerServiceUrl=pulsar+ssl://127.0.0.1:{broker_tls_port(index)}",
            f"tlsTrustCertsFilePath={self.ca_cert}", "tlsAllowInsecureConnection=false",
            "authPlugin=org.apache.pulsar.client.impl.auth.AuthenticationTls",
            f"authParams=tlsCertFile:{self.client_cert},tlsKeyFile:{self.client_key}", "",
        ]))
        return path


def _new_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(subject: x509.Name, issuer: x509.Name, key: rsa.RSAPrivateKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS)))


def _sign(builder: x509.CertificateBuilder, key: rsa.RSAPrivateKey) -> x509.Certificate:
    return builder.sign(key, hashes.SHA256())


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
