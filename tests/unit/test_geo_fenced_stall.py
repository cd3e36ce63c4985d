"""geo._wait_caught_up under the switch's fence: a partition whose replication stops short of its bound (an open
transaction on the source: 4.0.8's replicator reads only up to the max read position) fails after FENCED_STALL_S
with a line naming the likely cause; it held the clients for the whole geo timeout (600 s) and failed without one."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from pulsar_migration.positions import Position
from pulsar_migration.replication import geo
from pulsar_migration.replication.partition import PartitionJob

TOPIC = "persistent://acme/ns/t-partition-0"


class Spec:
    target = "cluster-b"
    geo_timeout_s = 600.0


def stuck(monkeypatch: pytest.MonkeyPatch, tail_undeliverable: bool) -> None:
    def caught_up(spec: Any, src: Any, tgt: Any, job: PartitionJob, status: dict[str, Any]) -> bool:
        status.update({"replicator": True, "backlog": 3, "connected": True, "target_last": "7:4"})
        return False

    monkeypatch.setattr(geo, "_caught_up", caught_up)
    monkeypatch.setattr(geo, "replicator_mark", lambda admin, topic, target: Position(5, 6))
    monkeypatch.setattr(geo, "only_undeliverable_after", lambda *a, **k: tail_undeliverable)
    monkeypatch.setattr(geo, "FENCED_STALL_S", 0.3)
    monkeypatch.setattr(geo, "POLL_S", 0.05)


def wait(fenced: bool) -> None:
    job = PartitionJob(TOPIC, "ns/t", 0, Position(5, 9), None, fenced=fenced)
    with ThreadPoolExecutor(1) as pool:
        geo._wait_caught_up(Spec(), None, None, [job], {}, geo.time.monotonic(), pool)  # type: ignore[arg-type]


def test_a_fenced_partition_held_back_fails_at_once_naming_an_open_transaction(monkeypatch: pytest.MonkeyPatch) -> None:
    stuck(monkeypatch, tail_undeliverable=False)
    started = geo.time.monotonic()
    with pytest.raises(geo.GeoError, match=r"made no progress for 0s on .*t-partition-0 while the clients are held: "
                                           r"its replicator stands at 5:6, the source's end is 5:9; .*open "
                                           r"transaction"):
        wait(fenced=True)
    assert geo.time.monotonic() - started < 5


def test_an_unfenced_run_waits_for_its_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    stuck(monkeypatch, tail_undeliverable=False)
    monkeypatch.setattr(Spec, "geo_timeout_s", 0.6)
    with pytest.raises(geo.GeoError, match=r"has not caught up after 0\.6s"):
        wait(fenced=False)
