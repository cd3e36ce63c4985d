"""Broker entry filters (PIP-105) on the source.

A broker runs its entry filters for every subscription, readers included: an entry a filter rejects for the
copy's reader never reaches it. It is then missing on the target and from both sides' verification hashes
alike, a loss no count or hash of the step can see (shown on a broker with such a filter: verdict ok, 7 of 11
messages on the target, a subscription the filter lets through getting all 11 on the source). Native geo-replication's
replicator reads the ledger itself, unfiltered, but the step's verification reads the source through the filters
and fails the partition (shown too). So a run over topics whose filters are in force is refused, in either mode,
unless the spec says they pass every entry to the step's readers (options.trust_source_entry_filters), which a
filter can do by their subscription names.

Where filters can apply: the broker's own `entryFilterNames` for every topic, or, when it allows overriding
them (`allowOverrideEntryFilters`), a namespace's or topic's `entryFilters` policy, which the broker resolves
per topic (`GET .../entryFilters?applied=true`: topic, then namespace, then broker). One read of the broker's
runtime configuration settles the common case (no filters, no overriding) for the whole run.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pulsar_migration.admin import RUNTIME_CONFIGURATION, PulsarAdmin
from pulsar_migration.spec import MigrationSpec
from pulsar_migration.stepjob import BadInput

log = logging.getLogger(__name__)

LISTED = 5  # topics named in the line
# Every reader of the step is an exclusive non-durable subscription with a name of this form: the Python client's
# (reading.READER_ROLE_PREFIX) and the engine's (EntryCopy.openReader).
READER_SUBSCRIPTIONS = "pm-copy-reader-*"


def configured_names(value: Any) -> list[str]:
    """The broker's `entryFilterNames` as its runtime configuration renders it: a Java list ('[]', '[a, b]') or,
    from a dynamic setting, a comma-separated string."""
    text = str(value or "").strip().removeprefix("[").removesuffix("]")
    return [name.strip() for name in text.split(",") if name.strip()]


def filtered_topics(admin: PulsarAdmin, topics: list[str], concurrency: int) -> dict[str, str]:
    """The topics (full names, partitioned topics by their base name) whose entries pass through entry filters
    on the broker `admin` reaches, each with its filters' names. Brokers of one cluster share their
    configuration; the one answering is taken for all."""
    if not topics:
        return {}
    config = admin.get(RUNTIME_CONFIGURATION) or {}
    broker_names = ",".join(configured_names(config.get("entryFilterNames")))
    if str(config.get("allowOverrideEntryFilters", "false")).strip().lower() != "true":
        return dict.fromkeys(topics, broker_names) if broker_names else {}

    def applied(topic: str) -> tuple[str, str]:
        value = admin.get(f"{admin.topic_path(topic)}/entryFilters", params={"applied": "true"}) or {}
        return topic, ",".join(configured_names(value.get("entryFilterNames")))

    with ThreadPoolExecutor(max(1, min(concurrency, len(topics)))) as pool:
        return {topic: names for topic, names in pool.map(applied, topics) if names}


def check(spec: MigrationSpec, admin: PulsarAdmin, topics: list[str], details: dict[str, Any], *,
          dry_run: bool = False) -> None:
    """Records in `details["entry_filters"]` which of `topics` the source filters, and fails in one line, before
    anything is written, when some are, unless the spec trusts the filters (then, and in a dry run, a warning).
    Copy mode (and a backfill) would lose what they reject for its readers; geo mode's replicator copies it, but
    the verification, reading the source, would fail the partition on every run. A source whose configuration
    cannot be read (a token without the superuser role) gets a warning: the check is left out, not the run."""
    try:
        found = filtered_topics(admin, topics, spec.admin_concurrency)
    except Exception as exc:
        line = (f"could not check {spec.source}'s broker entry filters ({str(exc).splitlines()[0][:200]}): a filter "
                "that rejects entries for readers would hide them from the copy and from both sides' hashes")
        log.warning("%s", line)
        details["entry_filters"] = {"checked": False, "warning": line}
        return
    details["entry_filters"] = {"checked": True, "topics": len(found)}
    if not found:
        return
    named = ", ".join(f"{topic.split('://', 1)[-1]} ({names})" for topic, names in sorted(found.items())[:LISTED])
    more = f" and {len(found) - LISTED} more" if len(found) > LISTED else ""
    line = (f"{len(found)} topic(s) on the source {spec.source} pass through broker entry filters: {named}{more}; "
            f"the broker applies them to the step's readers too (subscriptions named {READER_SUBSCRIPTIONS}), so a "
            "message they reject for those would be lost by a copy and fail geo mode's verification: set "
            "options.trust_source_entry_filters once the filters pass every message to them")
    details["entry_filters"].update(filters=dict(sorted(found.items())[:LISTED]), warning=line,
                                    trusted=spec.trust_source_entry_filters)
    if not (spec.trust_source_entry_filters or dry_run):
        raise BadInput(line)
    log.warning("%s", line)
