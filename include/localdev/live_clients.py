"""Live clients for the demo and the switch benchmark: producers and acknowledging consumers on a tenant's
topics, through one Pulsar client of the lookup service, counting what they see across a switch.

Every acknowledged send is recorded with its stall (send to receipt); every received message with when it
came. `window()` gives the stall percentiles and messages received twice in a time range; `check()` after
`close()` compares the acknowledged sends with what the target cluster holds (lost, stored twice) and with
what the consumers received.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any

import pulsar

log = logging.getLogger(__name__)


class LiveClients:
    """A producer (batching, default send timeout) and a Failover consumer on every topic; a sender thread
    publishes `rate` messages/s round-robin over the topics."""

    def __init__(self, url: str, topics: list[str], rate: float, subscription: str = "live") -> None:
        self.client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn),
                                    operation_timeout_seconds=30)
        self.topics, self.rate = topics, rate
        self.sent: list[tuple[float, float, str]] = []  # (sent at, stall s, payload) of acknowledged sends
        self.failed: list[str] = []
        self.received: list[tuple[float, str]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.consumers = [self.client.subscribe(t, subscription, consumer_type=pulsar.ConsumerType.Failover,
                                                message_listener=self._on_message,
                                                initial_position=pulsar.InitialPosition.Earliest) for t in topics]
        self.producers = [self.client.create_producer(t, batching_enabled=True, batching_max_publish_delay_ms=5,
                                                      block_if_queue_full=True) for t in topics]
        self.thread = threading.Thread(target=self._send, daemon=True)

    def start(self) -> LiveClients:
        self.thread.start()
        return self

    def _on_message(self, consumer: Any, message: Any) -> None:
        with self.lock:
            self.received.append((time.monotonic(), message.data().decode()))
        consumer.acknowledge(message)

    def _send(self) -> None:
        n = 0
        while not self.stop.is_set():
            producer = self.producers[n % len(self.producers)]
            payload, at = f"{n % len(self.producers)}:{n}", time.monotonic()

            def done(res: Any, _mid: Any, payload: str = payload, at: float = at) -> None:
                with self.lock:
                    if res == pulsar.Result.Ok:
                        self.sent.append((at, time.monotonic() - at, payload))
                    else:
                        self.failed.append(f"{payload}: {res}")

            producer.send_async(payload.encode(), done)
            n += 1
            time.sleep(1 / self.rate)

    def window(self, since: float, until: float) -> dict[str, Any]:
        """Stall p50/p99/max of the sends started in [since, until) and the messages received twice then."""
        with self.lock:
            stalls = sorted(s for at, s, _ in self.sent if since <= at < until)
            seen: set[str] = set()
            twice = 0
            for at, payload in self.received:
                if payload in seen and since <= at < until:
                    twice += 1
                seen.add(payload)
        pct = (lambda p: round(stalls[min(int(len(stalls) * p), len(stalls) - 1)], 3)) if stalls else (lambda p: None)
        return {"messages": len(stalls), "stall_p50_s": pct(0.5), "stall_p99_s": pct(0.99),
                "stall_max_s": round(stalls[-1], 3) if stalls else None, "received_twice": twice}

    def close(self) -> None:
        """Stops sending, flushes, lets the consumers take what is left, closes the client."""
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(30)
        for p in self.producers:
            p.flush()
        time.sleep(3)
        self.client.close()

    def check(self, target_service_url: str) -> dict[str, int]:
        """After close(): acknowledged sends lost on or stored twice by the target, and never received."""
        acked = {payload for _, _, payload in self.sent}
        on_target = stored(target_service_url, self.topics)
        received = {payload for _, payload in self.received}
        return {"acknowledged_sends": len(acked), "failed_sends": len(self.failed),
                "lost_on_target": len(acked - set(on_target)),
                "stored_twice_on_target": sum(1 for n in on_target.values() if n > 1),
                "never_received": len(acked - received)}


def stored(service_url: str, topics: list[str]) -> Counter[str]:
    """How often each payload is stored on the topics, read from the start with a plain reader."""
    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    counts: Counter[str] = Counter()
    try:
        for topic in topics:
            reader = client.create_reader(topic, pulsar.MessageId.earliest)
            while reader.has_message_available():
                counts[reader.read_next(10_000).data().decode()] += 1
            reader.close()
    finally:
        client.close()
    return counts
