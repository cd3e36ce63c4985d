"""localdev.spark_cds's bookkeeping with a stand-in spark-submit: recorded once, made again when what it was made
for changes, a failed recording not retried on every set-up. (The real archive is judged by
tests/integration/test_spark_driver_setup.py.)"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from localdev import spark_cds

# Writes the archive where spark-env.sh would have the JVM write it, and counts its runs.
FAKE_SUBMIT = """#!/bin/sh
echo run >> "$(dirname "$0")/../runs"
[ "$PM_FAKE_FAIL" = 1 ] && { echo "no archive for you" >&2; exit 3; }
echo archive > "$PM_SPARK_CDS_RECORD"
"""


def fake_home(tmp_path: Path) -> Path:
    home = tmp_path / "spark"
    (home / "bin").mkdir(parents=True)
    (home / "jars").mkdir()
    (home / "jars" / "a.jar").write_bytes(b"a")
    submit = home / "bin" / "spark-submit"
    submit.write_text(FAKE_SUBMIT)
    submit.chmod(submit.stat().st_mode | stat.S_IXUSR)
    return home


def runs(home: Path) -> int:
    path = home / "runs"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_recorded_once_and_again_when_the_jars_change(tmp_path: Path) -> None:
    home, conf = fake_home(tmp_path), tmp_path / "conf"
    assert spark_cds.ensure(home, conf) is True
    assert (home / spark_cds.ARCHIVE).read_text() == "archive\n" and runs(home) == 1
    assert spark_cds.ensure(home, conf) is False and runs(home) == 1
    (home / "jars" / "b.jar").write_bytes(b"b")  # another Spark
    assert spark_cds.ensure(home, conf) is True and runs(home) == 2
    assert spark_cds.ensure(home, tmp_path / "other-conf") is True and runs(home) == 3
    assert not list(home.glob("*.partial"))


def test_a_failed_recording_leaves_no_archive_and_is_not_retried(tmp_path: Path, monkeypatch) -> None:
    home, conf = fake_home(tmp_path), tmp_path / "conf"
    (home / spark_cds.ARCHIVE).write_text("stale")
    monkeypatch.setenv("PM_FAKE_FAIL", "1")
    assert spark_cds.ensure(home, conf) is False
    assert not (home / spark_cds.ARCHIVE).exists() and runs(home) == 1  # the stale one is not mapped either
    assert spark_cds.ensure(home, conf) is False and runs(home) == 1
    monkeypatch.delenv("PM_FAKE_FAIL")
    os.utime(home / "jars")
    (home / "jars" / "a.jar").write_bytes(b"aa")  # a change tries again
    assert spark_cds.ensure(home, conf) is True and runs(home) == 2
