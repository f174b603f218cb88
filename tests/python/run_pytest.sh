#!/usr/bin/env bash
# Runs pytest with the given arguments in this checkout's Python venv (deploy/python-venv.sh
# path; with --sglang first, the SGLang one), after installing this checkout's mcstore package
# into it when python/ or proto/ changed (a no-op otherwise): the tests import the installed
# package, as users do, never python/ itself.
# No base venv (./deploy/install-deps.sh builds it): exit 77 (ctest SKIP) with a message, unless
# MC_REQUIRE_VENV is set (then fail).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
pyenv=("$here/../../deploy/python-venv.sh")
if [[ "${1:-}" == "--sglang" ]]; then
  pyenv+=(--sglang)
  shift
fi
rc=0
"${pyenv[@]}" install-package || rc=$?
if [[ $rc -eq 3 ]]; then
  msg="no Python venv at $("${pyenv[@]}" base) (run ./deploy/install-deps.sh, or set MC_VENV)"
  if [[ -n "${MC_REQUIRE_VENV:-}" ]]; then
    echo "FAIL: $msg; MC_REQUIRE_VENV is set" >&2
    exit 1
  fi
  echo "SKIP: $msg"
  exit 77
elif [[ $rc -ne 0 ]]; then
  echo "FAIL: installing this checkout's mcstore package into $("${pyenv[@]}" path) failed" >&2
  exit 1
fi
exec "$("${pyenv[@]}" path)/bin/python" -m pytest -v -p no:cacheprovider "$@"
