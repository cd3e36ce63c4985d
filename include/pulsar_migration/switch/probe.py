"""The switch's last check: a producer and a reader built like the tenant's clients (service URL the lookup
service, the target's credentials and TLS settings) must land on the cluster the route names now."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from pulsar_migration.spec import MigrationSpec
from pulsar_migration.stepjob import StepContext, StepFailed

PROBE_NAME = "pulsar-migration-probe"
# The probe's client gives up after this long (the Python client's default); a client refused at the TLS handshake
# keeps retrying until then.
PROBE_TIMEOUT_S = 30


class ProbeFailed(StepFailed):
    """The probe's clients did not reach the target through the lookup service (one line)."""


def trust_bundle(spec: MigrationSpec, directory: Path) -> str | None:
    """The authorities the probe's client must trust: the lookup service's (`lookup.trust_certs_file`, for its
    HTTPS answers) and the target's (`tls.trust_certs_file`, for the brokers' TLS ports the answers name). The C++
    client takes one file for both, so two different files are joined into one in `directory` (local: a run
    directory may be in an object store)."""
    target_tls = spec.target_cluster.tls
    files = list(dict.fromkeys(f for f in (spec.lookup_trust_certs_file,
                                           target_tls.trust_certs_file if target_tls else None) if f))
    if len(files) < 2:
        return files[0] if files else None
    bundle = directory / "probe-trust.pem"
    bundle.parent.mkdir(parents=True, exist_ok=True)
    bundle.write_bytes(b"\n".join(Path(f).read_bytes().rstrip(b"\n") for f in files) + b"\n")
    return str(bundle)


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
        stats = tgt_admin.get(f"{tgt_admin.topic_path(topic)}/stats")
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
