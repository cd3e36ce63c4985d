"""Run-dir I/O: small text files (reports, specs) under RUN_DIR, wherever Spark can write.

Local paths and `file:` URIs use plain Python (writes are atomic: temp file, then rename). Any other
scheme (`s3a://`, `hdfs://`, ...) goes through the Hadoop FileSystem of a SparkSession, so the same
run dir works on a laptop and on a cluster without extra client libraries.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import uuid
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

# Object stores publish an object only when its upload completes, so a direct write is already atomic
# (and a rename would be a slow copy).
_OBJECT_STORE_SCHEMES = frozenset({"s3", "s3a", "s3n", "gs", "abfs", "abfss", "wasb", "wasbs", "oss", "cos"})


def is_local(uri: str) -> bool:
    """True for plain paths and `file:` URIs (read and written without Spark)."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return parsed.netloc in ("", "localhost")
    # A one-letter "scheme" is a Windows drive letter, not a URI.
    return parsed.scheme == "" or len(parsed.scheme) == 1


def local_path(uri: str) -> str:
    """The filesystem path of a local run-dir location (`file:///x`, `file:/x` and `/x` -> `/x`)."""
    if not is_local(uri):
        raise ValueError(f"{uri} is not a local path")
    return urlparse(uri).path if uri.startswith("file:") else uri


def join(run_dir: str, name: str) -> str:
    """`run_dir/name`, keeping the run dir's form (path or URI). `name` is relative and stays inside."""
    if not name or name.startswith("/") or ".." in name.split("/"):
        raise ValueError(f"run-dir entry name must be a relative path inside the run dir, got {name!r}")
    return run_dir + name if run_dir.endswith("/") else f"{run_dir}/{name}"


def write_text(run_dir: str, name: str, text: str, spark: SparkSession | None = None) -> str:
    """Writes `text` (UTF-8) to `run_dir/name`, replacing any previous content; returns the location."""
    uri = join(run_dir, name)
    if is_local(uri):
        _write_local(local_path(uri), text)
    else:
        _Hadoop(_session(spark, uri)).write_text(uri, text)
    log.debug("wrote %s (%d chars)", uri, len(text))
    return uri


def read_text(run_dir: str, name: str, spark: SparkSession | None = None) -> str:
    """The UTF-8 text of `run_dir/name` (FileNotFoundError when it does not exist)."""
    return read_uri(join(run_dir, name), spark)


def read_uri(uri: str, spark: SparkSession | None = None) -> str:
    """The UTF-8 text of one file given by path or URI (FileNotFoundError when it does not exist)."""
    if is_local(uri):
        with open(local_path(uri), encoding="utf-8") as fh:
            return fh.read()
    return _Hadoop(_session(spark, uri)).read_text(uri)


def exists(run_dir: str, name: str, spark: SparkSession | None = None) -> bool:
    uri = join(run_dir, name)
    if is_local(uri):
        return os.path.exists(local_path(uri))
    return _Hadoop(_session(spark, uri)).exists(uri)


def remove(run_dir: str, name: str, spark: SparkSession | None = None) -> None:
    """Deletes the file `name` in the run dir if it is there."""
    uri = join(run_dir, name)
    if is_local(uri):
        with contextlib.suppress(FileNotFoundError):
            os.remove(local_path(uri))
    else:
        _Hadoop(_session(spark, uri)).delete(uri)


def ensure_dir(run_dir: str, spark: SparkSession | None = None) -> None:
    """Creates the run dir (and parents) if missing."""
    if is_local(run_dir):
        os.makedirs(local_path(run_dir), exist_ok=True)
    else:
        _Hadoop(_session(spark, run_dir)).mkdirs(run_dir)


def _write_local(path: str, text: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    # Same directory as the target so os.replace is a rename on one filesystem: readers see the old
    # file or the new one, never a partial write.
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _session(spark: SparkSession | None, uri: str) -> SparkSession:
    if spark is not None:
        return spark
    from pyspark.sql import SparkSession  # deferred: local I/O must not pay for importing Spark

    active = SparkSession.getActiveSession()
    if active is None:
        raise ValueError(f"{uri}: a non-local run dir needs an active SparkSession")
    return active


class _Hadoop:
    """Text-file I/O through the JVM's Hadoop FileSystem (py4j)."""

    def __init__(self, spark: SparkSession) -> None:
        self._jvm: Any = spark._jvm  # type: ignore[attr-defined]
        self._conf: Any = spark._jsc.hadoopConfiguration()  # type: ignore[attr-defined]

    def _path_fs(self, uri: str) -> tuple[Any, Any]:
        path = self._jvm.org.apache.hadoop.fs.Path(uri)
        return path, path.getFileSystem(self._conf)

    def write_text(self, uri: str, text: str) -> None:
        path, fs = self._path_fs(uri)
        if urlparse(uri).scheme in _OBJECT_STORE_SCHEMES:
            self._write(fs, path, text)
            return
        tmp = self._jvm.org.apache.hadoop.fs.Path(f"{uri}.{uuid.uuid4().hex}.tmp")
        self._write(fs, tmp, text)
        # HDFS rename does not replace an existing target.
        if fs.exists(path):
            fs.delete(path, False)
        if not fs.rename(tmp, path):
            fs.delete(tmp, False)
            raise OSError(f"could not rename {tmp.toString()} to {uri}")

    def _write(self, fs: Any, path: Any, text: str) -> None:
        out = fs.create(path, True)
        try:
            out.write(bytearray(text.encode("utf-8")))
        finally:
            out.close()

    def read_text(self, uri: str) -> str:
        path, fs = self._path_fs(uri)
        if not fs.exists(path):
            raise FileNotFoundError(uri)
        buffer = self._jvm.java.io.ByteArrayOutputStream()
        # copyBytes(in, out, bufferSize, close=True) closes both streams.
        self._jvm.org.apache.hadoop.io.IOUtils.copyBytes(fs.open(path), buffer, 65536, True)
        return bytes(buffer.toByteArray()).decode("utf-8")

    def exists(self, uri: str) -> bool:
        path, fs = self._path_fs(uri)
        return bool(fs.exists(path))

    def delete(self, uri: str) -> None:
        path, fs = self._path_fs(uri)
        fs.delete(path, False)

    def mkdirs(self, uri: str) -> None:
        path, fs = self._path_fs(uri)
        fs.mkdirs(path)
