"""The switch's last check: a producer and a reader built like the tenant's clients (service URL the lookup
service, the target's credentials and TLS settings) must land on the cluster the route names now."""

from __future__ import annotations

import os
import ssl
import tempfile
import time
from pathlib import Path
from typing import Any

from pulsar_migration.admin import AdminError
from pulsar_migration.spec import MigrationSpec
from pulsar_migration.stepjob import StepContext, StepFailed

PROBE_NAME = "pulsar-migration-probe"
# The probe's client gives up after this long (the Python client's default); a client refused at the TLS handshake
# keeps retrying until then.
PROBE_TIMEOUT_S = 30


class ProbeFailed(StepFailed):
    """The probe's clients did not reach the target through the lookup service (one line)."""


SYSTEM_STORE = "system"  # a side that names no authority: the system's trust store


def trust_bundle(spec: MigrationSpec, directory: Path) -> str | None:
    """The authorities the probe's client must trust: the lookup service's (`lookup.trust_certs_file`, for its
    HTTPS answers) and the target's (`tls.trust_certs_file`, for the brokers' TLS ports the answers name); a side on
    TLS naming none trusts the system's store. The C++ client takes one file for all (given one, it trusts nothing
    else), so different ones are joined into one in `directory` (local: a run directory may be in an object store);
    None: the system's store alone."""
    target = spec.target_cluster
    wanted = []
    if (spec.lookup_url or "").startswith("https://") or spec.lookup_trust_certs_file:
        wanted.append(spec.lookup_trust_certs_file or SYSTEM_STORE)
    if target.service_url.startswith("pulsar+ssl://") or (target.tls and target.tls.trust_certs_file):
        wanted.append((target.tls.trust_certs_file if target.tls else None) or SYSTEM_STORE)
    files = list(dict.fromkeys(wanted))
    if files == [SYSTEM_STORE] or not files:
        return None
    if len(files) == 1:
        return files[0]
    bundle = directory / "probe-trust.pem"
    bundle.parent.mkdir(parents=True, exist_ok=True)
    try:
        parts = [Path(system_store() if f == SYSTEM_STORE else f).read_bytes().rstrip(b"\n") for f in files]
    except OSError as exc:
        raise ProbeFailed(f"probe: cannot read an authority file for the probe's client ({exc}); the route already "
                          f"names {spec.target}; a re-run probes again") from None
    bundle.write_bytes(b"\n".join(parts) + b"\n")
    return str(bundle)


def system_store() -> str:
    """The system's trust store as one PEM file (what a TLS client given no authority trusts)."""
    paths = ssl.get_default_verify_paths()
    for cafile in (os.environ.get(paths.openssl_cafile_env), paths.cafile, paths.openssl_cafile,
                   "/etc/ssl/certs/ca-certificates.crt"):
        if cafile and os.path.isfile(cafile):
            return cafile
    import certifi  # requests' own store: there whenever the admin client is

    return certifi.where()


def probe(ctx: StepContext, partitions: list[str]) -> dict[str, Any]:
    """A producer and a reader through the lookup service; they must land on the target's brokers."""
    spec = ctx.spec
    if not partitions:
        return {"skipped": "no selected partitions"}
    with tempfile.TemporaryDirectory(prefix="pm-probe-") as scratch:
        return _probe(spec, partitions[0], trust_bundle(spec, Path(scratch)))


def _probe(spec: MigrationSpec, topic: str, trust: str | None) -> dict[str, Any]:
    import pulsar

    tgt_admin = spec.target_cluster.admin()
    # With the target's credentials: the service forwards the client's own token to the cluster.
    trusting = {"tls_trust_certs_file_path": trust} if trust else {}
    client = spec.target_cluster.pulsar_client(spec.lookup_url, operation_timeout_seconds=PROBE_TIMEOUT_S, **trusting)
    try:
        try:
            producer = client.create_producer(topic, producer_name=f"{PROBE_NAME}-{int(time.time())}")
            reader = client.create_reader(topic, pulsar.MessageId.latest)
        except pulsar.PulsarException as exc:
            raise ProbeFailed(
                f"probe: a client through the lookup service at {spec.lookup_url} could not open {topic} ({exc}); the "
                f"route already names {spec.target}, so check how clients reach it (over https: "
                "lookup.trust_certs_file and the target's tls settings); a re-run probes again") from None
        try:
            stats = tgt_admin.get(f"{tgt_admin.topic_path(topic)}/stats")
        except AdminError as exc:
            raise ProbeFailed(f"probe: the probe's clients opened {topic} through the lookup service, but the "
                              f"target {spec.target} did not answer where they are ({exc}); a re-run probes "
                              "again") from None
        producers = [p.get("producerName") for p in stats.get("publishers") or []]
        readers = [s for s, v in (stats.get("subscriptions") or {}).items() if not v.get("isDurable", True)]
        on_target = producer.producer_name() in producers and bool(readers)
        producer.close()
        reader.close()
    finally:
        client.close()
        tgt_admin.close()
    if not on_target:
        raise ProbeFailed(f"probe: a producer and a reader through the lookup service did not land on the target "
                          f"{spec.target} ({topic})")
    return {"topic": topic, "producer_on_target": True, "reader_on_target": True}
