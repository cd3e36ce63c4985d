"""Fault points for kill tests: a named point in a step pauses when the environment names it.

`PM_FAULT=<point>@<count>=<seconds>` makes `at(point, n)` sleep `seconds` when `n == count`, so a test can
SIGKILL the step at a known place instead of racing it (e.g. `progress.acks@5000=120`: after 5,000 of a
subscription's acknowledgements were handed to the client). With `PM_FAULT_MARK_DIR` set, a file named after
the point appears there when it parks, so the test knows when to kill, and the test can end the pause early by
creating `<point>.go` there (so a pause that lets the test act need not guess how long acting takes on a loaded
host). Unset, `at` costs a dictionary lookup.
"""

from __future__ import annotations

import logging
import os
import time
from functools import cache
from pathlib import Path

log = logging.getLogger(__name__)

ENV = "PM_FAULT"
MARK_DIR_ENV = "PM_FAULT_MARK_DIR"


@cache
def _armed() -> dict[str, tuple[int, float]]:
    points = {}
    for item in filter(None, os.environ.get(ENV, "").split(",")):
        name, _, rest = item.partition("@")
        count, _, seconds = rest.partition("=")
        points[name.strip()] = (int(count), float(seconds))
    return points


def at(point: str, n: int) -> None:
    """Pauses here if PM_FAULT arms `point` for the `n`-th pass."""
    armed = _armed().get(point)
    if armed and armed[0] == n:
        log.warning("fault point %s reached at %d: pausing %.0fs (%s)", point, n, armed[1], ENV)
        marks = os.environ.get(MARK_DIR_ENV)
        if not marks:
            time.sleep(armed[1])
            return
        Path(marks, point).touch()
        go, until = Path(marks, f"{point}.go"), time.monotonic() + armed[1]
        while time.monotonic() < until and not go.exists():
            time.sleep(0.1)
