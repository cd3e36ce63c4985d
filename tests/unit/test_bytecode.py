"""Zips carry checked bytecode that zipimport really uses, and never stale bytecode."""

from __future__ import annotations

import marshal
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from pulsar_migration.bytecode import has_bytecode, pyc_bytes, write_module
from pulsar_migration.dag_support import library_zip


def _import_from(zip_path: Path, module: str) -> str:
    code = f"import sys; sys.path.insert(0, {str(zip_path)!r}); import {module}; print({module}.VALUE)"
    proc = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True)
    return proc.stdout.strip()


def test_zipimport_uses_the_bytecode_while_it_matches_the_source(tmp_path: Path) -> None:
    source = b"VALUE = 'from source'\n"
    with zipfile.ZipFile(tmp_path / "written.zip", "w") as zf:
        write_module(zf, "mod_a.py", source)
    assert has_bytecode(str(tmp_path / "written.zip"))
    assert _import_from(tmp_path / "written.zip", "mod_a") == "from source"
    # A .pyc whose header matches the source but whose code says otherwise shows which one zipimport ran.
    header = pyc_bytes(source, "mod_a.py")[:16]
    marked = header + marshal.dumps(compile("VALUE = 'from bytecode'", "mod_a.py", "exec"))
    with zipfile.ZipFile(tmp_path / "marked.zip", "w") as zf:
        zf.writestr("mod_a.py", source)
        zf.writestr("mod_a.pyc", marked)
    assert _import_from(tmp_path / "marked.zip", "mod_a") == "from bytecode"
    # The same .pyc beside an edited source: the hash check rejects it and the source wins.
    with zipfile.ZipFile(tmp_path / "edited.zip", "w") as zf:
        zf.writestr("mod_a.py", b"VALUE = 'edited'\n")
        zf.writestr("mod_a.pyc", marked)
    assert _import_from(tmp_path / "edited.zip", "mod_a") == "edited"


def test_the_library_zip_has_bytecode_for_every_module(tmp_path: Path) -> None:
    path = library_zip(tmp_path)
    with zipfile.ZipFile(path) as zf:
        names = set(zf.namelist())
    sources = {n for n in names if n.endswith(".py")}
    assert sources and {n[:-3] + ".pyc" for n in sources} <= names
    assert library_zip(tmp_path) == path  # same sources, same zip


def test_the_copy_engine_builds_from_the_library_zip(tmp_path: Path) -> None:
    """Under spark-submit the library is the zip: the engine's Java source and log configuration are read from
    it (before 2026-11-26 the zip held neither, and every copy there took the Python path). Built from the zip,
    the engine is the same build as from the source tree (same source, same key)."""
    from pulsar_migration.replication import engine

    if engine.unavailable_reason() is not None:
        pytest.skip(engine.unavailable_reason())
    path = library_zip(tmp_path)
    with zipfile.ZipFile(path) as zf:
        assert {"pulsar_migration/replication/java/EntryCopy.java",
                "pulsar_migration/replication/java/log4j2-engine.xml"} <= set(zf.namelist())
    probe = ("import pulsar_migration.replication.engine as e; assert '.zip' in e.__file__, e.__file__; "
             "b = e.compiled(e.pulsar_lib()); assert b.jar.is_file() and b.log_config.is_file(); print(b.jar)")
    done = subprocess.run([sys.executable, "-c", probe], env={**os.environ, "PYTHONPATH": path},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lib = engine.pulsar_lib()
    assert lib is not None and engine.compiled(lib).jar == Path(done.stdout.strip().splitlines()[-1])


def test_adding_bytecode_to_a_spark_zip_keeps_everything_else_and_runs_once(tmp_path: Path) -> None:
    from localdev.pyspark_bytecode import add_bytecode, spark_python_zips

    path = tmp_path / "pyspark.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("pkg/__init__.py", b"VALUE = 'package'\n")
        zf.writestr("pkg/data.json", b"{}")
    assert add_bytecode(path) is True
    with zipfile.ZipFile(path) as zf:
        assert set(zf.namelist()) == {"pkg/__init__.py", "pkg/__init__.pyc", "pkg/data.json"}
        assert zf.read("pkg/data.json") == b"{}"
    assert _import_from(path, "pkg") == "package"
    assert add_bytecode(path) is False
    # The venv's own zips got theirs when scripts/setup_venv.sh ran.
    assert spark_python_zips() and all(has_bytecode(str(z)) for z in spark_python_zips())
