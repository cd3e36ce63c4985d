"""Step 5 of a tenant migration: remove the tenant's copy from the source only (see pulsar_migration.cleanup.step).

    spark-submit spark_jobs/cleanup_source.py --spec SPEC.json --run-dir RUN_DIR [--dry-run] [--delete-tenant]
"""

from __future__ import annotations

import sys

from pulsar_migration.cleanup.step import STEP, add_args, run
from pulsar_migration.stepjob import run_step


def main(argv: list[str] | None = None) -> int:
    return run_step(STEP, run, argv, add_args=add_args)


if __name__ == "__main__":
    sys.exit(main())
