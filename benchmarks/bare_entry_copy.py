"""The bare entry copy (benchmarks/java/BareEntryCopy.java): a benchmark anchor, built and run from Python.

It is the copy engine with everything the issue asks of it taken away (added properties, hashes, the read-back,
deduplication, Spark): one JVM moving stored entries from source partitions to target partitions as they are.
Its speed is what any copy through a third process can reach on the machine, to set beside native
geo-replication (which runs inside the source broker) and the full copy.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pulsar_migration.replication import engine

SOURCE = Path(__file__).resolve().parent / "java" / "BareEntryCopy.java"
MAIN_CLASS = "org.apache.pulsar.client.impl.BareEntryCopy"
# The engine's JVM settings (heap, GC, inlining) so that the two differ only in the work they do.
JVM_OPTIONS = tuple(o for o in engine.JVM_OPTIONS if not o.startswith("-Xshare"))
# Parts of the engine's work that can be added back (see the Java source): the two properties, the hash.
ADDS = ("tags", "hash")


class BareCopyError(RuntimeError):
    pass


@dataclass(frozen=True)
class Partition:
    source_topic: str
    target_topic: str
    entries: int


def compiled() -> tuple[Path, Path, Path]:
    """(classes dir, engine jar, the distribution's lib/): compiled against the engine's build and the Pulsar
    distribution, once per source."""
    lib = engine.pulsar_lib()
    if lib is None or engine.unavailable_reason():
        raise BareCopyError(f"bare copy: {engine.unavailable_reason()}")
    build = engine.compiled(lib)
    key = hashlib.sha256(SOURCE.read_bytes() + build.jar.parent.name.encode()).hexdigest()[:16]
    classes = engine.cache_dir() / "bare" / key
    if not (classes / "done").exists():
        answer = subprocess.run(["javac", "-nowarn", "-cp", f"{build.jar}:{lib}/*", "-d", str(classes), str(SOURCE)],
                                capture_output=True, text=True)
        if answer.returncode != 0:
            raise BareCopyError(f"compiling BareEntryCopy failed: {answer.stderr.strip()[:500]}")
        (classes / "done").touch()
    return classes, build.jar, lib


def run(source_url: str, target_url: str, partitions: list[Partition], adds: tuple[str, ...] = (),
        timeout_s: float = 1800.0) -> dict[str, Any]:
    """Copies every partition's stored entries, doing `adds` of the engine's work too; the JVM's own figures
    (setup_ms, copy_ms, entries, ...)."""
    unknown = set(adds) - set(ADDS)
    if unknown:
        raise BareCopyError(f"bare copy: unknown additions {sorted(unknown)} (known: {', '.join(ADDS)})")
    classes, jar, lib = compiled()
    args = [source_url, target_url]
    for p in partitions:
        args += [p.source_topic, p.target_topic, str(p.entries)]
    flags = [f"-Dbare.{name}=true" for name in adds]
    answer = subprocess.run(["java", *JVM_OPTIONS, *flags, f"-Dlog4j2.configurationFile={engine.LOG_CONFIG}",
                             "-cp", f"{classes}:{jar}:{lib}/*", MAIN_CLASS, *args],
                            capture_output=True, text=True, timeout=timeout_s)
    lines = [line for line in answer.stdout.splitlines() if line.startswith("{")]
    if answer.returncode != 0 or not lines:
        why = json.loads(lines[-1]).get("error") if lines else answer.stderr.strip()[-500:]
        raise BareCopyError(f"bare copy exited {answer.returncode}: {why}")
    result: dict[str, Any] = json.loads(lines[-1])
    if result["receipts"] != result["entries"]:
        raise BareCopyError(f"bare copy: {result['receipts']} receipts for {result['entries']} entries")
    return result
