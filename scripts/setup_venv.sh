#!/usr/bin/env bash
# Creates .venv with the pinned requirements (every transitive version fixed by requirements.lock) and
# the project installed editable, then proves the install works (pyspark-client can overwrite pyspark's
# Python files; pandas 3 breaks pyspark.pandas). A second run with unchanged requirements only re-checks.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON_BIN=${PYTHON_BIN:-$(command -v python3.11 || command -v python3 || true)}
# The UI's browser test drives Debian's chromium (Playwright without its own browser download).
if [[ ! -x /usr/bin/chromium ]]; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "setup: installing Debian's chromium for the browser test" >&2
    export DEBIAN_FRONTEND=noninteractive
    { apt-get install -y -q chromium || { apt-get update -q && apt-get install -y -q chromium; }; } >/dev/null \
      || echo "setup: chromium could not be installed; the browser test will fail" >&2
  else
    echo "setup: /usr/bin/chromium is missing (the browser test needs it); run: apt-get install -y chromium" >&2
  fi
fi
stamp_id=$(cat requirements.txt requirements.lock pyproject.toml | sha1sum | cut -c1-12)
stamp=.venv/.installed-$stamp_id
if [[ -f $stamp ]] && .venv/bin/python -m localdev.check_env; then
  .venv/bin/python -m localdev.pyspark_bytecode  # a no-op once done; adds it to venvs made before it existed
  .venv/bin/python -m localdev.spark_cds  # the same: a no-op while its archive is current
  exit 0
fi
# Prerequisites: one line each naming the Debian package that provides what is missing.
missing=0
need() { echo "setup: $1; run: apt-get install -y $2" >&2; missing=1; }
[[ -n $PYTHON_BIN ]] || { need "python3.11 is not on PATH" python3.11; exit 1; }
py_ver=$("$PYTHON_BIN" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
{ "$PYTHON_BIN" -m venv --help && "$PYTHON_BIN" -c 'import ensurepip'; } >/dev/null 2>&1 \
  || need "$PYTHON_BIN cannot create virtual environments (no venv/ensurepip)" "python$py_ver-venv"
java_major=$(java -version 2>&1 | sed -nE '1s/.*version "(1\.)?([0-9]+).*/\2/p' || true)
[[ ${java_major:-0} -ge 17 ]] || need "Java 17+ is needed (found: ${java_major:-none})" openjdk-17-jdk-headless
command -v javac >/dev/null || need "javac (a JDK, not only a JRE) is needed to build the copy engine" openjdk-17-jdk-headless
command -v mvn >/dev/null || need "mvn is needed to fetch Pulsar from Maven Central" maven
(( missing == 0 )) || exit 1

echo "setup: creating .venv with $PYTHON_BIN" >&2
"$PYTHON_BIN" -m venv .venv
pip=(.venv/bin/pip install -q --disable-pip-version-check)
"${pip[@]}" --upgrade pip
"${pip[@]}" -r requirements.txt -c requirements.lock
# pyspark-client and pyspark share the pyspark/ folder: reinstall the full pyspark last.
pyspark_pin=$(grep -E '^pyspark==' requirements.txt)
"${pip[@]}" --no-deps --force-reinstall "$pyspark_pin"
"${pip[@]}" --no-deps -e .
# spark-submit imports pyspark from zips without bytecode: compile it once here, not in every Spark process.
.venv/bin/python -m localdev.pyspark_bytecode
.venv/bin/python -m localdev.check_env
# The Spark driver's class-data archive (conf/spark/spark-env.sh maps it): about 1 min once, 5 s less per spark-submit.
.venv/bin/python -m localdev.spark_cds
rm -f .venv/.installed-*
touch "$stamp"
