"""The lookup service's configuration: TLS entries for the clusters it forwards to and for itself."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pytest
from localdev.pulsar_tls import LocalTls
from pulsar_migration.lookup.config import ConfigError, LookupConfig


def config(**extra: Any) -> dict[str, Any]:
    return {"clusters": {"a": {"http_url": "http://a:8080"}}, "default_cluster": "a", **extra}


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> LocalTls:
    return LocalTls(tmp_path_factory.mktemp("tls")).ensure()


def test_a_cluster_without_tls_is_verified_by_the_system_store() -> None:
    assert LookupConfig.from_dict(config()).clusters["a"].ssl_context() is True


def test_a_cluster_with_a_private_authority_and_a_client_certificate(tls: LocalTls) -> None:
    entry = {"http_url": "https://f:8448", "tls": {"trust_certs_file": str(tls.ca_cert),
                                                   "cert_file": str(tls.client_cert), "key_file": str(tls.client_key)}}
    parsed = LookupConfig.from_dict({**config(), "clusters": {"a": entry}})
    context = parsed.clusters["a"].ssl_context()
    assert isinstance(context, ssl.SSLContext) and context.verify_mode == ssl.CERT_REQUIRED
    assert any(c["subject"] == ((("commonName", "pm-local-ca"),),) for c in context.get_ca_certs())
    insecure = LookupConfig.from_dict({**config(), "clusters": {"a": {**entry, "tls": {"allow_insecure": True}}}})
    assert insecure.clusters["a"].ssl_context().verify_mode == ssl.CERT_NONE


def test_serving_over_https_needs_both_files(tls: LocalTls) -> None:
    serving = {"cert_file": str(tls.broker_cert), "key_file": str(tls.broker_key)}
    assert LookupConfig.from_dict(config(tls=serving)).tls == serving
    with pytest.raises(ConfigError, match="tls needs both cert_file and key_file"):
        LookupConfig.from_dict(config(tls={"cert_file": str(tls.broker_cert)}))


@pytest.mark.parametrize("tls_entry, message", [
    ({"trust": "x"}, "clusters.a.tls must be an object with keys from"),
    ({"trust_certs_file": "/nonexistent/ca.pem"}, "clusters.a.tls.trust_certs_file file /nonexistent/ca.pem does not"),
])
def test_a_wrong_cluster_tls_entry_is_one_line(tls_entry: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        LookupConfig.from_dict({**config(), "clusters": {"a": {"http_url": "https://a", "tls": tls_entry}}})


def test_the_specs_lookup_trust_file_travels_and_is_checked(tls: LocalTls, tmp_path: Path) -> None:
    from pulsar_migration.spec import MigrationSpec, SpecError

    doc = {"tenant": "t", "source": "a", "target": "b",
           "clusters": {n: {"admin_url": f"http://{n}:8080", "service_url": f"pulsar://{n}:6650"} for n in "ab"},
           "lookup": {"url": "https://lookup:8443", "token_env": None, "trust_certs_file": str(tls.ca_cert)}}
    spec = MigrationSpec.from_dict(doc)
    assert spec.lookup_admin().verify == str(tls.ca_cert)
    assert MigrationSpec.from_dict(spec.to_dict()) == spec
    spec.check_environment()
    doc["lookup"]["trust_certs_file"] = str(tmp_path / "missing.pem")
    with pytest.raises(SpecError, match=r"lookup\.trust_certs_file file .* does not exist"):
        MigrationSpec.from_dict(doc).check_environment()
    del doc["lookup"]["trust_certs_file"]
    assert "trust_certs_file" not in MigrationSpec.from_dict(doc).to_dict()["lookup"]  # hashes of older specs stay


def test_forwarding_follows_a_brokers_redirect_with_the_token_but_never_from_https_to_http() -> None:
    import asyncio

    import httpx
    from pulsar_migration.lookup.service import get_following

    seen: list[tuple[str, str | None]] = []

    def brokers(request: httpx.Request) -> httpx.Response:
        seen.append((str(request.url), request.headers.get("authorization")))
        if request.url.port == 8081:
            return httpx.Response(307, headers={"Location": "http://b2:9081/lookup/v2/topic/x?authoritative=true"})
        if request.url.host == "secure":
            return httpx.Response(307, headers={"Location": "http://b2:9081/lookup/v2/topic/x"})
        return httpx.Response(200, json={"brokerUrl": "pulsar://b2:7651"})

    async def run() -> tuple[int, int]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(brokers)) as http:
            followed = await get_following(http, "http://b1:8081/lookup/v2/topic/x", {"Authorization": "Bearer c"})
            kept = await get_following(http, "https://secure/lookup/v2/topic/x", {"Authorization": "Bearer c"})
            return followed.status_code, kept.status_code

    assert asyncio.run(run()) == (200, 307)
    assert seen[:2] == [("http://b1:8081/lookup/v2/topic/x", "Bearer c"),
                        ("http://b2:9081/lookup/v2/topic/x?authoritative=true", "Bearer c")]
    assert len(seen) == 3  # the https answer's redirect to http was handed back, not followed


def test_a_clusters_token_file_is_read_at_each_lookup_and_checked_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "a.token"
    path.write_text("first\n")
    cluster = LookupConfig.from_dict({**config(), "clusters": {"a": {"http_url": "http://a:8080",
                                                                     "token_file": str(path)}}}).clusters["a"]
    assert cluster.token() == "first"
    path.write_text("renewed\n")
    assert cluster.token() == "renewed"
    path.unlink()
    with pytest.raises(ConfigError, match=r"^lookup config: clusters\.a\.token_file file .* does not exist$"):
        cluster.token()
    with pytest.raises(ConfigError, match=r"^lookup config: clusters\.a sets token_env and token_file; give one"):
        LookupConfig.from_dict({**config(), "clusters": {"a": {"http_url": "http://a:8080", "token_env": "T",
                                                               "token_file": str(path)}}})
