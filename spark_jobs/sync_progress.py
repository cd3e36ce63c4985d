"""Step 3 of a tenant migration: consumption progress sync (see pulsar_migration.progress.step).

    spark-submit spark_jobs/sync_progress.py --spec SPEC.json --run-dir RUN_DIR [--dry-run] [--markdelete-only]
"""

from __future__ import annotations

import sys

from pulsar_migration.progress.step import STEP, add_args, run
from pulsar_migration.stepjob import run_step


def main(argv: list[str] | None = None) -> int:
    return run_step(STEP, run, argv, add_args=add_args)


if __name__ == "__main__":
    sys.exit(main())
