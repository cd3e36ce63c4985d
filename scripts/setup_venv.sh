#!/usr/bin/env bash
# Creates .venv with the pinned requirements and the project installed editable, then proves the
# install works (pyspark-client can overwrite pyspark's Python files; pandas 3 breaks pyspark.pandas).
# A second run with unchanged requirements only re-checks.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON_BIN=${PYTHON_BIN:-$(command -v python3.11 || command -v python3)}
stamp_id=$(cat requirements.txt pyproject.toml | sha1sum | cut -c1-12)
stamp=.venv/.installed-$stamp_id
if [[ -f $stamp ]] && .venv/bin/python -m localdev.check_env; then
  exit 0
fi
echo "setup: creating .venv with $PYTHON_BIN" >&2
"$PYTHON_BIN" -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check --upgrade pip
.venv/bin/pip install -q --disable-pip-version-check -r requirements.txt
# pyspark-client and pyspark share the pyspark/ folder: reinstall the full pyspark last.
pyspark_pin=$(grep -E '^pyspark==' requirements.txt)
.venv/bin/pip install -q --disable-pip-version-check --no-deps --force-reinstall "$pyspark_pin"
.venv/bin/pip install -q --disable-pip-version-check --no-deps -e .
.venv/bin/python -m localdev.check_env
rm -f .venv/.installed-*
touch "$stamp"
