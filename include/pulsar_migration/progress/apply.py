"""Setting one target subscription's cursor: reset to the translated markDelete (which also clears its
individual acks), then acknowledge the translated entries through a consumer of our own.

There is no admin ack-by-id API in Pulsar 4.0: a consumer attached to the subscription acknowledges
client-built ids `(ledger, entry, batch index -1)`, which the broker applies to whole entries whether or not
it ever dispatched them. The consumer is exclusive with a zero receive queue, so nothing is dispatched to
it and no other consumer can attach while it works; acks are sent asynchronously and grouped by the
client (up to 1,000 ids per command), with a bounded number outstanding.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pulsar_migration import faults
from pulsar_migration.admin import PulsarAdmin, asked_again_while_busy, seg_twice

log = logging.getLogger(__name__)

CONSUMER_NAME = "pulsar-migration-sync-progress"
ACK_TIMEOUT_S = 120.0
ACK_MAX_IN_FLIGHT = 10_000
VERIFY_ATTEMPTS = 4  # acks travel asynchronously: a readback right after the consumer closed may trail
APPLY_ROUNDS = 4  # a subscription still differing after a read-back is set again (acks lost on a cut link)


class ProgressError(RuntimeError):
    """A subscription that cannot be set (one line)."""


@dataclass(frozen=True)
class CursorPlan:
    topic: str
    subscription: str
    reset_ledger: int | None  # None: no mapped entries (the subscription is only created if missing)
    reset_entry: int | None
    excluded: bool  # True: markDelete = reset position; False: the reset position is the first unacked


@dataclass
class Applied:
    topic: str
    subscription: str
    created: bool = False
    reset_to: str | None = None
    acks_sent: int = 0
    apply_s: float = 0.0
    error: str | None = None


def apply_cursor(admin: PulsarAdmin, client: Any, plan: CursorPlan, acks: Iterable[tuple[int, int]], *,
                 max_in_flight: int, subscriptions: dict[str, Any] | None = None) -> Applied:
    """Creates the subscription if missing, resets its cursor and acknowledges `acks` (ledger, entry).
    `subscriptions`: the partition's stats subscriptions when already read (the cutover's fence snapshot)."""
    started = time.monotonic()
    done = Applied(plan.topic, plan.subscription)
    path = admin.topic_path(plan.topic)
    subs = subscriptions if subscriptions is not None else admin.get(f"{path}/stats").get("subscriptions") or {}
    if plan.subscription in subs:
        consumers = subs[plan.subscription].get("consumers") or []
        if consumers:
            names = ", ".join(sorted(str(c.get("consumerName") or "?") for c in consumers)[:3])
            raise ProgressError(f"subscription {plan.subscription} of {plan.topic} has {len(consumers)} consumer(s) "
                                f"of its own on the target ({names}): stop them (or run the cutover) first")
    sub_path = f"{path}/subscription/{seg_twice(plan.subscription)}"
    if plan.subscription not in subs:
        start = ({"ledgerId": plan.reset_ledger, "entryId": plan.reset_entry} if plan.reset_ledger is not None
                 else {"ledgerId": -1, "entryId": -1})  # earliest
        admin.put(sub_path, start)
        done.created = True
    if plan.reset_ledger is not None:
        reset = {"ledgerId": plan.reset_ledger, "entryId": plan.reset_entry, "excluded": plan.excluded}
        # The same reset again is harmless; one retried after a cut connection can find the first still fencing.
        asked_again_while_busy(lambda: admin.post(f"{sub_path}/resetcursor", reset),
                               f"reset of {plan.subscription} on {plan.topic}")
        done.reset_to = f"{plan.reset_ledger}:{plan.reset_entry}{' (excluded)' if plan.excluded else ''}"
    done.acks_sent = acknowledge(client, plan.topic, plan.subscription, acks, max_in_flight=max_in_flight)
    done.apply_s = round(time.monotonic() - started, 3)
    return done


def acknowledge(client: Any, topic: str, subscription: str, acks: Iterable[tuple[int, int]], *,
                max_in_flight: int) -> int:
    """Acknowledges whole entries on the subscription; returns how many acks were sent (0: no consumer)."""
    import pulsar

    iterator = iter(acks)
    first = next(iterator, None)
    if first is None:
        return 0
    consumer = client.subscribe(topic, subscription, consumer_type=pulsar.ConsumerType.Exclusive,
                                receiver_queue_size=0, consumer_name=CONSUMER_NAME)
    slots = threading.Semaphore(max_in_flight)
    errors: list[str] = []
    sent = 0

    def on_ack(result: Any) -> None:
        if result != pulsar.Result.Ok:
            errors.append(str(result))
        slots.release()

    try:
        for ledger, entry in itertools.chain([first], iterator):
            if not slots.acquire(timeout=ACK_TIMEOUT_S):
                raise ProgressError(f"acknowledgements on {topic} ({subscription}) stalled for {ACK_TIMEOUT_S:.0f}s")
            consumer._consumer.acknowledge_async(pulsar.MessageId(-1, ledger, entry, -1)._msg_id, on_ack)
            sent += 1
            faults.at("progress.acks", sent)
        for _ in range(max_in_flight):  # every callback back: every ack handed to the connection
            if not slots.acquire(timeout=ACK_TIMEOUT_S):
                raise ProgressError(f"acknowledgements on {topic} ({subscription}) not flushed in {ACK_TIMEOUT_S:.0f}s")
    finally:
        consumer.close()  # flushes what the client still groups
    if errors:
        raise ProgressError(f"{len(errors)} acknowledgement(s) on {topic} ({subscription}) failed: {errors[0]}")
    return sent
