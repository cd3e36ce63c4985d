"""The Python path's producers at a topic's producer limit (maxProducers): a copy needs one producer per schema
version, batching, codec and identity; the broker refuses the next one past the limit ("ProducerBusy"), and the
copy then closes its other producers (drained: a switch drains) and asks again. Scripted client; the engine and
the Python path meet a real limit of one in tests/integration/test_copy_engine.py."""

from __future__ import annotations

from typing import Any

import pytest
from pulsar_migration.replication.sending import EntrySender, SendError


class ProducerBusy(Exception):
    """As the client raises it (`_pulsar.ProducerBusy`)."""


class LimitedClient:
    """Admits `limit` open producers on the topic; past it, ProducerBusy, as the broker answers."""

    def __init__(self, limit: int, error: Exception | None = None) -> None:
        self.limit, self.error = limit, error
        self.open: list[str] = []
        self.created: list[str] = []

    def create_producer(self, topic: str, **kwargs: Any) -> Any:
        if self.error is not None:
            raise self.error
        if len(self.open) >= self.limit:
            raise ProducerBusy("Pulsar error: ProducerBusy")
        name = kwargs["producer_name"]
        self.open.append(name)
        self.created.append(name)
        client = self

        class Producer:
            def close(self) -> None:
                client.open.remove(name)

        return Producer()


def sender(client: LimitedClient) -> EntrySender:
    return EntrySender(client, "persistent://t/ns/x", max_in_flight=10, schema_for=lambda v: None,
                       deliver_at_for=lambda m, i: None, on_receipt=lambda t, i: None)


def test_the_other_producers_go_when_the_topic_admits_no_more() -> None:
    client = LimitedClient(limit=1)
    copy = sender(client)
    batched = copy._producer((None, True, None, None))
    unbatched = copy._producer((None, False, None, None))
    assert batched is not unbatched and len(client.open) == 1 and len(client.created) == 2
    assert copy._producer((None, True, None, None)) is not batched  # asked for again: a new one, the other gone
    assert len(client.open) == 1 and len(client.created) == 3


def test_other_refusals_still_fail_in_one_line() -> None:
    with pytest.raises(SendError, match=r"cannot create producer on persistent://t/ns/x: .*TopicTerminated"):
        sender(LimitedClient(limit=1, error=RuntimeError("Pulsar error: TopicTerminated")))._producer(
            (None, True, None, None))
    client = LimitedClient(limit=0)  # nothing open to close: the refusal stands
    with pytest.raises(SendError, match="ProducerBusy"):
        sender(client)._producer((None, True, None, None))
