"""Progress sync: sync_progress on a 1M-message backlog with 100k holes, and Pulsar's replicated subscriptions
(PIP-33) on the same ack pattern, judged the same way: what a consumer on the target gets after a switch.

    .venv/bin/python -m benchmarks.progress_sync [--messages 1000000] [--batch 4] [--pip33-messages 200000]
        [--master local[2]] [--pip33-wait 60]

Against the local cluster pair (cluster-a -> cluster-b):

* ours: a one-partition topic gets `--messages` messages in batches of `--batch` (one entry each). Its
  subscription `bench` has the ack pattern: the first 10% of entries acked cumulatively (markDelete), then
  every other entry up to 90% (holes: with 1M messages in batches of 4, 100,000 ranges), the rest not acked.
  The acks are sent with built message ids (`pulsar_migration.progress.apply.acknowledge`) so the pattern
  lands in seconds. sync_metadata and replicate_topics (copy) bring the topic over (timed, not in the goal);
  then sync_progress runs in-process on a warm session: its wall time (read + translate + apply + verify)
  is the figure the goal (< 2 minutes) is about, with the report's phase times. Finally both subscriptions
  are drained by fresh consumers (nothing acked) and compared as multisets: lost and duplicated.
* pip33: a fresh tenant replicated both ways (cluster-a <-> cluster-b), the subscription made by a consumer
  with `replicate_subscription_state_enabled=True` before `--pip33-messages` messages are produced; the same
  pattern acked by that consumer (cumulative, then whole entries); then `--pip33-wait` seconds for the
  snapshots. If the subscription exists on cluster-b it is drained as it is; if not, a consumer with the
  default initial position (Latest) and then one with Earliest are measured (each on a fresh subscription
  of the same name). Lost and duplicated are counted against the source subscription's own drain.

Writes `benchmarks/results/progress_sync-<UTC time>.json`, prints a markdown table, deletes its tenants.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pulsar_migration.admin import PulsarAdmin, seg

from benchmarks.metadata_scale import git_revision, machine
from benchmarks.replication_throughput import (
    NAMESPACE,
    SOURCE,
    TARGET,
    TOPIC,
    Tenants,
    client,
    start_spark,
    write_spec,
)

log = logging.getLogger(__name__)

RESULTS_DIR = Path(__file__).resolve().parent / "results"
SUBSCRIPTION = "bench"
IDLE_MS = 3_000
FIRST_MS = 10_000


def partition(tenant: str) -> str:
    return f"persistent://{tenant}/{NAMESPACE}/{TOPIC}-partition-0"


def produce(cluster: Any, tenant: str, messages: int, batch: int) -> float:
    """`messages` unique payloads in batches of `batch` (one entry each); seconds."""
    c = client(cluster)
    try:
        producer = c.create_producer(f"persistent://{tenant}/{NAMESPACE}/{TOPIC}", batching_enabled=True,
                                     batching_max_messages=batch, batching_max_publish_delay_ms=100,
                                     block_if_queue_full=True, max_pending_messages=20_000)
        started = time.monotonic()
        for i in range(messages):
            producer.send_async(f"m{i:09d}".encode(), None)
        producer.flush()
        producer.close()
        return round(time.monotonic() - started, 3)
    finally:
        c.close()


def entries(admin: PulsarAdmin, topic: str) -> list[tuple[int, int]]:
    """Every entry position of a partition, in order (from internalStats' ledger list)."""
    stats = admin.get(f"{admin.topic_path(topic)}/internalStats")
    positions = []
    ledgers = stats["ledgers"]
    for i, ledger in enumerate(ledgers):
        # the last ledger is the one being written: its count is only in currentLedgerEntries
        count = int(stats["currentLedgerEntries"]) if i == len(ledgers) - 1 else int(ledger.get("entries") or 0)
        positions.extend((int(ledger["ledgerId"]), e) for e in range(count))
    return positions


def ack_pattern(positions: list[tuple[int, int]]) -> tuple[tuple[int, int] | None, list[tuple[int, int]]]:
    """(markDelete, individually acked entries): the first 10% cumulatively, then every other entry up to
    90%; the rest unacked."""
    n = len(positions)
    cut, end = n // 10, n * 9 // 10
    mark_delete = positions[cut - 1] if cut else None
    return mark_delete, [positions[i] for i in range(cut + 1, end, 2)]


def drain(cluster: Any, tenant: str, subscription: str, initial: str | None = None) -> Counter[bytes]:
    """What a fresh consumer of the subscription receives (nothing acked). Exclusive: a Shared consumer stops
    getting messages at the broker's maxUnackedMessagesPerConsumer (50,000)."""
    import pulsar

    c = client(cluster)
    try:
        kwargs: dict[str, Any] = {}
        if initial is not None:
            kwargs["initial_position"] = getattr(pulsar.InitialPosition, initial)
        consumer = c.subscribe(partition(tenant), subscription, consumer_type=pulsar.ConsumerType.Exclusive,
                               receiver_queue_size=5_000, **kwargs)
        got: Counter[bytes] = Counter()
        wait = FIRST_MS
        while True:
            try:
                got[consumer.receive(wait).data()] += 1
            except pulsar.Timeout:
                break
            wait = IDLE_MS
        consumer.close()
        return got
    finally:
        c.close()


def judge(source: Counter[bytes], target: Counter[bytes]) -> dict[str, int]:
    return {"source_delivers": sum(source.values()), "target_delivers": sum(target.values()),
            "lost": sum((source - target).values()), "duplicated": sum((target - source).values())}


def run_ours(args: argparse.Namespace, tenants: Tenants, work: Path, spark: Any) -> dict[str, Any]:
    from pulsar_migration.metadata.step import run as meta_run
    from pulsar_migration.progress.apply import acknowledge
    from pulsar_migration.progress.step import STEP as PROGRESS
    from pulsar_migration.progress.step import add_args
    from pulsar_migration.progress.step import run as progress_run
    from pulsar_migration.replication.step import STEP as REPLICATE
    from pulsar_migration.replication.step import run as replicate_run
    from pulsar_migration.stepjob import run_step

    src = tenants.source
    tenant = tenants.create(f"bench-progress-{uuid.uuid4().hex[:6]}", on_source=True, on_target=False,
                            allowed=[SOURCE.name], partitions=1)
    src.put(f"/persistent/{seg(tenant)}/{NAMESPACE}/{TOPIC}/subscription/{SUBSCRIPTION}", {"ledgerId": -1,
                                                                                           "entryId": -1})
    out: dict[str, Any] = {"tenant": tenant, "messages": args.messages, "batch": args.batch}
    out["produce_s"] = produce(SOURCE, tenant, args.messages, args.batch)
    positions = entries(src, partition(tenant))
    mark_delete, acks = ack_pattern(positions)
    started = time.monotonic()
    sub_path = f"{src.topic_path(partition(tenant))}/subscription/{SUBSCRIPTION}"
    if mark_delete:
        src.post(f"{sub_path}/resetcursor", {"ledgerId": mark_delete[0], "entryId": mark_delete[1],
                                             "excluded": True})
    c = client(SOURCE)
    try:
        acknowledge(c, partition(tenant), SUBSCRIPTION, acks, max_in_flight=10_000)
    finally:
        c.close()
    out["ack_pattern_s"] = round(time.monotonic() - started, 3)
    cursor = src.get(f"{src.topic_path(partition(tenant))}/internalStats")["cursors"][SUBSCRIPTION]
    from pulsar_migration.positions import parse_ack_ranges

    out["entries"] = len(positions)
    out["source_ranges"] = len(parse_ack_ranges(cursor["individuallyDeletedMessages"]))
    out["source_mark_delete"] = cursor["markDeletePosition"]
    log.info("ours: %d messages in %d entries, markDelete %s, %d acked ranges", args.messages, len(positions),
             out["source_mark_delete"], out["source_ranges"])

    spec = write_spec(work / f"{tenant}.json", tenant, {})
    run_dir = work / f"{tenant}-run"
    args_of = ["--spec", str(spec), "--run-dir", str(run_dir)]
    started = time.monotonic()
    if run_step("sync_metadata", meta_run, args_of) != 0 or run_step(REPLICATE, replicate_run, args_of) != 0:
        raise RuntimeError("sync_metadata or replicate_topics failed; see the run dir " + str(run_dir))
    out["metadata_and_copy_s"] = round(time.monotonic() - started, 3)

    started = time.monotonic()
    code = run_step(PROGRESS, progress_run, args_of, add_args=add_args)
    out["sync_progress_s"] = round(time.monotonic() - started, 3)
    report = json.loads((run_dir / f"{PROGRESS}.json").read_text())
    out["exit_code"] = code
    out["report"] = {k: report["counts"].get(k) for k in ("subscriptions", "source_ranges", "mapped_entries",
                                                           "acks_sent", "lost", "duplicated", "source_backlog",
                                                           "target_backlog")}
    out["phases_s"] = {k: report["details"].get(k) for k in ("read_s", "translate_s", "apply_s", "verify_s")}
    out["phases_s"]["step_duration_s"] = report["duration_s"]
    log.info("ours: sync_progress %.1fs (exit %d): %s", out["sync_progress_s"], code, out["phases_s"])
    # A second run: nothing to do, the verification alone.
    started = time.monotonic()
    run_step(PROGRESS, progress_run, args_of, add_args=add_args)
    out["noop_rerun_s"] = round(time.monotonic() - started, 3)
    if not args.no_drain:
        started = time.monotonic()
        out["drain"] = judge(drain(SOURCE, tenant, SUBSCRIPTION), drain(TARGET, tenant, SUBSCRIPTION))
        out["drain_s"] = round(time.monotonic() - started, 3)
        log.info("ours: drains %s", out["drain"])
    return out


def run_pip33(args: argparse.Namespace, tenants: Tenants) -> dict[str, Any]:
    import pulsar

    src, tgt = tenants.source, tenants.target
    both = [SOURCE.name, TARGET.name]
    tenant = tenants.create(f"bench-pip33-{uuid.uuid4().hex[:6]}", on_source=True, on_target=True, allowed=both,
                            partitions=1, geo=True)
    out: dict[str, Any] = {"tenant": tenant, "messages": args.pip33_messages, "batch": args.batch,
                           "wait_s": args.pip33_wait}
    for admin in (src, tgt):
        admin.post(f"/namespaces/{seg(tenant)}/{NAMESPACE}/replication", both)
    c = client(SOURCE)
    try:
        # Exclusive: a Shared consumer would stop receiving at maxUnackedMessagesPerConsumer (50,000)
        consumer = c.subscribe(partition(tenant), SUBSCRIPTION, consumer_type=pulsar.ConsumerType.Exclusive,
                               initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=5_000,
                               replicate_subscription_state_enabled=True)
        out["produce_s"] = produce(SOURCE, tenant, args.pip33_messages, args.batch)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # every entry on the target
            if len(entries(tgt, partition(tenant))) >= len(entries(src, partition(tenant))):
                break
            time.sleep(1)
        positions = entries(src, partition(tenant))
        mark_delete, acks = ack_pattern(positions)
        acked = set(acks)
        received = []
        wait = FIRST_MS
        while True:
            try:
                received.append(consumer.receive(wait))
            except pulsar.Timeout:
                break
            wait = IDLE_MS
        started = time.monotonic()
        for m in received:  # the prefix acked message by message (as a Shared consumer must) moves markDelete
            mid = m.message_id()
            pos = (mid.ledger_id(), mid.entry_id())
            if (mark_delete and pos <= mark_delete) or pos in acked:
                consumer.acknowledge(m)
        out["ack_s"] = round(time.monotonic() - started, 3)
        time.sleep(args.pip33_wait)  # snapshots are taken every second by default
        consumer.close()
    finally:
        c.close()
    cursor = src.get(f"{src.topic_path(partition(tenant))}/internalStats")["cursors"][SUBSCRIPTION]
    out["source_mark_delete"] = cursor["markDeletePosition"]
    out["source_ranges"] = cursor["individuallyDeletedMessages"].count("(")
    target_cursors = tgt.get(f"{tgt.topic_path(partition(tenant))}/internalStats")["cursors"]
    out["target_subscription_exists"] = SUBSCRIPTION in target_cursors
    out["target_mark_delete"] = (target_cursors[SUBSCRIPTION]["markDeletePosition"]
                                 if SUBSCRIPTION in target_cursors else None)
    # Draining the source subscription with a plain consumer does not ack: its state stays.
    source = drain(SOURCE, tenant, SUBSCRIPTION)
    if out["target_subscription_exists"]:
        out["as_replicated"] = judge(source, drain(TARGET, tenant, SUBSCRIPTION))
    else:
        for initial in ("Latest", "Earliest"):
            out[f"target_{initial.lower()}"] = judge(source, drain(TARGET, tenant, SUBSCRIPTION, initial))
            tgt.delete(f"{tgt.topic_path(partition(tenant))}/subscription/{SUBSCRIPTION}")
    log.info("pip33: %s", {k: v for k, v in out.items() if k.startswith(("target", "as_"))})
    # The target replicates back to the source: take that out first, or the tenant cannot be deleted there.
    tgt.post(f"/namespaces/{seg(tenant)}/{NAMESPACE}/replication", [TARGET.name])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(name.startswith("pulsar.repl.") for name in tgt.get(
            f"{tgt.topic_path(partition(tenant))}/internalStats")["cursors"]):
        time.sleep(0.5)
    return out


def table(result: dict[str, Any]) -> list[str]:
    lines = ["| run | messages / entries | holes (source ranges) | sync_progress (s) | read / translate / apply / "
             "verify (s) | no-op re-run (s) | lost | duplicated |", "|---|---|---|---|---|---|---|---|"]
    ours = result.get("ours")
    if ours:
        p = ours["phases_s"]
        d = ours.get("drain") or {}
        lines.append(f"| sync_progress | {ours['messages']:,} / {ours['entries']:,} | {ours['source_ranges']:,} | "
                     f"{ours['sync_progress_s']} | {p['read_s']} / {p['translate_s']} / {p['apply_s']} / "
                     f"{p['verify_s']} | {ours['noop_rerun_s']} | {d.get('lost', ours['report']['lost'])} | "
                     f"{d.get('duplicated', ours['report']['duplicated'])} |")
    pip = result.get("pip33")
    if pip:
        for key, label in (("as_replicated", "PIP-33, replicated subscription"),
                           ("target_latest", "PIP-33, not replicated: consumer with Latest"),
                           ("target_earliest", "PIP-33, not replicated: consumer with Earliest")):
            if key in pip:
                j = pip[key]
                lines.append(f"| {label} | {pip['messages']:,} | {pip['source_ranges']:,} | - | - | - | "
                             f"{j['lost']:,} of {j['source_delivers']:,} | {j['duplicated']:,} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.progress_sync", description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=4, help="messages per entry (default 4)")
    parser.add_argument("--pip33-messages", type=int, default=200_000, help="0 = skip the PIP-33 run")
    parser.add_argument("--pip33-wait", type=float, default=60.0, help="seconds for snapshots after the acks")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--no-drain", action="store_true", help="skip draining ours (saves about a minute)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--keep", action="store_true", help="do not delete the benchmark tenants")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for chatty in ("py4j", "urllib3"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    src = PulsarAdmin(SOURCE.admin_url, name=SOURCE.name, timeout_s=120.0)
    tgt = PulsarAdmin(TARGET.admin_url, name=TARGET.name, timeout_s=120.0)
    for admin in (src, tgt):
        if not admin.healthy():
            print(f"error: cluster {admin.name} at {admin.admin_url} is not healthy", file=sys.stderr)
            return 1
    stamp = datetime.now(UTC)
    result: dict[str, Any] = {"benchmark": "progress_sync", "started": stamp.isoformat(timespec="seconds"),
                              "machine": machine(), "git": git_revision(), "loadavg_start": os.getloadavg()}
    tenants = Tenants(src, tgt)
    work = Path(tempfile.mkdtemp(prefix="progress-sync-"))
    spark, owned = None, False
    try:
        spark, owned, result["spark_start_s"] = start_spark(args.master)
        result["master"] = spark.sparkContext.master
        if args.messages:
            result["ours"] = run_ours(args, tenants, work, spark)
        if args.pip33_messages:
            result["pip33"] = run_pip33(args, tenants)
    finally:
        if spark is not None and owned:
            spark.stop()
        if not args.keep:
            result["cleanup_s"] = tenants.cleanup()
        src.close()
        tgt.close()
    result["loadavg_end"] = os.getloadavg()
    result["table"] = table(result)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / f"progress_sync-{stamp.strftime('%Y-%m-%dT%H%M%SZ')}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print("\n".join(result["table"]))
    print(f"\nresult: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
