"""conf/spark/spark-env.sh through real spark-submit, as the DAGs' tasks run it: the driver JVM maps the class-data
archive localdev.spark_cds recorded at set-up, and the project's JVM options still reach the driver and the
executors (they moved from spark-defaults.conf into SPARK_SUBMIT_OPTS so that the JDK could record the archive)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from localdev import spark_cds
from localdev.airflow_local import airflow_env, venv_bin

# The driver's Python process is a child of the driver JVM (PythonRunner): it reads the JVM's maps and arguments.
JOB = '''
import json, os, sys
from pyspark.sql import SparkSession

spark = SparkSession.builder.getOrCreate()
jvm = os.getppid()
with open(f"/proc/{jvm}/maps") as maps:
    mapped = sorted({line.split()[-1] for line in maps if line.rstrip().endswith(".jsa")})
with open(f"/proc/{jvm}/cmdline", "rb") as cmdline:
    arguments = cmdline.read().decode().split("\\0")
conf = spark.sparkContext.getConf()
print("RESULT " + json.dumps({"mapped": mapped, "arguments": arguments,
                              "executor_options": conf.get("spark.executor.extraJavaOptions", ""),
                              "sum": spark.sparkContext.parallelize(range(10), 2).sum()}))
spark.stop()
'''


def test_a_spark_submit_driver_maps_the_class_archive_and_keeps_the_jvm_options(tmp_path: Path) -> None:
    archive = spark_cds.spark_home() / spark_cds.ARCHIVE
    assert archive.exists(), "scripts/setup_venv.sh records it (python -m localdev.spark_cds)"
    job = tmp_path / "job.py"
    job.write_text(JOB)
    done = subprocess.run([str(venv_bin() / "spark-submit"), "--master", "local[2]", str(job)],
                          env=airflow_env(tmp_path / "airflow"), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(next(line[7:] for line in done.stdout.splitlines() if line.startswith("RESULT ")))
    assert result["sum"] == 45
    assert str(archive) in result["mapped"], result["mapped"]  # the JVM ignores an archive that does not fit
    assert {"-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"} <= set(result["arguments"])
    assert "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC" in result["executor_options"]
    # The class path starts with a directory that does not exist (the JDK maps no archive past a non-empty one).
    class_path = result["arguments"][result["arguments"].index("-cp") + 1].split(":")
    assert class_path[0].endswith("/.driver-class-path") and not Path(class_path[0]).exists()
