"""A copy killed inside a chunked message: the target holds the message's first chunks only. The next run sends the
message again whole (real brokers and Spark; both sides read with the plain Python client)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from localdev.pulsar_dist import pulsar_home
from localdev.pulsar_local import LocalCluster
from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.metadata.step import run as sync_metadata
from pulsar_migration.positions import Position, sequence_id
from pulsar_migration.replication import posmap
from pulsar_migration.replication.partition import PartitionJob, copy_partition
from pulsar_migration.replication.sending import producer_name
from pulsar_migration.spec import MigrationSpec
from pulsar_migration.stepjob import run_step
from pyspark.sql import SparkSession

from tests.conftest import unique
from tests.integration.replication_helpers import client, drain, source_tenant
from tests.integration.replication_helpers import replicate as step
from tests.integration.replication_helpers import replicate_report as report
from tests.integration.tenant_builders import write_spec
from tests.integration.test_replicate_topics import cleanup, produce_unbatched

LARGE = 48 * 1024 * 1024  # ten chunks at the broker's 5 MB: room to stop the send after its first ones

# What the copy's producer does with the message (sending.EntrySender: its name, the sequence id of the source
# entry, the source tag), in a process of its own that the test SIGKILLs once the first chunk is stored.
SENDER = """
import json, sys, pulsar
url, topic, name, seq, props, size = sys.argv[1:7]
c = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
p = c.create_producer(topic, producer_name=name, chunking_enabled=True, batching_enabled=False)
p.send(bytes(int(size)), properties=json.loads(props), sequence_id=int(seq))
"""


def stop_inside_message(cluster: LocalCluster, admin: PulsarAdmin, topic: str, name: str, seq: int,
                        props: dict[str, str]) -> None:
    """The sender killed once the message's first chunk is stored. The namespace's publish rate holds the broker's
    reads to about a chunk a second meanwhile: unthrottled, it has read every chunk off the connection before the
    first is stored, and stores them all after the kill. Returns once the target's end stopped moving."""
    namespace = "/namespaces/" + topic.split("://", 1)[1].rsplit("/", 1)[0]
    admin.post(f"{namespace}/publishRate", {"publishThrottlingRateInMsg": -1,
                                            "publishThrottlingRateInByte": 5 * 1024 * 1024})
    before = admin.last_entry(topic)
    proc = subprocess.Popen([sys.executable, "-c", SENDER, cluster.service_url, topic, name, str(seq),
                             json.dumps(props), str(LARGE)], start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None and admin.last_entry(topic) == before:
            time.sleep(0.005)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    end, still = admin.last_entry(topic), time.monotonic()
    while time.monotonic() - still < 5:  # what the broker had read still lands, throttled
        time.sleep(0.5)
        if admin.last_entry(topic) != end:
            end, still = admin.last_entry(topic), time.monotonic()
    admin.delete(f"{namespace}/publishRate")


def test_a_run_stopped_inside_a_chunked_message_resends_it_whole(
    cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin, admin_b: PulsarAdmin,
    spark: SparkSession, tmp_path: Path,
) -> None:
    tenant = source_tenant(admin_a, cluster_a, unique("it-copy-partial"))
    topic = f"persistent://{tenant}/ns/t"
    admin_a.put(f"/persistent/{tenant}/ns/t")
    spec = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b)
    run_dir = tmp_path / "run"
    try:
        produce_unbatched(cluster_a, topic, 30)
        assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(tmp_path)]) == 0
        assert step(spec, run_dir) == 0

        c = client(cluster_a)
        try:
            p = c.create_producer(topic, chunking_enabled=True, batching_enabled=False)
            p.send(os.urandom(LARGE), properties={"kind": "large"})
            p.close()
        finally:
            c.close()
        last = admin_a.last_entry(topic)
        chunks = int(admin_a.entry_headers(topic, last.ledger, last.entry)["X-Pulsar-num-chunks-from-msg"])
        assert drain(cluster_a, topic)[-1]["entry"] == (last.ledger, last.entry)  # a reader's id: the last chunk
        produce_unbatched(cluster_a, topic, 5)  # after it

        # The copy killed while it sent the large message: the first chunks of it on the target, the rest missing.
        tag = f"{last}:-1:0:{Position(last.ledger, last.entry - chunks + 1)}"
        stop_inside_message(cluster_b, admin_b, topic, producer_name(topic, None, False), sequence_id(last),
                            {"kind": "large", "__pm_source": tag})
        stored = admin_b.last_entry(topic)
        headers = admin_b.entry_headers(topic, stored.ledger, stored.entry)
        if int(headers.get("X-Pulsar-chunk-id", "-1")) == int(headers.get("X-Pulsar-num-chunks-from-msg", "0")) - 1:
            pytest.fail("the kill came after the last chunk was stored: no partial message to resume from")
        assert json.loads(headers["X-Pulsar-PROPERTY"])["__pm_source"] == tag  # the premise

        assert step(spec, run_dir) == 0
        counts = report(run_dir)["counts"]
        assert counts["partitions_ok"] == 1 and counts["copied_messages"] == 6 and counts["skipped_messages"] == 0
        # The engine sends it again under the suffixed name (the Python path did, until 2026-11-27).
        assert report(run_dir)["details"]["partitions"][0]["copy_engine"] == "java"
        source, target = drain(cluster_a, topic), drain(cluster_b, topic)
        assert [(m["data"], m["props"]) for m in target] == [(m["data"], m["props"]) for m in source]
        assert len(target) == 36
        # The Java client (the distribution's CLI) assembles the large message too, beside the incomplete one.
        judge = subprocess.run([str(pulsar_home() / "bin" / "pulsar-client"), "--url", cluster_b.service_url, "consume",
                                topic, "-s", "java-judge", "-n", "36", "-p", "Earliest", "--hide-content"],
                               capture_output=True, text=True, timeout=240)
        assert judge.returncode == 0, judge.stdout[-2000:] + judge.stderr[-2000:]
        assert "36 messages successfully consumed" in judge.stdout + judge.stderr, judge.stdout[-2000:]

        assert step(spec, run_dir) == 0  # and nothing more on the next run
        assert report(run_dir)["counts"]["copied_messages"] == 0

        # A source producer stopped inside a message (the cutover's fence can do that): its first chunks end the
        # source, no consumer is given them, and they are not a change: neither a run nor the fenced final delta
        # (which must reach the source's end) waits for them or fails on them.
        stop_inside_message(cluster_a, admin_a, topic, "crashed-producer", 1, {"kind": "never-whole"})
        end = admin_a.last_entry(topic)
        headers = admin_a.entry_headers(topic, end.ledger, end.entry)
        assert int(headers["X-Pulsar-chunk-id"]) < int(headers["X-Pulsar-num-chunks-from-msg"]) - 1  # the premise
        assert step(spec, run_dir) == 0
        assert report(run_dir)["counts"]["partitions_unchanged"] == 1
        mapped = posmap.ends_local(str(run_dir))[topic]
        job = PartitionJob(topic, "ns/t", -1, end, (mapped.target, mapped.source), fenced=True)
        outcome, _ = copy_partition(MigrationSpec.load(str(spec)), job, dry_run=False, max_in_flight=100,
                                    delivery_horizon_s=0)
        assert outcome.status == "ok" and outcome.copied_messages == 0, outcome.error
        assert len(drain(cluster_b, topic)) == 36
    finally:
        cleanup(tenant, admin_a, admin_b)
