"""After a tenant migration's switch: switch its live clients back to the source (see
pulsar_migration.switch.rollback). RUN_DIR is the migration's run dir (its position map is needed).

    spark-submit spark_jobs/rollback_lookup.py --spec SPEC.json --run-dir RUN_DIR [--dry-run]
"""

from __future__ import annotations

import sys

from pulsar_migration.stepjob import run_step
from pulsar_migration.switch.rollback import STEP, run


def main(argv: list[str] | None = None) -> int:
    return run_step(STEP, run, argv)


if __name__ == "__main__":
    sys.exit(main())
