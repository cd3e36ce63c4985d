"""The copy's bandwidth cap (options.copy_max_mb_per_s): source payload bytes read per second, across a run.

A bulk copy reads a live source cluster as fast as its brokers serve it; platform teams cap it the way Pulsar caps
its own replicators (the replicator dispatch rate). The cap is split evenly over the copiers that run at once (engine
processes, Spark tasks), each sharing its part between its threads, so the run never reads faster than the cap;
copiers that end early leave their part unused rather than risk more. The Java engine applies the same rule
(EntryCopy.ByteRate).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

# What may go at once after a pause, in seconds of the rate: a burst of a fifth of a second keeps the reads smooth
# and the run's average within a fraction of a percent of the cap over any copy longer than a few seconds.
BURST_S = 0.2


class ByteRate:
    """At most `bytes_per_s` on average over the threads sharing it. `take(n)` reserves n bytes and sleeps
    until they are due (a deficit bucket: an entry larger than the burst goes at once and the next ones wait for
    it), so concurrent takers queue in the order they reserved."""

    def __init__(self, bytes_per_s: float, burst_s: float = BURST_S,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        if bytes_per_s <= 0:
            raise ValueError(f"a byte rate must be above 0, not {bytes_per_s}")
        self.bytes_per_s = float(bytes_per_s)
        self.capacity = self.bytes_per_s * burst_s
        self._tokens = self.capacity
        self._clock, self._sleep = clock, sleep
        self._last = clock()
        self._lock = threading.Lock()
        self.waited_s = 0.0  # total sleep of every taker, for the report

    def take(self, n: int) -> float:
        """Reserves `n` bytes; returns the seconds this call slept."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.capacity, self._tokens + (now - self._last) * self.bytes_per_s)
            self._last = now
            self._tokens -= n
            wait = -self._tokens / self.bytes_per_s if self._tokens < 0 else 0.0
            self.waited_s += wait
        if wait > 0:
            self._sleep(wait)
        return wait


def share(total_bytes_per_s: float | None, copiers: int) -> float | None:
    """Each of `copiers` running at once gets an equal part of the run's cap (None: no cap)."""
    if total_bytes_per_s is None:
        return None
    return total_bytes_per_s / max(1, copiers)


def byte_rate(bytes_per_s: float | None) -> ByteRate | None:
    return ByteRate(bytes_per_s) if bytes_per_s else None
