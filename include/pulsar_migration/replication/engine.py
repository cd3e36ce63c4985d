"""The Java copy engine (java/EntryCopy.java): one partition's entries copied whole by the Pulsar Java client.

The Python path (replication.sending) decodes every message and builds each batch again, which bounds it by
Python's CPU per message. The engine receives each source entry as the broker stores it and sends it as one
entry: its messages and their metadata unchanged except for the two properties every copy carries, the sequence
id derived from the source position and the producer names of the Python path (so either path's re-send is
dropped by the target's deduplication). It hashes the source's messages exactly as content.ContentHash does and
sums its send receipts as content.PairDigest does; the partition's read-back of the target judges both.

It runs as a `java` child of the Spark task, compiled once per source version and JDK into the cache directory against
a Pulsar distribution's lib/ (PULSAR_HOME, or the local distribution of the development set-up). A chunked message
is put together from its chunks as the Java client's consumer does and sent whole at its last chunk, where a reader
delivers it (the producer chunks it again), as the Python path does. Encrypted entries and chunked messages past
the engine's byte bound are left to the Python path: the engine stops before the first one, drained, and the
partition continues where the target ends, as after a kill.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from pulsar_migration.cachedir import build_once
from pulsar_migration.cachedir import cache_dir as user_cache_dir
from pulsar_migration.positions import Position
from pulsar_migration.spec import MigrationSpec
from pulsar_migration.throttle import Caps

log = logging.getLogger(__name__)

ENGINE_CLASS = "org.apache.pulsar.client.impl.EntryCopy"
JAVA_DIR = Path(__file__).with_name("java")
SOURCE_NAME = "EntryCopy.java"
LOG_CONFIG_NAME = "log4j2-engine.xml"
LOG_CONFIG = JAVA_DIR / LOG_CONFIG_NAME  # in the source tree (the benchmarks' own Java uses it)
# One engine per group of partitions next to the brokers: a small heap and one GC thread. The full JIT stays on:
# the C2 compiler's SHA-256 intrinsic is most of the gain on batched sources (C1 alone halves hashing speed). But
# compiling is most of the engine's CPU on a 192 MB copy (5.8 of 8.6 s measured, -XX:+CITime): smaller inlining
# took a standalone copy's CPU from 8.1-8.8 s to 6.6-7.1 s and, two runs each on 2 busy cores, the 256 B batched
# step from 19.5-19.8 to 23.9-24.0 MB/s (1 KiB batched and unbatched: within noise).
# Direct memory (the readers' queues, two readers per partition copied) is set apart from the heap's size: the
# client falls back to heap buffers when it runs out.
# The C2 compiler also waits for 30x the default counts, except on the two SHA-256 methods it replaces with the
# CPU's instructions (a third of the default counts there). The compiler threads went from 4.2-4.6 to 2.4-2.5 s of
# CPU over three 192 MB batched copies (256 B, 1 KiB, 16 KiB), engine CPU -8%; step wall, three alternating runs each
# on two busy cores: 256 B batched 34.4 -> 34.5 MB/s, 1 KiB 44.2 -> 46.9, 16 KiB 51.0 -> 54.8; 1 KiB unbatched 11.2
# -> 13.4. Measured beside it (two runs each): C2 alone (-TieredCompilation) slower on 16 KiB, 10x the counts about
# the same, 100x slower on 256 B (the parsing stays longer in C1).
C2_LATER = ("-XX:Tier4InvocationThreshold=150000", "-XX:Tier4MinInvocationThreshold=18000",
            "-XX:Tier4CompileThreshold=450000", "-XX:Tier4BackEdgeThreshold=1200000", "-XX:CompileCommand=quiet",
            *(f"-XX:CompileCommand=option,sun.security.provider.{method},double,CompileThresholdScaling,0.01"
              for method in ("SHA2::implCompress0", "DigestBase::implCompressMultiBlock0")))
JVM_OPTIONS = ("-Xmx512m", "-XX:MaxDirectMemorySize=1g", "-XX:+UseSerialGC", "-Xshare:auto", "-XX:FreqInlineSize=100",
               "-XX:MaxInlineLevel=9", *C2_LATER)
RECEIVER_QUEUE = 5000
STDERR_LINES = 50  # the engine's last log lines kept for an error line
# How long a closed engine may take to exit: it halts at once, or writes its class archive (a few seconds) first.
CLOSE_TIMEOUT_S = 120
# A partition's readers (the copy's and the read-back's) hold at most about this many bytes of received entries
# (direct memory): the queue is counted in messages, and 5000 of 16 KiB are 80 MB a reader, 8 readers per engine.
RECEIVER_QUEUE_BYTES = 16 * 1024 * 1024
MIN_RECEIVER_QUEUE = 100


def receiver_queue_for(average_message_bytes: float | None) -> int:
    """The readers' queue (messages) for a partition whose messages average `average_message_bytes`."""
    if not average_message_bytes:
        return RECEIVER_QUEUE
    return max(MIN_RECEIVER_QUEUE, min(RECEIVER_QUEUE, int(RECEIVER_QUEUE_BYTES / average_message_bytes)))


class EngineError(RuntimeError):
    """The engine could not be prepared or failed; the message is one line."""


@dataclass(frozen=True)
class EngineScan:
    """The engine's read-back of the target, alongside its copy (partition.scan_copied_target in Java): the content
    hash and counts of everything after the map's last target entry, the digest of the (source, target) pairs it
    sent and got receipts for, the entry-shape errors, and the map rows in `rows_file` (ROW_FIELDS, big-endian
    int64 each)."""

    messages: int
    entries: int
    bytes: int
    hash: str
    pairs: int
    pairs_digest: str
    shape_errors: int
    first_shape_errors: tuple[str, ...]
    rows: int
    scan_s: float  # what the read-back added after the copy (it runs alongside it)
    busy_s: float = 0.0  # the read-back's whole time

    @classmethod
    def parse(cls, data: dict[str, Any]) -> EngineScan | None:
        if "fallback_at" in data:  # an encrypted entry, a chunked message too large, an end it cannot place
            return None
        return cls(data["messages"], data["entries"], data["bytes"], data["hash"], data["pairs"],
                   data["pairs_digest"], data["shape_errors"], tuple(data["first_shape_errors"]), data["rows"],
                   data.get("scan_ms", 0) / 1000, data.get("scan_busy_ms", 0) / 1000)


# One map row of the engine's rows file: ROW_FIELDS then CHUNK_FIELDS, big-endian int64 each (read by
# posmap.engine_rows_table). CHUNK_FIELDS: a chunked message's first chunk on either side (ledger -1: none).
ROW_FIELDS = ("source_ledger", "source_entry", "source_messages", "source_batched", "target_ledger", "target_entry",
              "target_messages", "target_batched", "source_publish_time")
CHUNK_FIELDS = ("source_first_chunk", "target_first_chunk")
ROW_LONGS = len(ROW_FIELDS) + 2 * len(CHUNK_FIELDS)



@dataclass(frozen=True)
class EngineResult:
    source_messages: int
    source_entries: int
    source_bytes: int
    source_hash: str
    copied_messages: int
    copied_entries: int
    copied_bytes: int
    skipped_messages: int
    deduplicated: int
    delayed_messages: int
    receipts: int
    receipts_digest: str
    deduplicated_sources: frozenset[Position]
    fallback_at: Position | None  # the first entry the engine left to the Python path (None: it did all)
    copy_s: float = 0.0  # this partition's copy inside the engine (its process start and clients not included)
    read_wait_s: float = 0.0  # of which its copy thread waited for the source, then for the target's receipts
    send_wait_s: float = 0.0
    read_back_wait_s: float = 0.0  # the copy held back for its read-back to keep up (reads from the broker's cache)
    throttle_wait_s: float = 0.0  # the copy held back by the run's rate caps (options.copy_max_mb/msgs_per_s)
    scan: EngineScan | None = None  # None: not asked for, or left to the Python path
    # Chunked messages begun before the range (an earlier run's bound inside them) whose earlier chunks it read again.
    earlier_chunk_messages: int = 0
    # Chunked messages no reader delivers (a chunk missing, or the first ones not found): not copied, as not read.
    unassembled_chunked_messages: int = 0
    # Messages read through the compacted view: a compaction kept them, the source's ledgers no longer hold them.
    compacted_messages: int = 0
    # Readings again after the source's reader was moved past stored entries (a message TTL: EntryCopy.Gaps).
    reader_rereads: int = 0
    # The last source entry it took (the range's start when none): a fenced final delta must reach its bound.
    read_to: Position | None = None

    @classmethod
    def parse(cls, data: dict[str, Any]) -> EngineResult:
        def pos(text: str) -> Position:
            ledger, entry = text.split(":")
            return Position(int(ledger), int(entry))

        derived = ("deduplicated_sources", "fallback_at", "copy_s", "read_wait_s", "send_wait_s", "read_back_wait_s",
                   "throttle_wait_s", "scan", "earlier_chunk_messages", "unassembled_chunked_messages",
                   "compacted_messages", "reader_rereads", "read_to")
        fields = {name: data[name] for name in cls.__dataclass_fields__ if name not in derived}
        return cls(**fields, deduplicated_sources=frozenset(pos(p) for p in data["deduplicated_sources"]),
                   fallback_at=pos(data["fallback_at"]) if data.get("fallback_at") else None,
                   copy_s=data.get("copy_ms", 0) / 1000, read_wait_s=data.get("read_wait_ms", 0) / 1000,
                   send_wait_s=data.get("send_wait_ms", 0) / 1000,
                   read_back_wait_s=data.get("read_back_wait_ms", 0) / 1000,
                   throttle_wait_s=data.get("throttle_wait_ms", 0) / 1000,
                   scan=EngineScan.parse(data["scan"]) if data.get("scan") else None,
                   earlier_chunk_messages=data.get("earlier_chunk_messages", 0),
                   unassembled_chunked_messages=data.get("unassembled_chunked_messages", 0),
                   compacted_messages=data.get("compacted_messages", 0),
                   reader_rereads=data.get("reader_rereads", 0),
                   read_to=pos(data["read_to"]) if data.get("read_to") else None)


def pulsar_lib() -> Path | None:
    """The lib/ of a Pulsar distribution: PULSAR_HOME's, else the development set-up's cached one."""
    home = os.environ.get("PULSAR_HOME")
    candidates = [Path(home)] if home else []
    try:
        from localdev.pulsar_dist import pulsar_home  # the development set-up, when installed

        candidates.append(pulsar_home())
    except ImportError:
        pass
    for candidate in candidates:
        lib = candidate / "lib"
        if any(lib.glob("org.apache.pulsar-pulsar-client-original-*.jar")):
            return lib
    return None


def cache_dir() -> Path:
    return user_cache_dir() / "engine"


def unavailable_reason() -> str | None:
    """Why the engine cannot run here (None: it can)."""
    if shutil.which("java") is None or shutil.which("javac") is None:
        return "no JDK (java and javac) on PATH"
    if pulsar_lib() is None:
        return "no Pulsar distribution found (set PULSAR_HOME)"
    return None


def wanted(spec: MigrationSpec) -> bool:
    """Whether copies go through the engine: option copy_engine (auto: when it is available here)."""
    choice = spec.copy_engine
    if choice == "python":
        return False
    reason = unavailable_reason()
    if reason is None:
        return True
    if choice == "java":
        raise EngineError(f"copy_engine is java but {reason}")
    log.info("copy engine: python (%s)", reason)
    return False


# The class archive a real copy records at its exit (FullArchive): what a start without a broker cannot load.
FULL_ARCHIVE = "engine-full.jsa"
FULL_ARCHIVE_CLAIM = "engine-full.claim"
FULL_ARCHIVE_FAILED = "engine-full.failed"  # a normal exit wrote no archive here: not tried again
# A claim this old is a recorder's that was killed before its exit: the next start records instead.
STALE_CLAIM_S = 600


@dataclass(frozen=True)
class Build:
    """The compiled engine: its jar and, when one could be made, a class archive that halves its start-up."""

    jar: Path
    archive: Path | None

    @property
    def log_config(self) -> Path:
        return self.jar.parent / LOG_CONFIG_NAME

    def java_options(self) -> list[str]:
        return [f"-XX:SharedArchiveFile={self.archive}"] if self.archive else []

    def claim_full_archive(self) -> FullArchive | None:
        """The training start builds both clients but connects nowhere, so ~1,700 classes a real copy needs
        (connections, lookups, producers, consumers, the pair and content hashes) load from the jars at every
        start. The first real start after a build, alone, records them all at its exit (it starts a little slower
        and its exit takes a few seconds); later starts map that archive. None: recorded, or being recorded."""
        directory = self.jar.parent
        if (directory / FULL_ARCHIVE).exists() or (directory / FULL_ARCHIVE_FAILED).exists():
            return None
        claim = directory / FULL_ARCHIVE_CLAIM
        for _ in range(2):
            try:
                os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                return FullArchive(directory / FULL_ARCHIVE, claim,
                                   directory / f"{FULL_ARCHIVE}.{os.getpid()}.{os.urandom(4).hex()}")
            except FileExistsError:
                try:
                    if time.time() - claim.stat().st_mtime < STALE_CLAIM_S:
                        return None
                    claim.unlink()
                except OSError:
                    return None
        return None


@dataclass(frozen=True)
class FullArchive:
    """A claimed recording of the full class archive: written to `partial` at the JVM's exit, then moved."""

    final: Path
    claim: Path
    partial: Path

    def java_options(self) -> list[str]:
        # A dynamic archive is recorded on top of the JDK's base archive, so the training archive stays out.
        return [f"-XX:ArchiveClassesAtExit={self.partial}"]

    def settle(self, recorded: bool) -> None:
        """Keeps the recording when the engine exited normally after its jobs; frees the claim either way."""
        try:
            if recorded and self.partial.exists():
                self.partial.rename(self.final)
                log.info("copy engine: recorded the full class archive %s", self.final)
            elif recorded:  # e.g. a JVM that cannot dump one: every later start would pay for trying again
                (self.final.parent / FULL_ARCHIVE_FAILED).touch()
                log.info("copy engine: no full class archive was recorded; later starts use the training one")
        finally:
            self.partial.unlink(missing_ok=True)
            self.claim.unlink(missing_ok=True)


def compiled(lib: Path) -> Build:
    """The engine compiled once per build_key (a lock keeps parallel tasks from building the same thing twice):
    javac, a jar, then a training start that records the classes a start loads into a class-data archive (CDS),
    which later starts map instead of loading (about 1.7 s -> 1.0 s here)."""
    source = java_resource(SOURCE_NAME)
    target = cache_dir() / build_key(lib, source)

    def build() -> None:
        _build(lib, target, source)
        prune_unused_builds(target)

    if not build_once(target, target / "done", build):
        with contextlib.suppress(OSError):
            os.utime(target / "done")  # its last use: what prune_unused_builds goes by
    archive = next((a for a in (target / FULL_ARCHIVE, target / "engine.jsa") if a.exists()), None)
    build = Build(target / "engine.jar", archive)
    if not build.log_config.exists():  # a build made before the log configuration was kept with it
        keep_log_config(target)
    return build


def build_key(lib: Path, source: bytes) -> str:
    """What a build and its class archives depend on: the engine's source, the client version, the distribution's
    lib/ (the archive records the class path) and the JDK."""
    client_jar = sorted(lib.glob("org.apache.pulsar-pulsar-client-original-*.jar"))[-1].name
    return hashlib.sha256(b"\0".join([source, client_jar.encode(), str(lib).encode(), jdk_identity()])).hexdigest()[:16]


def jdk_identity() -> bytes:
    """The JDK that runs the engine, for the build key: a class archive is only valid for the JVM build that made
    it (another one ignores it, and every start would load ~3,000 classes from the jars again), so an upgraded JDK
    gets a build of its own. Its real path and its `release` file (JAVA_VERSION, build); no JVM is started."""
    java = shutil.which("java")
    if java is None:
        return b""
    real = Path(java).resolve()
    release = real.parent.parent / "release"
    try:
        text = release.read_bytes()
    except OSError:  # a JDK without a release file: its binary's size and time instead
        stat = real.stat()
        text = f"{stat.st_size}:{stat.st_mtime_ns}".encode()
    return str(real).encode() + b"\0" + text


# Builds of other engine sources or client versions unused this long are deleted when a new one is made: each holds
# a jar and up to ~60 MB of class archives, and every upgrade of this tool or of Pulsar makes one.
UNUSED_BUILD_DAYS = 14


def prune_unused_builds(current: Path) -> list[str]:
    """Deletes the sibling builds of `current` whose last use is older than UNUSED_BUILD_DAYS; returns their names."""
    cutoff = time.time() - UNUSED_BUILD_DAYS * 86_400
    pruned = []
    for other in current.parent.iterdir():
        done = other / "done"
        if other == current or not other.is_dir() or not done.exists():
            continue  # the current build, a lock file, or a build still being made
        with contextlib.suppress(OSError):
            if done.stat().st_mtime < cutoff:
                shutil.rmtree(other)
                (current.parent / f"{other.name}.lock").unlink(missing_ok=True)
                pruned.append(other.name)
    if pruned:
        log.info("copy engine: deleted %d build(s) unused for %d days: %s", len(pruned), UNUSED_BUILD_DAYS,
                 ", ".join(sorted(pruned)))
    return pruned


def java_resource(name: str) -> bytes:
    """A file of java/ beside this module, also when the library runs from a zip (spark-submit's --py-files)."""
    return resources.files(__package__).joinpath("java").joinpath(name).read_bytes()


def keep_log_config(directory: Path) -> None:
    """The engine's log configuration written into a build's `directory` (whole or not at all): the JVM needs a
    file, and the library may be a zip."""
    partial = directory / f".{LOG_CONFIG_NAME}.{os.getpid()}"
    partial.write_bytes(java_resource(LOG_CONFIG_NAME))
    partial.replace(directory / LOG_CONFIG_NAME)


def _build(lib: Path, target: Path, source: bytes) -> None:
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f"{target.name}-"))
    try:
        classes = staging / "classes"
        (staging / "src").mkdir()
        (staging / "src" / SOURCE_NAME).write_bytes(source)
        keep_log_config(staging)
        answer = subprocess.run(["javac", "-nowarn", "-cp", f"{lib}/*", "-d", str(classes),
                                 str(staging / "src" / SOURCE_NAME)], capture_output=True, text=True)
        if answer.returncode != 0:
            first = next((line for line in answer.stderr.splitlines() if "error" in line), answer.stderr.strip())
            raise EngineError(f"compiling the copy engine failed: {first}")
        jar = shutil.which("jar") or "jar"
        subprocess.run([jar, "cf", str(staging / "engine.jar"), "-C", str(classes), "."], check=True,
                       capture_output=True)
        shutil.rmtree(classes)
        shutil.rmtree(staging / "src")
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    # The archive records the class path it was made with and is ignored under any other: it is made from the jar
    # where it stays (made in the staging directory, it named a jar that no longer existed and was never used).
    # The training start builds both clients (no connection is made), gets no job line and ends normally so the
    # archive is written; without an archive the engine only starts slower.
    training = {"source_name": "a", "target_name": "b", "max_in_flight": 1,
                "source": {"service_url": "pulsar://127.0.0.1:1", "admin_url": "http://127.0.0.1:1"},
                "target": {"service_url": "pulsar://127.0.0.1:1", "admin_url": "http://127.0.0.1:1"}}
    subprocess.run(["java", *JVM_OPTIONS, f"-XX:ArchiveClassesAtExit={target / 'engine.jsa'}",
                    f"-Dlog4j2.configurationFile={target / LOG_CONFIG_NAME}", "-cp",
                    _classpath(target / "engine.jar", lib),
                    ENGINE_CLASS], input=json.dumps(training), capture_output=True, text=True,
                   env={**os.environ, "PM_ENGINE_EXIT_NORMALLY": "1"}, timeout=120)
    (target / "done").touch()


def _classpath(jar: Path, lib: Path) -> str:
    # Jars only, in a fixed order: a class archive is valid only for the class path it was made with.
    return ":".join([str(jar), *sorted(str(j) for j in lib.glob("*.jar"))])


def spawn_tied(command: list[str], **popen: Any) -> subprocess.Popen[Any]:
    """Starts `command` so that it is SIGKILLed when the thread that started it ends (PR_SET_PDEATHSIG: a Spark
    task or driver killed without a word leaves no engine behind); `popen` goes to subprocess.Popen. util-linux's
    setpriv sets it, then a shell execs the command only if this process is still its parent (one that died before
    the signal was set would never send it). Not a `preexec_fn`: that runs Python in the forked child, whose start
    there clears the other threads' state, and py4j's finalizers of their thread-local connections to the Spark
    JVM shut down the sockets the parent still uses (a driver logged "Exception while sending command" after each
    engine start, and py4j opened the connection again)."""
    setpriv = shutil.which("setpriv")
    if setpriv:
        still_ours = '[ "$PPID" = "$0" ] && exec "$@"'
        return subprocess.Popen([setpriv, "--pdeathsig", "KILL", "--", "/bin/sh", "-c", still_ours, str(os.getpid()),
                                 *command], **popen)
    return subprocess.Popen(command, preexec_fn=_die_with_parent, **popen)  # no setpriv on this machine


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass(frozen=True)
class EngineJob:
    """One partition for the engine: (after, upper] of `topic` is read and hashed; entries <= resume_after are
    already on the target (hashed, not sent). With `rows_file`, the target is read back after the copy from after
    `scan_after` (the map's last target entry) and the map rows are written there (EngineScan). `keep_identity`
    (the cutover's final delta): every entry goes under its source producer's name with its source sequence ids."""

    topic: str
    base_topic: str
    after: Position | None
    resume_after: Position | None
    upper: Position
    scan_after: Position | None = None
    rows_file: str | None = None
    receiver_queue: int = RECEIVER_QUEUE
    keep_identity: bool = False
    # Chunked messages a stopped run left incomplete on the target: source position -> producer name suffix
    # (partition.IncompleteMessage.resend_suffix).
    resend_suffixes: dict[Position, str] = field(default_factory=dict)
    # The source's first stored entry, when a compaction kept messages from before it (partition.compacted_gap).
    compacted_before: Position | None = None
    # The source partition's (ledger, entry count) when the run started (reading.EntryGaps): the engine reads again
    # where its reader is moved past more stored entries than `gap_tolerance`. None: nothing watched.
    ledgers: list[tuple[int, int]] | None = None
    gap_tolerance: int = 0


class EngineProcess:
    """A started engine process. Its JVM starts and builds both clients while the caller still prepares the jobs
    (each partition's resume point is read from the target meanwhile); `run` hands them over and collects the
    results. `run_round` does the same and keeps the process for more rounds (the cutover's catch-up rounds and
    final delta in one warm JVM) until `close`. Secrets reach it through its environment, never its arguments."""

    def __init__(self, spec: MigrationSpec, max_in_flight: int, threads: int = 16,
                 caps: Caps | None = None, may_record: bool = True) -> None:
        lib = pulsar_lib()
        if lib is None:
            raise EngineError("copy engine: no Pulsar distribution found (set PULSAR_HOME)")
        build = compiled(lib)
        source, target = spec.source_cluster, spec.target_cluster
        settings = {"source_name": source.name, "target_name": target.name, "source": source.to_dict(),
                    "target": target.to_dict(), "max_in_flight": max_in_flight, "receiver_queue": RECEIVER_QUEUE,
                    "threads": threads, "progress_s": spec.progress_interval_s}
        if caps:  # this process's part of the run's caps (Caps.share), over all its partitions
            settings["max_bytes_per_s"] = caps.bytes_per_s or 0
            settings["max_msgs_per_s"] = caps.msgs_per_s or 0
        env = dict(os.environ)
        for name, cluster in (("PM_SOURCE_TOKEN", source), ("PM_TARGET_TOKEN", target)):
            env.pop(name, None)
            env.pop(f"{name}_FILE", None)
            env.pop(f"{name}_OAUTH2", None)
            token = cluster.token()  # also checks a token file is there and holds one, or the issuer answers
            if cluster.oauth2:  # the engine's client runs the flow itself (settings and a path: no secret)
                env[f"{name}_OAUTH2"] = json.dumps(cluster.oauth2.to_dict())
            elif token and cluster.token_file:
                env[f"{name}_FILE"] = cluster.token_file  # read by the engine at each use, as here
            elif token:
                env[name] = token
        extra = os.environ.get("PM_ENGINE_JAVA_OPTIONS", "").split()  # e.g. a larger heap, a flight recording
        # A start known to get no partitions (`may_record` false) would record an archive only to drop it at exit.
        self._recording = None if extra or not may_record else build.claim_full_archive()
        archive = self._recording.java_options() if self._recording else build.java_options()
        if self._recording:
            env["PM_ENGINE_EXIT_NORMALLY"] = "1"  # the archive is written by a normal exit, not a halt
        command = ["java", *JVM_OPTIONS, *archive, *extra, f"-Dlog4j2.configurationFile={build.log_config}",
                   "-cp", _classpath(build.jar, lib), ENGINE_CLASS]
        self._process = spawn_tied(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, env=env)
        # Its log goes to stderr: read all along (a full pipe would stop it), the last lines kept for errors.
        self._stderr: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self._stderr_reader = threading.Thread(target=self._read_stderr, daemon=True, name="engine-stderr")
        self._stderr_reader.start()
        self._used = False  # a round was asked for
        self._had_jobs = False  # a round had partitions: only such a run may record the full class archive
        self._closed = False
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(settings) + "\n")
        self._process.stdin.flush()

    def _read_stderr(self) -> None:
        assert self._process.stderr is not None
        for line in self._process.stderr:
            self._stderr.append(line.rstrip("\n"))

    def alive(self) -> bool:
        return not self._closed and self._process.poll() is None

    def run(self, jobs: list[EngineJob]) -> tuple[dict[str, EngineResult | str], dict[str, Any]]:
        """Each topic's result or its one-line error, and the process's start-up times; the process ends after
        them. EngineError when the engine could not start at all."""
        try:
            return self.run_round(jobs)
        finally:
            self.close()

    def run_round(self, jobs: list[EngineJob]) -> tuple[dict[str, EngineResult | str], dict[str, Any]]:
        """One round of `jobs` in this process, which stays for the next round (see run)."""
        self._used = True
        self._had_jobs = self._had_jobs or bool(jobs)
        line = json.dumps([{"topic": j.topic, "base_topic": j.base_topic, "after": _pair(j.after),
                            "resume_after": _pair(j.resume_after), "upper": _pair(j.upper),
                            "compacted_before": _pair(j.compacted_before),
                            "ledgers": [list(pair) for pair in j.ledgers] if j.ledgers is not None else None,
                            "gap_tolerance": j.gap_tolerance,
                            "scan": j.rows_file is not None, "scan_after": _pair(j.scan_after),
                            "rows_file": j.rows_file, "receiver_queue": j.receiver_queue,
                            "keep_identity": j.keep_identity,
                            "resend_suffixes": {str(p): suffix for p, suffix in j.resend_suffixes.items()}}
                           for j in jobs])
        results: dict[str, EngineResult | str] = {}
        timings: dict[str, Any] = {}
        assert self._process.stdin is not None and self._process.stdout is not None
        try:
            self._process.stdin.write(line + "\n")
            self._process.stdin.flush()
        except (BrokenPipeError, ValueError):  # it died before reading the jobs: its output says why
            pass
        progress = ProgressLog(len(jobs))
        for out in self._process.stdout:
            if out.startswith("PM-PROGRESS "):
                progress.log(json.loads(out[len("PM-PROGRESS "):]))
            elif out.startswith("PM-RESULT "):
                data = json.loads(out[len("PM-RESULT "):])
                results[data["topic"]] = data["error"] if "error" in data else EngineResult.parse(data)
            elif out.startswith("PM-DONE "):
                timings = json.loads(out[len("PM-DONE "):])
                break
            elif out.startswith("PM-ERROR "):
                self.close()
                raise EngineError(out[len("PM-ERROR "):].strip())
        if not timings:  # killed or crashed: what finished stands, the rest fails with the process's last words
            self.close()
            tail = (list(self._stderr) or ["no output"])[-1]
            for job in jobs:
                results.setdefault(job.topic, f"copy engine exited with {self._process.returncode}: {tail}")
        return results, timings

    def close(self) -> None:
        """Ends the process after its last round (its input ends; killed if it does not exit in time)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(BrokenPipeError, ValueError, OSError):
            assert self._process.stdin is not None
            self._process.stdin.close()
        try:
            self._process.wait(timeout=CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._stderr_reader.join(timeout=5)
        if self._recording:
            self._recording.settle(self._had_jobs and self._process.returncode == 0)

    def abandon(self) -> None:
        """Stops a process that got no jobs (killed); one that did is closed (see close)."""
        if not self._used and not self._closed:
            self._process.kill()
        self.close()


class ProgressLog:
    """Logs an engine round's progress lines (PM-PROGRESS), with the rate since the line before."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self._bytes = 0
        self._ms = 0

    def log(self, line: dict[str, Any]) -> str:
        copied, ms = int(line["copied_bytes"]), int(line["elapsed_ms"])
        rate = (copied - self._bytes) / 1e3 / (ms - self._ms) if ms > self._ms else 0.0
        self._bytes, self._ms = copied, ms
        text = (f"copy engine progress after {ms / 1000:.0f}s: {line['ended']} of {self.partitions} partition(s) "
                f"done, {line['started'] - line['ended']} copying; {line['copied_messages']:,} message(s) in "
                f"{line['copied_entries']:,} entries, {copied / 1e6:,.1f} MB copied, {rate:.1f} MB/s lately")
        log.info("%s", text)
        return text


def copy_many(spec: MigrationSpec, jobs: list[EngineJob], max_in_flight: int,
              threads: int = 16) -> tuple[dict[str, EngineResult | str], dict[str, Any]]:
    """Runs `jobs` in one engine process (one pair of clients, `threads` partitions at a time): see
    EngineProcess.run."""
    return EngineProcess(spec, max_in_flight, threads, may_record=bool(jobs)).run(jobs)


def _pair(position: Position | None) -> list[int] | None:
    return [position.ledger, position.entry] if position is not None else None
