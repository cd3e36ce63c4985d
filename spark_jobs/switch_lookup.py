"""Step 4 of a tenant migration: the fenced switch of live clients (see pulsar_migration.switch.step).

    spark-submit spark_jobs/switch_lookup.py --spec SPEC.json --run-dir RUN_DIR [--dry-run]
"""

from __future__ import annotations

import sys

from pulsar_migration.stepjob import run_step
from pulsar_migration.switch.step import STEP, run


def main(argv: list[str] | None = None) -> int:
    return run_step(STEP, run, argv)


if __name__ == "__main__":
    sys.exit(main())
