"""Fetches the pinned Apache Pulsar server distribution from Maven Central and caches it.

The tarball is resolved by `mvn dependency:copy` (Maven checks the repository's SHA-1), then checked
against the SHA-512 pinned below, and unpacked into the user cache. A second call finds the unpacked
tree and downloads nothing.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from localdev.paths import cache_dir

log = logging.getLogger(__name__)

# 4.0.x is the LTS line; 4.0.8 is the newest 4.0 release this machine's Maven Central carries.
PULSAR_VERSION = "4.0.8"
PULSAR_ARTIFACT = f"org.apache.pulsar:pulsar-server-distribution:{PULSAR_VERSION}:tar.gz:bin"
PULSAR_SHA512 = (
    "65b769b10696cdfebf7fc5bcdc95dd663702e27051e616c1a13cb100e91279525be35352171befe7b0011176330aab29"
    "bd0a6c8a0f2f0646641af46d2e33cbd6"
)


class DistributionError(RuntimeError):
    """The distribution could not be fetched or failed verification."""


def pulsar_home() -> Path:
    return cache_dir() / f"apache-pulsar-{PULSAR_VERSION}"


def _sha512(path: Path) -> str:
    digest = hashlib.sha512()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _is_complete(home: Path) -> bool:
    return (home / "bin" / "pulsar").is_file() and any((home / "lib").glob("org.apache.pulsar-pulsar-broker-*.jar"))


def _extract(tarball: Path, dest: Path) -> None:
    """Unpacks `tarball` into `dest`, refusing members that would land outside it."""
    with tarfile.open(tarball) as tar:
        if hasattr(tarfile, "tar_filter"):  # Python >= 3.11.4 checks members itself
            tar.extractall(dest, filter="tar")
            return
        root = dest.resolve()
        for member in tar.getmembers():  # older 3.11 (e.g. Debian's 3.11.2): check by hand
            target = (dest / member.name).resolve()
            if not target.is_relative_to(root) or member.isdev():
                raise DistributionError(f"{tarball.name} holds an unsafe member {member.name!r}")
        tar.extractall(dest)  # every member checked above


def ensure_distribution() -> Path:
    """Returns PULSAR_HOME, fetching and unpacking the distribution first if the cache lacks it."""
    home = pulsar_home()
    if _is_complete(home):
        log.info("Pulsar %s already cached at %s", PULSAR_VERSION, home)
        return home
    if shutil.which("mvn") is None:
        raise DistributionError("mvn is not on PATH: it is needed to fetch Pulsar from Maven Central")
    cache_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir(), prefix=".fetch-") as tmp:
        tmp_path = Path(tmp)
        log.info("Fetching %s from Maven Central", PULSAR_ARTIFACT)
        proc = subprocess.run(
            ["mvn", "-B", "-q", "dependency:copy", f"-Dartifact={PULSAR_ARTIFACT}",
             f"-DoutputDirectory={tmp_path}"],
            cwd=tmp_path, capture_output=True, text=True, check=False,
        )
        tarballs = list(tmp_path.glob("*.tar.gz"))
        if proc.returncode != 0 or len(tarballs) != 1:
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
            raise DistributionError(f"mvn could not fetch {PULSAR_ARTIFACT}: {' | '.join(tail)}")
        actual = _sha512(tarballs[0])
        if actual != PULSAR_SHA512:
            raise DistributionError(
                f"{tarballs[0].name} has SHA-512 {actual[:16]}..., expected {PULSAR_SHA512[:16]}..."
            )
        unpack = tmp_path / "unpack"
        _extract(tarballs[0], unpack)
        extracted = unpack / f"apache-pulsar-{PULSAR_VERSION}"
        if not _is_complete(extracted):
            raise DistributionError(f"{tarballs[0].name} does not contain apache-pulsar-{PULSAR_VERSION}/bin/pulsar")
        if home.exists():
            shutil.rmtree(home)
        extracted.rename(home)  # same filesystem: atomic, so a killed fetch never leaves half a tree
    log.info("Pulsar %s verified and cached at %s", PULSAR_VERSION, home)
    return home
