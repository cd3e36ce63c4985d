"""The small Java programs under localdev/java/, run with the Pulsar distribution's lib/ on the class path.

Java's source launcher (`java X.java`) compiles the program on every run: 2.5-4 s of CPU each time on the 2-core
machine, and the tests run these programs dozens of times. They are compiled once per source, distribution and
JDK into the user cache instead (`build_once`: parallel test workers compile each one once).
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

from pulsar_migration.cachedir import build_once

from localdev.paths import cache_dir

SOURCES = Path(__file__).resolve().parent / "java"
SHARED = SOURCES / "pm" / "Commands.java"  # compiled beside every program: several commands in one JVM
# Short-lived programs: the C1 JIT and the serial collector run them on about a quarter less CPU (a client
# sending 200 messages, two runs each: 5.1 and 3.1 s of CPU against 5.5 and 5.4 s with the JDK's defaults).
JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


@functools.cache
def java_version() -> str:
    """`java -version` of the JDK on PATH (once per process): what compiled classes and class archives depend on."""
    return subprocess.run(["java", "-version"], capture_output=True, text=True, check=True).stderr


def command(name: str, home: Path, package: str = "") -> list[str]:
    """`java -cp <classes>:<home>/lib/* <name>`: the program `localdev/java/<name>.java`, compiled once (`package`:
    the one it declares, e.g. the client's own to reach its internals)."""
    qualified = f"{package}.{name}" if package else name
    return ["java", *JVM_OPTIONS, "-cp", f"{compiled(name, home, package)}{os.pathsep}{home / 'lib' / '*'}",
            qualified]


def compiled(name: str, home: Path, package: str = "") -> Path:
    """The classes directory of `localdev/java/<name>.java` (with the shared sources), compiled once per source,
    distribution and JDK into the user cache."""
    source = SOURCES / f"{name}.java"
    qualified = f"{package}.{name}" if package else name
    key = hashlib.sha256(source.read_bytes() + SHARED.read_bytes() + str(home.resolve()).encode()
                         + java_version().encode()).hexdigest()[:16]
    classes = cache_dir() / "java-programs" / f"{name}-{key}"

    def build() -> None:
        staging = classes.parent / f".{name}-{key}.{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        subprocess.run(["javac", "-nowarn", "-cp", str(home / "lib" / "*"), "-d", str(staging), str(source),
                        str(SHARED)], check=True, capture_output=True, text=True, timeout=300)
        os.replace(staging, classes)

    build_once(classes, classes.joinpath(*qualified.split(".")).with_suffix(".class"), build)
    return classes


def run_commands(name: str, home: Path, commands: list[list[str]], package: str = "",
                 timeout_s: float = 300.0) -> subprocess.CompletedProcess[str]:
    """Program `name` run once for all `commands` (separated by ";" arguments, pm.Commands): one JVM start."""
    args = [arg for cmd in commands for arg in (*cmd, ";")][:-1]
    return subprocess.run([*command(name, home, package), *args], capture_output=True, text=True, timeout=timeout_s)


def read_blocks(stdout: str) -> list[list[str]]:
    """The "MSG " lines (prefix cut) of each read in a program's output, one list per "END" line that closes one
    (the Java client logs to stdout too)."""
    blocks: list[list[str]] = []
    lines: list[str] = []
    for line in stdout.splitlines():
        if line.startswith("MSG "):
            lines.append(line[4:])
        elif line.startswith("END "):
            blocks.append(lines)
            lines = []
    return blocks


def entry_filter_nar(directory: Path, name: str, source: str, filter_class: str, home: Path) -> Path:
    """A broker entry filter plugin (a NAR: the compiled classes of `localdev/java/<source>.java` and the
    `entry_filter.yml` naming `filter_class` as the filter `name`) written into `directory`, a broker's
    `entryFiltersDirectory`."""
    classes = compiled(source, home)
    definition = f"name: {name}\ndescription: test filter {filter_class}\nentryFilterClass: {filter_class}\n"
    directory.mkdir(parents=True, exist_ok=True)
    nar = directory / f"{name}.nar"
    with zipfile.ZipFile(nar, "w") as archive:
        archive.writestr("META-INF/services/entry_filter.yml", definition)
        archive.writestr("META-INF/bundled-dependencies/", "")
        for path in sorted(classes.rglob("*.class")):
            archive.write(path, path.relative_to(classes).as_posix())
    return nar
