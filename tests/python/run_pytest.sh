#!/usr/bin/env bash
# Runs pytest with the given arguments in the Python virtual environment of the Python client
# and vLLM tests: the one deploy/install-deps.sh builds (deploy/python-venv.sh path: $MC_VENV, else
# ~/.cache/mcstore/venv-<hash of deploy/requirements-lock.txt>).
# No venv: exit 77 (ctest SKIP) with a message, unless MC_REQUIRE_VENV is set (then fail).
set -euo pipefail
venv="$("$(dirname "$0")/../../deploy/python-venv.sh" path)"
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
