"""The copy's rate cap (pulsar_migration.throttle): the deficit bucket's arithmetic on a fake clock, and its
split over copiers. The real copies' rates under a cap are measured in tests/integration/test_copy_rate_cap.py."""

from __future__ import annotations

import threading
import time

import pytest
from pulsar_migration.throttle import Caps, RateLimit, Throttle, throttle


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_the_burst_goes_at_once_then_bytes_wait_for_their_time() -> None:
    clock = FakeClock()
    rate = RateLimit(1_000_000, clock=clock, sleep=clock.sleep)  # 1 MB/s, a burst of 200 kB
    assert rate.take(200_000) == 0
    assert rate.take(100_000) == pytest.approx(0.1)
    assert rate.take(300_000) == pytest.approx(0.3)
    assert rate.waited_s == pytest.approx(0.4)


def test_over_a_long_copy_the_average_keeps_to_the_cap() -> None:
    clock = FakeClock()
    rate = RateLimit(2_000_000, clock=clock, sleep=clock.sleep)
    started = clock.now
    sent = 0
    for size in [64_000, 1_000, 5_000_000, 300, 128_000] * 200:  # entries of mixed sizes, one far over the burst
        rate.take(size)
        sent += size
    elapsed = clock.now - started
    # Never faster than the cap by more than the first burst, and not slower than it either.
    assert sent / 2_000_000 - 0.2 <= elapsed <= sent / 2_000_000
    assert sent / elapsed == pytest.approx(2_000_000, rel=0.001)


def test_an_idle_spell_earns_no_more_than_one_burst() -> None:
    clock = FakeClock()
    rate = RateLimit(1_000_000, clock=clock, sleep=clock.sleep)
    rate.take(1_000_000)
    clock.now += 3600  # an hour without reads
    assert rate.take(200_000) == 0
    assert rate.take(200_000) == pytest.approx(0.2)


def test_threads_sharing_a_rate_keep_to_it_together() -> None:
    rate = RateLimit(4_000_000, burst_s=0.01)
    started = time.monotonic()

    def reader() -> None:
        for _ in range(20):
            rate.take(10_000)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    # 800 kB at 4 MB/s: 0.2 s less the 40 kB burst; each thread alone would have taken a quarter of that.
    assert elapsed >= 0.19


def test_the_caps_are_split_over_the_copiers_running_at_once() -> None:
    assert not Caps() and Caps().share(4) == Caps()
    assert Caps(8_000_000, None).share(4) == Caps(2_000_000, None)
    assert Caps(None, 1000).share(0) == Caps(None, 1000)
    assert Caps(8e6, 100).as_report() == {"max_mb_per_s": 8.0, "max_msgs_per_s": 100}
    assert throttle(None) is None and throttle(Caps()) is None
    with pytest.raises(ValueError, match="above 0"):
        RateLimit(0)


def test_a_throttle_waits_for_whichever_cap_is_further_behind() -> None:
    clock = FakeClock()
    limit = Throttle(Caps(1_000_000, 100), clock=clock, sleep=clock.sleep)  # bursts: 200 kB, 20 messages
    assert limit.take(100_000, 20) == 0
    assert limit.take(100_000, 10) == pytest.approx(0.1)  # messages: 10 over, at 100/s
    clock.now += 1.0
    assert limit.take(500_000, 1) == pytest.approx(0.3)  # bytes: 200 kB credit, 300 kB over at 1 MB/s
    assert limit.bytes is not None and limit.messages is not None
    assert Throttle(Caps(None, 5)).bytes is None
