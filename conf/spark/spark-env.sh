# Sourced by Spark's launch scripts for every spark-submit of this project and every local SparkSession (they
# start through spark-submit); the Makefile, the tests and the local Airflow point SPARK_CONF_DIR here.
#
# Each step is a short-lived driver whose JVM mostly waits on Python: the C1 JIT alone and the serial collector
# start faster and spend far less CPU (one trivial spark-submit on the 2-core machine: 31.6 -> 18.6 CPU seconds).
pm_jvm="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
SPARK_SUBMIT_OPTS="${SPARK_SUBMIT_OPTS:-} $pm_jvm \"-Dspark.executor.extraJavaOptions=$pm_jvm\""
# A standalone master and worker (spark-class reads SPARK_DAEMON_JAVA_OPTS, not SPARK_SUBMIT_OPTS) start the same
# way: in the standalone DAG test, master + worker 35 -> 5 CPU seconds with the archive below.
SPARK_DAEMON_JAVA_OPTS="${SPARK_DAEMON_JAVA_OPTS:-} $pm_jvm"
#
# The driver maps a class-data archive of Spark's classes (localdev.spark_cds records it in the Spark home at
# set-up) instead of loading and verifying them from the jars: a trivial spark-submit 14.9 -> 9.4 CPU seconds.
# The JDK records no archive while a non-empty directory is on the class path, and Spark puts the configuration
# directory first on it: so after this file the launcher gets a directory that does not exist (and the settings
# above come through SPARK_SUBMIT_OPTS, `spark.*` system properties, rather than a spark-defaults.conf). The JVM
# checks an archive against its class path and JDK and ignores one that does not fit.
SPARK_CONF_DIR="${SPARK_CONF_DIR%/}/.driver-class-path"
if [[ -n "${PM_SPARK_CDS_RECORD:-}" ]]; then
  SPARK_SUBMIT_OPTS="$SPARK_SUBMIT_OPTS -XX:ArchiveClassesAtExit=$PM_SPARK_CDS_RECORD"
elif [[ -f "${SPARK_HOME}/pm-driver-cds.jsa" ]]; then
  SPARK_SUBMIT_OPTS="$SPARK_SUBMIT_OPTS -XX:SharedArchiveFile=${SPARK_HOME}/pm-driver-cds.jsa"
  SPARK_DAEMON_JAVA_OPTS="$SPARK_DAEMON_JAVA_OPTS -XX:SharedArchiveFile=${SPARK_HOME}/pm-driver-cds.jsa"
fi
unset pm_jvm
