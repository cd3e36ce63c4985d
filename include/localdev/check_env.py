"""Proves the Python environment works: matching pyspark with its jars, pandas < 3, the library.

Run by scripts/setup_venv.sh after every install; exits non-zero with one line naming the problem.
"""

from __future__ import annotations

import importlib.metadata as md
import shutil
import sys
from pathlib import Path


def problems() -> list[str]:
    found: list[str] = []
    import pyspark

    installed = md.version("pyspark")
    if pyspark.__version__ != installed:
        found.append(
            f"pyspark files are version {pyspark.__version__} but the pyspark distribution is {installed} "
            "(pyspark-client overwrote them)"
        )
    jars = Path(pyspark.__file__).parent / "jars"
    if not any(jars.glob("spark-core_*.jar")):
        found.append(f"pyspark has no Spark jars in {jars}")
    pandas_major = int(md.version("pandas").split(".")[0])
    if pandas_major >= 3:
        found.append(f"pandas {md.version('pandas')} breaks pyspark.pandas; pin pandas<3")
    try:
        import pyspark.core.context
        import pyspark.pandas
        import pyspark.sql
    except Exception as exc:  # any import failure means a broken install
        found.append(f"pyspark does not import: {exc}")
    if shutil.which("spark-submit", path=str(Path(sys.executable).parent)) is None:
        found.append("spark-submit is not in the venv's bin/")
    if shutil.which("java") is None:
        found.append("java is not on PATH (Spark and Pulsar need Java 17)")
    for module in ("pulsar", "airflow", "pulsar_migration", "localdev"):
        try:
            __import__(module)
        except Exception as exc:
            found.append(f"{module} does not import: {exc}")
    return found


def main() -> int:
    found = problems()
    for line in found:
        sys.stderr.write(f"check_env: {line}\n")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
