"""End-to-end encrypted messages: the copy rewrites every message (its two properties, batches rebuilt) and holds
no keys, so it cannot copy them. It says so in one line naming the entry, at once; the reader's default crypto
action used to keep them from it, and the partition failed after a 60 s wait as "stalled". The topic left out by the
spec's exclude, the rest of the tenant copies."""

from __future__ import annotations

from pathlib import Path

import pulsar
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from localdev.pulsar_local import LocalCluster
from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.metadata.step import run as sync_metadata
from pulsar_migration.stepjob import run_step

from tests.conftest import unique
from tests.integration.replication_helpers import client, create_topics, drain, source_tenant
from tests.integration.replication_helpers import replicate as step
from tests.integration.replication_helpers import replicate_report as report
from tests.integration.tenant_builders import write_spec
from tests.integration.test_replicate_topics import cleanup, content


def key_pair(directory: Path) -> pulsar.CryptoKeyReader:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (directory / "priv.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()))
    (directory / "pub.pem").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return pulsar.CryptoKeyReader(str(directory / "pub.pem"), str(directory / "priv.pem"))


def test_encrypted_messages_fail_their_partition_in_one_line_and_an_excluded_topic_lets_the_rest_copy(
    cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin, admin_b: PulsarAdmin, tmp_path: Path,
) -> None:
    tenant = source_tenant(admin_a, cluster_a, unique("it-encrypted"))
    secret, plain = f"persistent://{tenant}/ns/secret", f"persistent://{tenant}/ns/plain"
    create_topics(admin_a, secret, plain)
    keys = key_pair(tmp_path)
    c = client(cluster_a)
    try:
        clear = c.create_producer(secret, batching_enabled=False)
        clear.send(b"clear-before")
        encrypted = c.create_producer(secret, batching_enabled=False, encryption_key="k1", crypto_key_reader=keys)
        sent = encrypted.send(b"secret-0", properties={"i": "0"})
        first_encrypted = (sent.ledger_id(), sent.entry_id())
        encrypted.send(b"secret-1")
        others = c.create_producer(plain, batching_enabled=True, batching_max_publish_delay_ms=20)
        for i in range(50):
            others.send_async(f"p-{i}".encode(), None)
        others.flush()
    finally:
        c.close()
    spec = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b)
    try:
        assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(tmp_path)]) == 0
        assert step(spec, tmp_path / "run") != 0
        parts = {p["topic"]: p for p in report(tmp_path / "run")["details"]["partitions"]}
        assert parts[plain]["status"] == "ok"
        assert parts[secret]["status"] != "ok"
        error = parts[secret]["error"]
        assert f"entry {first_encrypted[0]}:{first_encrypted[1]} of {secret}" in error, error
        assert "end-to-end encrypted" in error and "topics.exclude" in error and "\n" not in error
        assert [m["data"] for m in drain(cluster_b, secret)] == [b"clear-before"]  # what came before it is copied

        excluded = write_spec(tmp_path / "excluded.json", tenant, cluster_a, cluster_b,
                              topics={"include": [".*"], "exclude": ["/secret$"]})
        assert step(excluded, tmp_path / "run") == 0
        assert content(drain(cluster_b, plain)) == content(drain(cluster_a, plain))
    finally:
        cleanup(tenant, admin_a, admin_b)
