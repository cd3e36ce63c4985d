"""A class-data archive (CDS) for the driver JVM of every spark-submit and local SparkSession.

Each spark-submit starts a JVM that loads and verifies thousands of Spark's classes from its jars; on the
2-core machine that is most of a bare spark-submit's CPU, paid again by every step of every DAG run. A
dynamic archive of those classes, recorded once by a training job, is mapped instead: conf/spark/spark-env.sh
adds it to SPARK_SUBMIT_OPTS when it exists. It is valid only for one Spark home (its jars), one JDK and one
configuration directory (the driver's class path starts with it): it lives in the Spark home, and a key file
beside it names the JDK and the configuration directory it was made for; a change makes it again. The JVM
checks the archive itself and ignores one that does not fit (the driver only starts slower).

Run by scripts/setup_venv.sh (`python -m localdev.spark_cds`); a second run finds the archive current and
changes nothing. `spark-submit this_file --train` is the training job.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from localdev.java_programs import java_version
from localdev.paths import PROJECT_ROOT

log = logging.getLogger(__name__)

ARCHIVE = "pm-driver-cds.jsa"  # the name conf/spark/spark-env.sh looks for
KEY = "pm-driver-cds.key"


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def conf_dir() -> Path:
    return Path(os.environ.get("SPARK_CONF_DIR", PROJECT_ROOT / "conf" / "spark")).resolve()


def archive_key(home: Path, conf: Path) -> str:
    """What the archive was made for: the JDK, the jars (names and sizes) and the configuration directory."""
    jars = sorted(f"{p.name}:{p.stat().st_size}" for p in (home / "jars").glob("*.jar"))
    return hashlib.sha256("\n".join([java_version(), str(conf), *jars]).encode()).hexdigest()


def ensure(home: Path | None = None, conf: Path | None = None) -> bool:
    """Records the archive unless a current one is there; True when it recorded one."""
    home, conf = home or spark_home(), conf or conf_dir()
    archive, key_file = home / ARCHIVE, home / KEY
    key = archive_key(home, conf)
    with open(home / ".pm-driver-cds.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        made_for = key_file.read_text() if key_file.exists() else None
        if made_for == f"failed {key}" or (made_for == key and archive.exists()):
            return False  # current, or this Spark and JDK record none: not tried on every set-up
        archive.unlink(missing_ok=True)  # spark-env.sh must not map a stale one into the training run
        key_file.unlink(missing_ok=True)
        partial = home / f".{ARCHIVE}.{os.getpid()}.partial"
        env = {**os.environ, "SPARK_CONF_DIR": str(conf), "PYSPARK_PYTHON": sys.executable,
               "PM_SPARK_CDS_RECORD": str(partial)}  # conf/spark/spark-env.sh: record instead of map
        env.pop("SPARK_ENV_LOADED", None)  # spark-env.sh is read again
        with tempfile.TemporaryDirectory() as work:
            done = subprocess.run([str(home / "bin" / "spark-submit"), "--master", "local[2]", __file__, "--train"],
                                  env=env, cwd=work, capture_output=True, text=True)
        if done.returncode != 0 or not partial.exists():
            partial.unlink(missing_ok=True)
            last = done.stderr.strip().splitlines()[-1:] or ["no output"]
            log.warning("no Spark class archive was recorded (spark-submit exit %s: %s); Spark only starts slower",
                        done.returncode, last[0])
            key_file.write_text(f"failed {key}")
            return False
        os.replace(partial, archive)
        key_file.write_text(key)
    log.info("Spark class archive recorded: %s", archive)
    return True


def train() -> None:
    """What the steps' drivers do, in small: DataFrames from Python rows, joins and aggregates, a Python UDF,
    mapPartitions, Parquet written and read back, collect."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = SparkSession.builder.appName("pm-cds-training").getOrCreate()
    try:
        rows = spark.createDataFrame([(i, f"k{i % 7}", float(i)) for i in range(2_000)],
                                     "id long, key string, value double")
        totals = rows.groupBy("key").agg(F.count("*").alias("n"), F.sum("value").alias("total"))
        upper = F.udf(lambda s: s.upper(), "string")
        joined = rows.join(F.broadcast(totals), "key").withColumn("upper", upper("key")).persist()
        with tempfile.TemporaryDirectory() as work:
            joined.coalesce(2).write.mode("overwrite").parquet(f"{work}/rows")
            back = spark.read.parquet(f"{work}/rows")
            sums = back.rdd.mapPartitions(lambda part: [sum(r.id for r in part)]).collect()
            assert sum(sums) == sum(range(2_000))
            assert back.join(totals, "key", "left_anti").count() == 0
        joined.unpersist()
    finally:
        spark.stop()


def main(argv: list[str]) -> int:
    if argv[:1] == ["--train"]:
        train()
        return 0
    logging.basicConfig(level=logging.INFO, format="setup: %(message)s", stream=sys.stderr)
    ensure()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
