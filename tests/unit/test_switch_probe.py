"""The switch probe's trust: one file for the C++ client, from the lookup service's and the target's authorities."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pulsar_migration.spec import MigrationSpec
from pulsar_migration.switch.probe import trust_bundle


def spec(lookup_trust: str | None, target_trust: str | None) -> MigrationSpec:
    doc: dict[str, Any] = {
        "tenant": "t", "source": "a", "target": "b",
        "clusters": {n: {"admin_url": f"https://{n}:8443", "service_url": f"pulsar+ssl://{n}:6651"} for n in "ab"},
        "lookup": {"url": "https://lookup:8443", "token_env": None}}
    if lookup_trust:
        doc["lookup"]["trust_certs_file"] = lookup_trust
    if target_trust:
        doc["clusters"]["b"]["tls"] = {"trust_certs_file": target_trust}
    return MigrationSpec.from_dict(doc)


def test_one_authority_is_used_as_it_is_and_none_gives_none(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("CA\n")
    assert trust_bundle(spec(None, None), tmp_path / "run") is None
    assert trust_bundle(spec(str(ca), None), tmp_path / "run") == str(ca)
    assert trust_bundle(spec(None, str(ca)), tmp_path / "run") == str(ca)
    assert trust_bundle(spec(str(ca), str(ca)), tmp_path / "run") == str(ca)
    assert not (tmp_path / "run").exists()  # nothing written when no join is needed


def test_two_authorities_are_joined_in_the_run_directory(tmp_path: Path) -> None:
    lookup_ca, brokers_ca = tmp_path / "lookup-ca.pem", tmp_path / "brokers-ca.pem"
    lookup_ca.write_text("LOOKUP CA")  # no final newline: the join must still keep the two apart
    brokers_ca.write_text("BROKERS CA\n")
    bundle = trust_bundle(spec(str(lookup_ca), str(brokers_ca)), tmp_path / "run")
    assert bundle == str(tmp_path / "run" / "probe-trust.pem")
    assert Path(bundle).read_text() == "LOOKUP CA\nBROKERS CA\n"
