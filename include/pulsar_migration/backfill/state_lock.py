"""One window at a time in a cluster sink's state dir.

The position map in the state dir has one writer by design (each window continues where the last one ended), and
the DAG runs one window at a time (max_active_runs=1). Airflow's `backfill create` does not keep to that: a backfill
has its own max_active_runs (10 by default), and its runs also overlap the scheduled ones. Two windows in one state
dir then raced on the map, on the target's producer names and on where the dir's coverage begins (the later window
recording first made the earlier one refused for good). A window now holds an exclusive lock on the state dir while
it copies; another waits for it. The lock is the kernel's (flock): a killed window leaves none behind.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

from pulsar_migration import rundir

log = logging.getLogger(__name__)

LOCK_FILE = ".window.lock"
POLL_S = 2.0


@contextmanager
def holding(state: str, holder: str, poll_s: float = POLL_S) -> Iterator[None]:
    """Holds the state dir's lock (waiting while another window holds it); `holder` names this window in the file,
    for the waiting one's log line. A state dir Spark writes (s3a://...) has no lock: a warning says so."""
    if not rundir.is_local(state):
        log.warning("the backfill state dir %s is not local: it cannot be locked, so run its windows one at a time "
                    "(the DAG's max_active_runs=1; `airflow backfill create ... --max-active-runs 1`)", state)
        yield
        return
    path = rundir.local_path(state)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, LOCK_FILE), "a+", encoding="utf-8") as lock:
        told = False
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not told:
                    lock.seek(0)
                    log.info("waiting for %s, which holds the backfill state dir %s", lock.read().strip()
                             or "another window", state)
                    told = True
                time.sleep(poll_s)
        lock.seek(0)
        lock.truncate()
        lock.write(f"{holder} (pid {os.getpid()})\n")
        lock.flush()
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
