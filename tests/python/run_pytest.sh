#!/usr/bin/env bash
# Runs pytest with the given arguments in the Python virtual environment of the Python client
# and vLLM tests: $MC_VENV, else the default location deploy/install-deps.sh uses.
# No venv: exit 77 (ctest SKIP) with a message, unless MC_REQUIRE_VENV is set (then fail).
set -euo pipefail
venv="${MC_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/mcstore/venv}"
py="$venv/bin/python"
if [[ ! -x "$py" ]]; then
  msg="no Python venv at $venv (run ./deploy/install-deps.sh, or set MC_VENV)"
  if [[ -n "${MC_REQUIRE_VENV:-}" ]]; then
    echo "FAIL: $msg; MC_REQUIRE_VENV is set" >&2
    exit 1
  fi
  echo "SKIP: $msg"
  exit 77
fi
exec "$py" -m pytest -v -p no:cacheprovider "$@"
