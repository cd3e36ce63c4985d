"""The copy's rate caps (options.copy_max_mb_per_s, options.copy_max_msgs_per_s): source payload bytes and messages
read per second, across a run.

A bulk copy reads a live source cluster as fast as its brokers serve it; platform teams cap it the way Pulsar caps
its own replicators (the replicator dispatch rate, in bytes and in messages: small messages cost the brokers per
message, not per byte). The caps are split evenly over the copiers that run at once (engine processes, Spark tasks),
each sharing its part between its threads, so the run never reads faster than a cap; copiers that end early leave
their part unused rather than risk more. The Java engine applies the same rule (EntryCopy.RateLimit).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

# What may go at once after a pause, in seconds of the rate: a burst of a fifth of a second keeps the reads smooth
# and the run's average within a fraction of a percent of the cap over any copy longer than a few seconds.
BURST_S = 0.2


class RateLimit:
    """At most `per_s` units (bytes, messages) a second on average over the threads sharing it. `take(n)` reserves n
    and sleeps until they are due (a deficit bucket: a take larger than the burst goes at once and the next ones
    wait for it), so concurrent takers queue in the order they reserved."""

    def __init__(self, per_s: float, burst_s: float = BURST_S,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        if per_s <= 0:
            raise ValueError(f"a rate must be above 0, not {per_s}")
        self.per_s = float(per_s)
        self.capacity = self.per_s * burst_s
        self._tokens = self.capacity
        self._clock, self._sleep = clock, sleep
        self._last = clock()
        self._lock = threading.Lock()
        self.waited_s = 0.0  # total sleep of every taker, for the report

    def reserve(self, n: float) -> float:
        """Reserves `n`; returns how long the caller must wait before using them (without sleeping)."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.capacity, self._tokens + (now - self._last) * self.per_s)
            self._last = now
            self._tokens -= n
            wait = -self._tokens / self.per_s if self._tokens < 0 else 0.0
            self.waited_s += wait
        return wait

    def take(self, n: float) -> float:
        """Reserves `n` and sleeps until they are due; returns the seconds slept."""
        wait = self.reserve(n)
        if wait > 0:
            self._sleep(wait)
        return wait


@dataclass(frozen=True)
class Caps:
    """A run's caps, or one copier's part of them (None: no cap of that kind)."""

    bytes_per_s: float | None = None
    msgs_per_s: float | None = None

    def __bool__(self) -> bool:
        return self.bytes_per_s is not None or self.msgs_per_s is not None

    def share(self, copiers: int) -> Caps:
        """Each of `copiers` running at once gets an equal part."""
        def part(total: float | None) -> float | None:
            return None if total is None else total / max(1, copiers)

        return Caps(part(self.bytes_per_s), part(self.msgs_per_s))

    def as_report(self) -> dict[str, float]:
        out = {}
        if self.bytes_per_s is not None:
            out["max_mb_per_s"] = round(self.bytes_per_s / 1e6, 6)
        if self.msgs_per_s is not None:
            out["max_msgs_per_s"] = round(self.msgs_per_s, 3)
        return out


class Throttle:
    """One copier's caps, shared by its threads: `take(bytes, messages)` waits for whichever cap is further behind."""

    def __init__(self, caps: Caps, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.bytes = RateLimit(caps.bytes_per_s, clock=clock, sleep=sleep) if caps.bytes_per_s else None
        self.messages = RateLimit(caps.msgs_per_s, clock=clock, sleep=sleep) if caps.msgs_per_s else None
        self._sleep = sleep

    def take(self, nbytes: int, messages: int = 1) -> float:
        """Reserves both and sleeps until both are due; returns the seconds slept."""
        wait = max(self.bytes.reserve(nbytes) if self.bytes else 0.0,
                   self.messages.reserve(messages) if self.messages else 0.0)
        if wait > 0:
            self._sleep(wait)
        return wait


def throttle(caps: Caps | None) -> Throttle | None:
    return Throttle(caps) if caps else None
