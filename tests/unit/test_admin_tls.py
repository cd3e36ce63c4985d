"""The admin client over TLS against a local HTTPS server with a private authority that requires client
certificates (localdev.pulsar_tls makes the certificates): the spec's authority is trusted on every path, also
when REQUESTS_CA_BUNDLE names another bundle (requests lets it win over a session's own setting), and a failed
handshake is one line that names the spec field to look at."""

from __future__ import annotations

import http.server
import json
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from localdev.pulsar_tls import LocalTls
from pulsar_migration.admin import ClusterUnreachable, PulsarAdmin, TlsSettings, tls_failure
from pulsar_migration.metadata.inventory import registration_payload
from pulsar_migration.spec import ClusterSpec, TlsSpec


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> LocalTls:
    return LocalTls(tmp_path_factory.mktemp("tls")).ensure()


@pytest.fixture(scope="module")
def server(tls: LocalTls) -> Iterator[str]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls.broker_cert, tls.broker_key)
    context.load_verify_locations(tls.ca_cert)
    context.verify_mode = ssl.CERT_REQUIRED
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def admin(url: str, tls: LocalTls, *, ca: bool = True, cert: bool = True) -> PulsarAdmin:
    settings = TlsSettings(verify=str(tls.ca_cert) if ca else True, cert_file=str(tls.client_cert) if cert else None,
                           key_file=str(tls.client_key) if cert else None)
    return PulsarAdmin(url, tls=settings, retries=0, timeout_s=5, name="cluster-t")


def test_the_specs_authority_is_trusted_on_both_paths_whatever_requests_ca_bundle_says(
        server: str, tls: LocalTls, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", ssl.get_default_verify_paths().cafile or "/nonexistent")
    client = admin(server, tls)
    try:
        assert client.get("/clusters")["path"] == "/admin/v2/clusters"  # the kept-alive getter
        answer = client.get("/clusters", params={"x": "1"})  # requests, where the environment is merged in
        assert answer["path"] == "/admin/v2/clusters?x=1"
    finally:
        client.close()


@pytest.mark.parametrize("ca, cert, field", [(False, True, "tls.trust_certs_file"),
                                             (True, False, "tls.cert_file")])
def test_a_failed_handshake_is_one_line_naming_the_spec_field(server: str, tls: LocalTls, ca: bool, cert: bool,
                                                               field: str) -> None:
    client = admin(server, tls, ca=ca, cert=cert)
    try:
        with pytest.raises(ClusterUnreachable) as failed:
            client.get("/clusters", params={"x": "1"})
    finally:
        client.close()
    line = str(failed.value)
    assert "\n" not in line and line.startswith("cluster cluster-t: TLS handshake with https://127.0.0.1:")
    assert f"clusters.cluster-t.{field}" in line, line


def test_a_peer_registration_carries_the_client_certificate_for_mutual_tls(tls: LocalTls) -> None:
    spec = ClusterSpec("f", "https://h:8448", "pulsar+ssl://h:6756",
                       tls=TlsSpec(trust_certs_file=str(tls.ca_cert), cert_file=str(tls.client_cert),
                                   key_file=str(tls.client_key)))
    payload = registration_payload(spec, with_auth=False)
    assert payload["brokerServiceUrlTls"] == "pulsar+ssl://h:6756" and "brokerServiceUrl" not in payload
    assert payload["brokerClientCertificateFilePath"] == str(tls.client_cert)
    assert payload["brokerClientKeyFilePath"] == str(tls.client_key)
    only_ca = registration_payload(ClusterSpec("f", "https://h:8448", "pulsar+ssl://h:6756",
                                               tls=TlsSpec(trust_certs_file=str(tls.ca_cert))), with_auth=False)
    assert "brokerClientCertificateFilePath" not in only_ca


def test_the_local_authority_is_made_once(tls: LocalTls) -> None:
    before = tls.ca_cert.read_bytes()
    assert tls.ensure().ca_cert.read_bytes() == before
    assert oct(tls.client_key.stat().st_mode & 0o777) == "0o600"
    assert Path(tls.spec_entry(5)["tls"]["cert_file"]) == tls.client_cert


def test_a_server_hanging_up_inside_the_handshake_is_read_as_a_missing_client_certificate() -> None:
    """TLS 1.3 sends the refusal of a client certificate after the client's side of the handshake is done: now and
    then the client reads only the end of the connection (seen 18 times in 300 against a local server)."""
    eof = ("Max retries exceeded (Caused by SSLError(SSLEOFError(8, "
           "'EOF occurred in violation of protocol (_ssl.c:2427)')))")
    assert "clusters.b.tls.cert_file" in tls_failure(RuntimeError(eof), "clusters.b.tls")
    assert tls_failure(RuntimeError("Connection refused"), "clusters.b.tls") is None
