#!/usr/bin/env bash
# datacontract-cli in a venv of its own (.trainyard/tools/datacontract): its pins (typer)
# conflict with Airflow's, so it cannot live in .venv. The ODCS tests lint trainyard's
# exported contracts with it. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.trainyard/tools/datacontract
version=1.2.8
if [ -x "$venv/bin/datacontract" ] && "$venv/bin/datacontract" --version 2>/dev/null | grep -qx "$version"; then
  exit 0
fi
rm -rf "$venv"
python3 -m venv "$venv"
# (this machine's pip config names local indexes that may be absent: their warnings go)
# pip byte-compiles on one core, compileall on every core
"$venv/bin/pip" install --quiet --no-compile "datacontract-cli==$version" 2> >(grep -v "is ignored" >&2)
"$venv/bin/python" -m compileall -q -j 0 "$venv/lib" >/dev/null || true  # (as pip: a file that does not compile fails at its import)
