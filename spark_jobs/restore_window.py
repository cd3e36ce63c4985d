"""Restore: an archived time window replayed into the spec's target cluster, exactly once
(see pulsar_migration.backfill.step and pulsar_migration.backfill.restore).

    spark-submit spark_jobs/restore_window.py --spec SPEC.json --run-dir RUN_DIR --start ISO --end ISO [--dry-run]
"""

from __future__ import annotations

import sys

from pulsar_migration.backfill.step import RESTORE_STEP, add_window_args, run_restore
from pulsar_migration.stepjob import run_step


def main(argv: list[str] | None = None) -> int:
    return run_step(RESTORE_STEP, run_restore, argv, add_args=add_window_args)


if __name__ == "__main__":
    sys.exit(main())
