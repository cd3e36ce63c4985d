"""The switch probe's trust: one file for the C++ client, from the lookup service's and the target's authorities."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from pulsar_migration.spec import MigrationSpec
from pulsar_migration.switch.probe import ProbeFailed, system_store, trust_bundle


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
    assert trust_bundle(spec(None, None), tmp_path / "run") is None  # both sides on the system's store
    assert trust_bundle(spec(str(ca), str(ca)), tmp_path / "run") == str(ca)
    plain_brokers = spec(str(ca), None)
    plain_brokers.clusters["b"] = dataclasses.replace(plain_brokers.clusters["b"], service_url="pulsar://b:6650")
    assert trust_bundle(plain_brokers, tmp_path / "run") == str(ca)  # only the lookup service is on TLS
    assert not (tmp_path / "run").exists()  # nothing written when no join is needed


def test_one_private_authority_is_joined_with_the_system_store_the_other_side_needs(tmp_path: Path) -> None:
    """Given one file the C++ client trusts nothing else: a lookup service under a private authority in front of
    brokers with publicly signed certificates (or the reverse) needs both."""
    ca = tmp_path / "private-ca.pem"
    ca.write_text("PRIVATE CA\n")
    system = Path(system_store()).read_text()
    assert "BEGIN CERTIFICATE" in system
    for lookup_trust, target_trust, first in ((str(ca), None, "PRIVATE CA\n"), (None, str(ca), system)):
        bundle = trust_bundle(spec(lookup_trust, target_trust), tmp_path / "run")
        assert bundle == str(tmp_path / "run" / "probe-trust.pem")
        text = Path(bundle).read_text()
        assert text.startswith(first.rstrip("\n")) and "PRIVATE CA" in text and "BEGIN CERTIFICATE" in text


def test_an_authority_file_gone_is_one_probe_line(tmp_path: Path) -> None:
    with pytest.raises(ProbeFailed, match=r"^probe: cannot read an authority file .*gone\.pem.*a re-run probes again$"):
        trust_bundle(spec(str(tmp_path / "gone.pem"), str(tmp_path / "other.pem")), tmp_path / "run")


def test_two_authorities_are_joined_in_the_run_directory(tmp_path: Path) -> None:
    lookup_ca, brokers_ca = tmp_path / "lookup-ca.pem", tmp_path / "brokers-ca.pem"
    lookup_ca.write_text("LOOKUP CA")  # no final newline: the join must still keep the two apart
    brokers_ca.write_text("BROKERS CA\n")
    bundle = trust_bundle(spec(str(lookup_ca), str(brokers_ca)), tmp_path / "run")
    assert bundle == str(tmp_path / "run" / "probe-trust.pem")
    assert Path(bundle).read_text() == "LOOKUP CA\nBROKERS CA\n"
