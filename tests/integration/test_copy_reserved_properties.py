"""Source messages that already carry the copy's own properties (`__pm_source`, `__pm_source_publish_time`): a tenant
this tool moved once, moved on again (A to B, then B to C) or back. The copy's pair replaces them. Beside them (as
before), a C++ client saw the old pair and a Java client the new one, the Python path's resume took the old position
for the copy's and re-sent entries, and the position map pointed at source entries that do not exist.

Both paths: the engine copies both topics first (the second with a chunked message among them, which it puts
together and sends whole). A second run into a fresh run directory, through the Python path (no map: the resume comes
from the target's last tag, which that path's reading parses, as its read-back does), then copies exactly the messages
produced since.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
from localdev.pulsar_local import LocalCluster
from pulsar_migration.admin import PulsarAdmin
from pulsar_migration.metadata.step import run as sync_metadata
from pulsar_migration.stepjob import run_step

from tests.conftest import unique
from tests.integration.replication_helpers import client, create_topics, drain, source_tenant
from tests.integration.replication_helpers import replicate as step
from tests.integration.replication_helpers import replicate_report as report
from tests.integration.tenant_builders import write_spec
from tests.integration.test_replicate_topics import cleanup, content, shape

CHUNKED = b"C" * (6 * 1024 * 1024)


def stale_tag(i: int) -> dict[str, str]:
    """The pair an earlier copy left on a message: a position this source never had."""
    return {"__pm_source": f"5:{i}:-1:0", "__pm_source_publish_time": "1", "user": str(i)}


def test_the_copys_own_properties_replace_those_a_source_message_already_carries(
    cluster_a: LocalCluster, cluster_b: LocalCluster, admin_a: PulsarAdmin, admin_b: PulsarAdmin, tmp_path: Path,
) -> None:
    tenant = source_tenant(admin_a, cluster_a, unique("it-reserved"))
    whole, handed = f"persistent://{tenant}/ns/whole", f"persistent://{tenant}/ns/handed"
    create_topics(admin_a, whole, handed)
    c = client(cluster_a)
    batched = c.create_producer(whole, batching_enabled=True, batching_max_messages=10,
                                batching_max_publish_delay_ms=50, block_if_queue_full=True)
    for i in range(40):
        batched.send_async(f"b-{i}".encode(), None, properties=stale_tag(i))
    batched.flush()
    unbatched = c.create_producer(whole, batching_enabled=False)
    for i in range(5):
        unbatched.send(f"u-{i}".encode(), properties=stale_tag(100 + i))
    chunked = c.create_producer(handed, batching_enabled=False, chunking_enabled=True)
    for i in range(3):
        chunked.send(f"h-{i}".encode(), properties=stale_tag(i))
    chunked.send(CHUNKED)
    for i in range(3):
        chunked.send(f"after-{i}".encode(), properties=stale_tag(50 + i))
    spec = write_spec(tmp_path / "spec.json", tenant, cluster_a, cluster_b)
    try:
        assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(tmp_path)]) == 0
        assert step(spec, tmp_path / "run") == 0
        parts = {p["topic"]: p for p in report(tmp_path / "run")["details"]["partitions"]}
        assert parts[whole]["copy_engine"] == parts[handed]["copy_engine"] == "java"

        def check_exact() -> None:
            for topic in (whole, handed):
                source, target = drain(cluster_a, topic), drain(cluster_b, topic)
                assert content(target) == content(source)  # the user's own property stays; the stale pair goes
                assert shape(target) == shape(source)
                # The one tag a client sees is the copy's: the message's real source position (a chunked
                # message's names its chunks, checked by the map below).
                assert [m["source"] for m in target if m["data"] != CHUNKED] == [
                    f"{m['entry'][0]}:{m['entry'][1]}:{m['batch_index']}:{len(source_batch(source, m))}"
                    if m["batch_index"] >= 0 else f"{m['entry'][0]}:{m['entry'][1]}:-1:0"
                    for m in source if m["data"] != CHUNKED]

        check_exact()
        for p in parts.values():
            assert p["skipped_messages"] == 0 and p["copied_messages"] == p["source_messages"]
        mapped = pq.read_table(tmp_path / "run" / "position_map").to_pandas()
        source_entries = {(t, m["entry"]) for t in (whole, handed) for m in drain(cluster_a, t) if m["data"] != CHUNKED}
        assert {(r.topic, (r.source_ledger, r.source_entry)) for r in mapped.itertuples()
                if r.source_first_chunk is None} == source_entries
        assert len(mapped) == len(source_entries) + 1  # and the chunked message's row

        for i in range(4):
            unbatched.send(f"new-{i}".encode(), properties=stale_tag(200 + i))
            chunked.send(f"new-{i}".encode(), properties=stale_tag(200 + i))
        python = write_spec(tmp_path / "python.json", tenant, cluster_a, cluster_b, options={"copy_engine": "python"})
        assert step(python, tmp_path / "fresh") == 0  # no map: each partition resumes after the target's last tag
        again = {p["topic"]: p for p in report(tmp_path / "fresh")["details"]["partitions"]}
        assert {t: p["copied_messages"] for t, p in again.items()} == {whole: 4, handed: 4}
        assert {p["copy_engine"] for p in again.values()} == {"python"}
        check_exact()
    finally:
        c.close()
        cleanup(tenant, admin_a, admin_b)


def source_batch(messages: list[dict], message: dict) -> list[dict]:
    return [m for m in messages if m["entry"] == message["entry"]]
