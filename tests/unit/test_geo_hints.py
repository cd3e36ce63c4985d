"""The causes geo mode's verification names when the target lacks entries (replication.geo): entries older than a
source message TTL (the replicator is expired like any subscription); target entries clients published there
(after a rollback, in a run that does not continue the rolled-back one). Judged from a fake admin's answers and
entries as readers deliver them; the replicator skipping local-only messages is shown on real clusters in
tests/integration/test_replicate_geo.py."""

from __future__ import annotations

from pulsar_migration.admin import RUNTIME_CONFIGURATION
from pulsar_migration.positions import MessageIdInfo
from pulsar_migration.replication.geo import _Entry, expired_hint, not_arrived, pair_entries
from pulsar_migration.replication.partition import PartitionJob, not_copied_hint
from pulsar_migration.spec import MigrationSpec

from tests.unit.answering_admin import AnsweringAdmin

NOW = 1_800_000_000_000
TOPIC = "persistent://t/ns/orders"  # a partition's base topic, as the verification passes it


def entries(published_s_ago: list[int], ledger: int = 5) -> list[_Entry]:
    return [_Entry(MessageIdInfo(ledger, i), 1, NOW - ago * 1000) for i, ago in enumerate(published_s_ago)]


def replicated(source: list[_Entry], keep: list[int]) -> list[_Entry]:
    return [_Entry(MessageIdInfo(9, n), 1, NOW, source_property=str(source[i].position)) for n, i in enumerate(keep)]


def admin(ttl: int | None) -> AnsweringAdmin:
    return AnsweringAdmin({RUNTIME_CONFIGURATION: {"ttlDurationDefaultInSeconds": "0"},
                           "/namespaces/t/ns": {} if ttl is None else {"message_ttl_in_seconds": ttl}})


def test_entries_older_than_the_ttl_that_did_not_arrive_are_named() -> None:
    source = entries([7200, 7100, 30, 20])
    target = replicated(source, [2, 3])
    assert [e.position for e in not_arrived(source, target)] == [source[0].position, source[1].position]
    hint = expired_hint(admin(3600), TOPIC, source, target, NOW)  # type: ignore[arg-type]
    assert "2 source entries older than the topic's message TTL (3600s)" in hint and "5:0" in hint
    assert "replication.mode copy" in hint


def test_no_ttl_or_only_young_entries_missing_name_nothing() -> None:
    source = entries([7200, 30, 20])
    assert expired_hint(admin(None), TOPIC, source, replicated(source, [1, 2]), NOW) == ""  # type: ignore[arg-type]
    assert expired_hint(admin(3600), TOPIC, source, replicated(source, [0, 1]), NOW) == ""  # type: ignore[arg-type]


def test_target_entries_no_replicator_wrote_are_named_with_the_way_out() -> None:
    """The target's own messages (published there between a switch and its rollback) interleaved with replicated
    ones: an unbatched one is seen by its missing property, a batched one by the sampled entry headers."""
    spec = MigrationSpec.from_dict({
        "tenant": "t", "source": "a", "target": "b", "replication": {"mode": "geo"},
        "clusters": {n: {"admin_url": f"http://{n}:8080", "service_url": f"pulsar://{n}:6650"} for n in "ab"}})
    job = PartitionJob(topic=TOPIC, local="ns/orders", partition=-1, upper=None)
    source = entries([30, 20])
    own = _Entry(MessageIdInfo(9, 0), 1, NOW)  # no __MSG_PROP_REPL_SOURCE_POSITION
    _, errors, _ = pair_entries(spec, Headers({}), job, source, [own, *replicated(source, [0])])
    assert errors[0] == ("target entry 9:0 was not replicated (no __MSG_PROP_REPL_SOURCE_POSITION), paired with "
                         f"source entry 5:0{not_copied_hint(spec)}")
    assert "continue from the rolled-back run (options.follows_run_dir" in errors[0]

    batch = MessageIdInfo(9, 0, 0, 2)
    source = [_Entry(MessageIdInfo(5, 0, 0, 2), 2, NOW)]
    _, errors, sampled = pair_entries(spec, Headers({(9, 0): {"X-Pulsar-num-batch-message": "2"}}), job, source,
                                      [_Entry(batch, 2, NOW)])
    assert sampled == 1 and errors and errors[0].endswith(not_copied_hint(spec)), errors


class Headers(AnsweringAdmin):
    """Stored entries' metadata headers by (ledger, entry)."""

    def __init__(self, headers: dict[tuple[int, int], dict[str, str]]) -> None:
        super().__init__({})
        self.headers = headers

    def entry_headers(self, topic: str, ledger: int, entry: int) -> dict[str, str]:
        return self.headers[(ledger, entry)]
