"""The brokers on some CPUs, everything else on the others: the deployment a migration tool meets, emulated on one
machine. In production the Pulsar clusters run on their own hosts and Spark's executors on theirs; here both
local brokers and all clients (Spark, the copy engine, the raw and naive clients) share two cores, so a copy's own
work takes CPU from the brokers, which geo-replication (inside the source broker) never pays.

    .venv/bin/python -m benchmarks.cpu_split show               # each broker's CPUs
    .venv/bin/python -m benchmarks.cpu_split restore            # both brokers back on every CPU

`split(brokers, clients)` pins every thread of both broker JVMs to `brokers` and every thread of this process to
`clients` (processes it starts later inherit that), and puts the brokers back on every CPU when it ends, also on a
SIGTERM; after a SIGKILL, `restore` does it. Threads a pinned thread creates inherit its CPUs.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
from collections.abc import Iterator

from benchmarks.cpu_by_process import cpu_seconds

log = logging.getLogger(__name__)


def all_cpus() -> set[int]:
    return set(range(os.cpu_count() or 1))


def broker_pids() -> dict[str, int]:
    """The local brokers' JVMs: {"broker-a": pid, "broker-b": pid}, as cpu_by_process tells them apart."""
    return {kind: int(pid) for pid, (kind, _) in cpu_seconds().items() if kind.startswith("broker-")}


def pin(pid: int, cpus: set[int]) -> int:
    """Every thread of `pid` onto `cpus` (sched_setaffinity acts on one thread); returns how many were pinned."""
    pinned = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(tid), cpus)
            pinned += 1
    return pinned


def parse_cpus(text: str) -> set[int]:
    """'0', '0,1' or '0-3' (Linux's cpu-list form)."""
    cpus: set[int] = set()
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    unknown = cpus - all_cpus()
    if not cpus or unknown:
        raise ValueError(f"CPU list {text!r} names CPUs this machine does not have ({sorted(unknown)})")
    return cpus


@contextlib.contextmanager
def split(brokers: set[int], clients: set[int]) -> Iterator[dict[str, object]]:
    """Brokers on `brokers`, this process (and what it starts from now on) on `clients`; yields what was done."""
    if brokers & clients:
        raise ValueError(f"the brokers' CPUs {sorted(brokers)} and the clients' {sorted(clients)} overlap")
    pids = broker_pids()
    if set(pids) != {"broker-a", "broker-b"}:
        raise RuntimeError(f"expected both local brokers running, found {sorted(pids) or 'none'}")
    own_before = os.sched_getaffinity(0)
    done: dict[str, object] = {"brokers": sorted(brokers), "clients": sorted(clients)}
    # A SIGTERM (kill, a stopped session) would end the process without `finally`: the brokers would stay pinned.
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        for name, pid in sorted(pids.items()):
            done[f"{name}_threads"] = pin(pid, brokers)
        pin(os.getpid(), clients)
        log.info("CPU split: brokers %s on CPUs %s, this process and its children on %s", pids, sorted(brokers),
                 sorted(clients))
        yield done
    finally:
        restore()
        pin(os.getpid(), own_before)
        signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def restore() -> dict[str, int]:
    """Both brokers back on every CPU; returns the threads moved per broker."""
    moved = {}
    for name, pid in broker_pids().items():
        with contextlib.suppress(FileNotFoundError):
            moved[name] = pin(pid, all_cpus())
    return moved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("show", "restore"))
    args = parser.parse_args(argv)
    if args.command == "restore":
        print(restore())
        return 0
    for name, pid in sorted(broker_pids().items()):
        print(name, pid, sorted(os.sched_getaffinity(pid)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
