"""Target topics whose copied messages the target broker may delete before anyone reads them.

Pulsar keeps nothing for a topic with no subscription and no retention: its closed ledgers are deleted. On the
source that happens at the broker's periodic retention check (every 2 minutes by default). On the target,
deduplication, which the step turns on, keeps a durable cursor (`pulsar.dedup`) that moves on as it snapshots, and
the broker deletes the ledgers behind it at the next ledger roll: an unload, a restart, a full ledger. Seen on the
local 4.0.8 pair: a copy, one unload of the target, a second copy of more than 1,000 entries a partition, and the
target held 57,000 of 62,000 messages while the step said ok; a roll during a copy fails its verification and every
re-run after it. A subscription created by sync_metadata starts at the earliest entry and holds them; so does
retention.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pulsar_migration.admin import NotFound, PulsarAdmin

log = logging.getLogger(__name__)
LISTED = 10  # topics named in the report and the warning


def keeps_nothing(retention: dict[str, Any]) -> bool:
    """Whether an applied retention policy keeps nothing once every cursor passed (0 minutes or 0 MB)."""
    return not (retention.get("retentionTimeInMinutes") and retention.get("retentionSizeInMB"))


def unprotected_topics(admin: PulsarAdmin, topics: list[str], concurrency: int) -> list[str]:
    """Those of `topics` (base topics, on the target) with no applied retention and no subscription. A namespace
    whose retention keeps messages costs one call (a topic policy lowering it is not looked for); in one that keeps
    nothing, each topic's subscriptions, then a subscriber-less topic's own retention. A topic not there yet (a dry
    run before sync_metadata) is left out: metadata sync gives it its policies first."""
    def namespace_keeps(namespace: str) -> bool:
        try:
            return not keeps_nothing(dict(admin.get(f"/namespaces/{namespace}/retention") or {}))
        except NotFound:
            return True

    def unprotected(topic: str) -> bool:
        path = admin.topic_path(topic)
        try:
            if admin.get(f"{path}/subscriptions"):
                return False
            return keeps_nothing(dict(admin.get(f"{path}/retention", params={"applied": "true"}) or {}))
        except NotFound:
            return False

    def namespace_of(topic: str) -> str:
        return "/".join(topic.split("://", 1)[-1].split("/")[:2])

    with ThreadPoolExecutor(max(1, min(concurrency, len(topics)))) as pool:
        namespaces = sorted({namespace_of(t) for t in topics})
        bare_namespaces = {ns for ns, keeps in zip(namespaces, pool.map(namespace_keeps, namespaces), strict=True)
                           if not keeps}
        candidates = [t for t in topics if namespace_of(t) in bare_namespaces]
        return [t for t, bare in zip(candidates, pool.map(unprotected, candidates), strict=True) if bare]


def trim_risk(admin_name: str, bare: list[str]) -> dict[str, Any] | None:
    """The report's `trim_risk` for the topics unprotected_topics found (None: none), its warning also logged."""
    if not bare:
        return None
    names = ", ".join(t.split("://", 1)[-1] for t in bare[:LISTED]) + (", ..." if len(bare) > LISTED else "")
    warning = (f"{len(bare)} topic(s) keep no retention and have no subscription on {admin_name} ({names}): "
               "deduplication's cursor lets the broker delete their copied messages at the next ledger roll "
               "(an unload, a restart); set a retention policy on their namespace(s) for the migration")
    log.warning("%s", warning)
    return {"count": len(bare), "topics": bare[:LISTED], "warning": warning}


def trimmed(admin: PulsarAdmin, mapped: list[tuple[str, int]], concurrency: int) -> list[tuple[str, int, int]]:
    """Of `mapped` (a partition of an unprotected topic, the lowest target ledger its map holds), those whose target
    no longer has that ledger: (partition, its first ledger now, the map's). Nothing consumed them there."""
    def first_ledger(item: tuple[str, int]) -> int | None:
        try:
            ledgers = admin.get(f"{admin.topic_path(item[0])}/internalStats").get("ledgers") or []
        except NotFound:  # deleted since: the copy's own check of the target's identity names it
            return None
        return min((int(ledger["ledgerId"]) for ledger in ledgers), default=None)

    with ThreadPoolExecutor(max(1, min(concurrency, len(mapped)))) as pool:
        firsts = list(pool.map(first_ledger, mapped))
    return [(topic, first, mapped_first) for (topic, mapped_first), first in zip(mapped, firsts, strict=True)
            if first is not None and first > mapped_first]


def trimmed_line(lost: list[tuple[str, int, int]]) -> str:
    topic, first, mapped_first = lost[0]
    return (f"{len(lost)} target partition(s) no longer hold messages this tool copied there (first: {topic}, "
            f"whose first ledger now is {first}; the position map holds entries from ledger {mapped_first} on): "
            "with no retention and no subscription the broker deleted them at a ledger roll (the source deletes "
            "its own at its retention check); to keep what the source still has, give the namespace a retention "
            "policy, delete those target topics and copy them again into a new run directory")
