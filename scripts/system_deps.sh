#!/usr/bin/env bash
# Debian packages the project needs: headless Chromium for the Airflow UI test, and
# redis-server, the embedded default's stream engine (trainyard.streaming: its server runs
# from .trainyard/redis, started and stopped by the project). Idempotent.
set -euo pipefail
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
else
  echo "${missing[*]} not installed and cannot be installed here (needs root + apt-get)" >&2
  exit 1
fi
