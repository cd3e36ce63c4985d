"""Compiled bytecode for modules imported from zip files.

Python's zipimport never writes `.pyc` files, so every import from a zip without them compiles the source
again: each spark-submit's driver and Python workers recompiled pyspark (from `pyspark.zip`) and this
library (from its `--py-files` zip), about 1.5 s of a bare spark-submit's 9 s on the 2-core machine.
Hash-checked `.pyc` entries next to each `.py` (the layout zipimport looks for) are used only while they
match their source, and an interpreter of another version ignores them (the magic number differs) and
compiles as before.
"""

from __future__ import annotations

import importlib.util
import marshal
import zipfile

# PEP 552 flags: hash-based, and checked against the source on every import.
CHECKED_HASH_FLAGS = (0b11).to_bytes(4, "little")


def pyc_bytes(source: bytes, filename: str) -> bytes:
    """The `.pyc` content for `source`, as `py_compile` writes it in checked-hash mode."""
    code = compile(source, filename, "exec", dont_inherit=True)
    return (importlib.util.MAGIC_NUMBER + CHECKED_HASH_FLAGS + importlib.util.source_hash(source)
            + marshal.dumps(code))


def write_module(zf: zipfile.ZipFile, arcname: str, source: bytes, info: zipfile.ZipInfo | None = None) -> None:
    """Writes `arcname` (a `.py`) and, when it compiles, its `.pyc` beside it."""
    zf.writestr(info or arcname, source)
    try:
        compiled = pyc_bytes(source, arcname)
    except SyntaxError:  # left to fail (or not) where it is imported, as without bytecode
        return
    zf.writestr(arcname[:-3] + ".pyc", compiled)


def has_bytecode(path: str) -> bool:
    with zipfile.ZipFile(path) as zf:
        return any(name.endswith(".pyc") for name in zf.namelist())
