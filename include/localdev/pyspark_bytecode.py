"""Adds compiled bytecode to the venv's `pyspark.zip` and py4j zip (see pulsar_migration.bytecode).

spark-submit puts these zips first on every Python process's path, so their modules are compiled from
source on each start; with `.pyc` entries a bare spark-submit takes about 1.5 s less here. Run by
scripts/setup_venv.sh; a second run finds the bytecode and changes nothing.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import zipfile
from pathlib import Path

from pulsar_migration.bytecode import has_bytecode, write_module

log = logging.getLogger(__name__)


def spark_python_zips() -> list[Path]:
    import pyspark

    return sorted((Path(pyspark.__file__).parent / "python" / "lib").glob("*.zip"))


def add_bytecode(path: Path) -> bool:
    """Rewrites `path` with a `.pyc` beside each `.py`; False when it already has bytecode."""
    if has_bytecode(str(path)):
        return False
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as raw, zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as out, \
                zipfile.ZipFile(path) as src:
            for info in src.infolist():
                data = src.read(info)
                if info.filename.endswith(".py"):
                    write_module(out, info.filename, data, info)
                else:
                    out.writestr(info, data)
        os.replace(tmp, path)  # a concurrent spark-submit sees the old zip or the new one, never half
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="setup: %(message)s", stream=sys.stderr)
    for path in spark_python_zips():
        if add_bytecode(path):
            log.info("compiled bytecode added to %s", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
