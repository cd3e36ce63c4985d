"""The geo wait's rule for restarting a replicator that stopped moving (4.0.8: stuck after one failed read)."""

from __future__ import annotations

from pulsar_migration.replication.geo import StallWatch, _stall_progress


def test_a_partition_is_stalled_only_after_its_progress_stood_still_for_the_whole_window() -> None:
    watch = StallWatch(stall_s=30.0, max_restarts=3)
    assert not watch.stalled("p0", ("1:5", 10), 0.0)
    assert not watch.stalled("p0", ("1:5", 10), 29.9)
    assert watch.stalled("p0", ("1:5", 10), 30.0)
    assert watch.restarts == {"p0": 1}


def test_progress_resets_the_clock_and_each_partition_has_its_own() -> None:
    watch = StallWatch(stall_s=30.0)
    watch.stalled("p0", ("1:5", 10), 0.0)
    watch.stalled("p1", ("2:0", 99), 0.0)
    assert not watch.stalled("p0", ("1:6", 9), 25.0)  # moved
    assert not watch.stalled("p0", ("1:6", 9), 50.0)  # 25 s since it moved
    assert watch.stalled("p1", ("2:0", 99), 31.0)
    watch.stalled("p1", ("2:1", 98), 40.0)  # the restarted p1 moved
    assert watch.stalled("p0", ("1:6", 9), 55.0)
    assert watch.restarts == {"p0": 1, "p1": 1}


def test_a_restarted_partition_gets_a_new_window_and_at_most_max_restarts() -> None:
    watch = StallWatch(stall_s=10.0, max_restarts=2)
    watch.stalled("p0", None, 0.0)
    assert watch.stalled("p0", None, 10.0)
    assert not watch.stalled("p0", None, 15.0)  # a fresh window after the restart
    assert watch.stalled("p0", None, 20.0)
    assert not watch.stalled("p0", None, 100.0)  # no restarts left
    assert watch.restarts == {"p0": 2}


def test_only_a_running_replicator_has_progress_to_watch() -> None:
    assert _stall_progress({"replicator": False}) is None
    assert _stall_progress({}) is None
    assert _stall_progress({"replicator": True, "backlog": 3, "target_last": "7:2"}) == ("7:2", 3)


def test_one_restart_at_a_time_until_the_restarted_partition_moves_or_leaves() -> None:
    watch = StallWatch(stall_s=30.0)
    for topic in ("p0", "p1", "p2"):
        watch.stalled(topic, 0, 0.0)
    assert watch.stalled("p0", 0, 30.0)
    assert not watch.stalled("p1", 0, 30.0)  # p0 restarted and has not moved yet
    assert not watch.stalled("p1", 0, 31.0)
    watch.stalled("p0", 1000, 32.0)  # p0 moved
    assert watch.stalled("p1", 0, 32.5)
    watch.forget("p1")  # p1 caught up
    assert watch.stalled("p2", 0, 33.0)
    assert watch.restarts == {"p0": 1, "p1": 1, "p2": 1}
