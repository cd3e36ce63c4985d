"""Step 2 of a tenant migration: topic data replication (see pulsar_migration.replication.step).

    spark-submit spark_jobs/replicate_topics.py --spec SPEC.json --run-dir RUN_DIR [--dry-run]
"""

from __future__ import annotations

import sys

from pulsar_migration.replication.step import STEP, run
from pulsar_migration.stepjob import run_step


def main(argv: list[str] | None = None) -> int:
    return run_step(STEP, run, argv)


if __name__ == "__main__":
    sys.exit(main())
