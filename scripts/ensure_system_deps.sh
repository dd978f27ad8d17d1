#!/usr/bin/env bash
# Provide the system programs the project needs; first, refuse in one line a python3 older than 3.11 or
# without its venv module (python3-venv). `ensure_system_deps.sh demo` (make demo): redis-server
# only, what `hitl demo` / `hitl up` start. `ensure_system_deps.sh` (make setup: tests, lint, benchmarks):
# also redis-cli, promtool (Debian package prometheus: checks deploy/prometheus/rules.yml), PostgreSQL's
# server (Debian package postgresql: the archive's tests and benchmark start their own with
# initdb/pg_ctl, see harness/postgres.py; Debian keeps its binaries under
# /usr/lib/postgresql/<version>/bin) and Chromium (for the browser tests). Uses what is on PATH;
# otherwise installs Debian's packages when running as root; otherwise says what to do.
set -euo pipefail
mode="${1:-all}"
case "$mode" in
  all | demo) ;;
  *) echo "usage: $0 [all|demo]" >&2; exit 2 ;;
esac
# Python >= 3.11 with its venv module (Debian ships it apart, as python3-venv): `make` creates the venv with it.
py_hint="Debian: sudo apt-get install python3 python3-venv (Debian 12 has Python 3.11)"
if ! command -v python3 >/dev/null 2>&1; then
  echo "setup: python3 not found: hitl-review needs Python >= 3.11 ($py_hint)" >&2
  exit 1
fi
py_version="$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [ "${py_version%%.*}" -lt 3 ] || { [ "${py_version%%.*}" -eq 3 ] && [ "${py_version#*.}" -lt 11 ]; }; then
  echo "setup: python3 is Python $py_version; hitl-review needs Python >= 3.11 ($py_hint)" >&2
  exit 1
fi
if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
  echo "setup: python3 (Python $py_version) has no venv module, which make uses to create .venv ($py_hint)" >&2
  exit 1
fi
need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
if [ "$mode" = "all" ]; then
  command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
  command -v promtool >/dev/null 2>&1 || need+=(prometheus)
  command -v initdb >/dev/null 2>&1 || compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || need+=(postgresql)
  if [ "${HITL_SKIP_CHROMIUM:-0}" != "1" ]; then
    command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ] || need+=(chromium)
  fi
fi
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "setup: installing ${need[*]} with apt-get" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  exit 0
fi
echo "setup: missing ${need[*]}. Install them (Debian: sudo apt-get install ${need[*]})," >&2
if [ "$mode" = "all" ]; then
  echo "       or point REDIS_URL at an existing Redis and set HITL_SKIP_CHROMIUM=1." >&2
fi
exit 1
