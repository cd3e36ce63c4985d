"""CPU by process class, sampled from /proc once a second, and its share in each timed window of a
replication_throughput run: what each method asked of the brokers and of everything else, per GB moved.

    .venv/bin/python -m benchmarks.cpu_by_process sample TIMELINE.json      # until SIGINT or SIGTERM
    .venv/bin/python -m benchmarks.cpu_by_process attribute RUN.log TIMELINE.json --mb 768

Run `sample` beside the benchmark (its stdout and stderr in RUN.log), stop it after, then `attribute`. Classes:
broker-a and broker-b (each local cluster is one standalone JVM: broker, bookie and metadata store), engine (the
copy engine's JVM or the bare entry copy's), spark-jvm, python (the benchmark, Spark's Python workers, this
sampler), other. A window ends at its log line and lasts the data set's MB over the method's MB/s (the copy's step
wall); samples cover whole seconds, so a window of a few seconds is counted to about a second either way.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
WINDOW_LINE = re.compile(
    r"(\S+ \S+),\d+ INFO __main__: (\S+) (bare|copy|geo): (?:copy phase [\d.]+ MB/s, step wall )?([\d.]+) MB/s")


def process_class(cmdline: str) -> str:
    if "EntryCopy" in cmdline:
        return "engine"
    program = cmdline.split("\0", 1)[0]
    if "java" in program:
        for cluster in ("cluster-a", "cluster-b"):
            if f"/{cluster}/" in cmdline:
                return f"broker-{cluster[-1]}"
        return "spark-jvm" if "org.apache.spark" in cmdline else "other"
    return "python" if "python" in program else "other"


def process_cpu_seconds(pid: int | str) -> float:
    """The CPU (user + system) process `pid` used so far; OSError when it is gone."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def cpu_seconds() -> dict[str, tuple[str, float]]:
    """Per pid: its class and the CPU (user + system) it used so far."""
    seen: dict[str, tuple[str, float]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            seen[pid] = (process_class(Path(f"/proc/{pid}/cmdline").read_text()), process_cpu_seconds(pid))
        except OSError:
            continue  # gone meanwhile
    return seen


def sample(out: Path) -> None:
    stopped = False

    def stop(*_: object) -> None:
        nonlocal stopped
        stopped = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    before = cpu_seconds()
    timeline: list[tuple[int, dict[str, float]]] = []
    while not stopped:
        time.sleep(1)
        now = cpu_seconds()
        second: dict[str, float] = {}
        for pid, (kind, used) in now.items():
            delta = used - before.get(pid, (kind, 0.0))[1]
            if delta > 0:
                second[kind] = second.get(kind, 0.0) + delta
        timeline.append((round(time.time()), {k: round(v, 3) for k, v in second.items()}))
        before = now
    out.write_text(json.dumps({"sampled_every_s": 1, "timeline": timeline}))


def windows(log: Path, mb: float) -> Iterator[tuple[str, str, float, float]]:
    """(data set, method, start, end) as epoch seconds, from the benchmark's log lines."""
    for line in log.read_text().splitlines():
        match = WINDOW_LINE.match(line)
        if match:
            logged = datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S")
            end = logged.replace(tzinfo=datetime.UTC).timestamp() + 0.5
            yield match.group(2), match.group(3), end - mb / float(match.group(4)), end


def attribute(log: Path, timeline_file: Path, mb: float) -> list[dict[str, object]]:
    timeline = json.loads(timeline_file.read_text())["timeline"]
    rows: list[dict[str, object]] = []
    for data_set, method, start, end in windows(log, mb):
        used: dict[str, float] = {}
        for at, second in timeline:
            if start < at - 0.5 <= end:  # the sample taken at `at` covers the second before it
                for kind, cpu in second.items():
                    used[kind] = used.get(kind, 0.0) + cpu
        brokers = used.get("broker-a", 0.0) + used.get("broker-b", 0.0)
        rest = sum(used.values()) - brokers
        per_gb = 1000 / mb
        rows.append({"data_set": data_set, "method": method, "window_s": round(end - start, 1),
                     "broker_a": round(used.get("broker-a", 0.0) * per_gb, 1),
                     "broker_b": round(used.get("broker-b", 0.0) * per_gb, 1),
                     "brokers": round(brokers * per_gb, 1), "rest": round(rest * per_gb, 1),
                     "cores_busy": round((brokers + rest) / (end - start), 2)})
    return rows


def markdown(rows: list[dict[str, object]]) -> str:
    lines = ["| data set | method | window (s) | broker-a | broker-b | **brokers** | engine, Spark, Python "
             "| cores busy |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['data_set']} | {r['method']} | {r['window_s']} | {r['broker_a']} | {r['broker_b']} | "
                     f"**{r['brokers']}** | {r['rest']} | {r['cores_busy']} |")
    return "\n".join(lines) + "\n\n(core-seconds per GB moved)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    sampling = commands.add_parser("sample", help="sample until SIGINT or SIGTERM, then write the timeline")
    sampling.add_argument("out", type=Path)
    attributing = commands.add_parser("attribute", help="CPU per GB in each timed window of a run")
    attributing.add_argument("log", type=Path)
    attributing.add_argument("timeline", type=Path)
    attributing.add_argument("--mb", type=float, required=True, help="the run's MB per data set")
    attributing.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    if args.command == "sample":
        sample(args.out)
        return 0
    rows = attribute(args.log, args.timeline, args.mb)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
