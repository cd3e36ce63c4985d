"""cpu_by_process: process classes from command lines, CPU summed inside each timed window of a run."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from benchmarks.cpu_by_process import attribute, process_class


def test_process_classes_follow_the_command_line() -> None:
    broker = "/usr/bin/java\0-Dpulsar.log.dir=/work/main/var/pulsar/cluster-b/logs\0PulsarStandaloneStarter"
    assert process_class(broker) == "broker-b"
    assert process_class("java\0-cp\0x.jar\0org.apache.pulsar.client.impl.EntryCopy") == "engine"
    assert process_class("java\0-cp\0x\0org.apache.spark.deploy.SparkSubmit\0pyspark-shell") == "spark-jvm"
    assert process_class("/work/main/.venv/bin/python\0-m\0benchmarks.replication_throughput") == "python"
    assert process_class("/bin/sh\0-c\0true") == "other"


def _stamp(epoch: int) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")


def test_each_window_sums_the_seconds_it_covers_per_gb(tmp_path: Path) -> None:
    # 100 MB per data set: the copy at 25 MB/s is 4 s ending at t0+10, geo at 50 MB/s is 2 s ending at t0+20.
    t0 = 1_800_000_000
    log = tmp_path / "run.log"
    log.write_text(
        f"{_stamp(t0 + 10)},001 INFO __main__: 1024B-batched copy: copy phase 30.0 MB/s, step wall 25.0 MB/s\n"
        f"{_stamp(t0 + 12)},001 INFO other: not a window\n"
        f"{_stamp(t0 + 20)},001 INFO __main__: 1024B-batched geo: 50.0 MB/s (first entry after 1.0s)\n")
    # A sample stamped t covers the second before it; the log's second is taken at its middle (+0.5). broker-a's
    # CPU in a sample is its offset from t0, so the sum names the samples a window took.
    timeline = [[t, {"broker-a": float(t - t0), "broker-b": 0.5, "engine": 0.25}] for t in range(t0, t0 + 22)]
    path = tmp_path / "timeline.json"
    path.write_text(json.dumps({"timeline": timeline}))
    copy, geo = attribute(log, path, mb=100.0)
    assert (copy["data_set"], copy["method"], copy["window_s"]) == ("1024B-batched", "copy", 4.0)
    # The samples t0+8 .. t0+11 (10 per GB: 100 MB moved): broker-a 8+9+10+11 core-seconds.
    assert (copy["broker_a"], copy["broker_b"], copy["brokers"], copy["rest"]) == (380.0, 20.0, 400.0, 10.0)
    assert copy["cores_busy"] == 10.25  # (38 + 2 + 1) core-seconds over 4 s
    # The samples t0+20 and t0+21.
    assert (geo["method"], geo["window_s"], geo["broker_a"], geo["rest"]) == ("geo", 2.0, 410.0, 5.0)
