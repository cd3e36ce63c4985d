"""Backfill DAG step: one time window of the tenant's topics to a cluster or a Parquet archive
(see pulsar_migration.backfill.step).

    spark-submit spark_jobs/backfill_window.py --spec SPEC.json --run-dir RUN_DIR --start ISO --end ISO [--dry-run]
"""

from __future__ import annotations

import sys

from pulsar_migration.backfill.step import BACKFILL_STEP, add_window_args, run_backfill
from pulsar_migration.stepjob import run_step


def main(argv: list[str] | None = None) -> int:
    return run_step(BACKFILL_STEP, run_backfill, argv, add_args=add_window_args)


if __name__ == "__main__":
    sys.exit(main())
