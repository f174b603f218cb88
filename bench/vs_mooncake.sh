#!/usr/bin/env bash
# mcstore against Mooncake Store on loopback (bench/vs_mooncake.py; see bench/README.md,
# "Against Mooncake"). Prints figures, asserts nothing.
#
#   ./bench/vs_mooncake.sh [--sizes 64KiB,1MiB,4MiB] [--total 256MiB] [--rounds 3] [--batch 16]
#                          [--no-mc-bench] [--mooncake-checksum] [--python-grpc] [--mc-tls]
#                          [--python-slices]
#
# Makes (once, then reuses) a venv of its own with the pinned Mooncake wheel
# (bench/requirements-mooncake.txt) and this checkout's mcstore Python package (pip install
# ./python, redone whenever python/ or proto/ changed), so both systems run under the same
# interpreter and numpy, and the bench does not need the project's multi-GB vLLM venv.
# Environment: MC_BENCH_MOONCAKE_VENV (default
# ${XDG_CACHE_HOME:-$HOME/.cache}/mcstore/bench-mooncake-venv), MC_BUILD_DIR (default build;
# mc-master, mc-client, tools/mc-bench), PYTHON (interpreter the venv is made with, default
# /usr/bin/python3).
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
venv="${MC_BENCH_MOONCAKE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/mcstore/bench-mooncake-venv}"
req="$repo/bench/requirements-mooncake.txt"
py="${PYTHON:-/usr/bin/python3}"

req_hash="$(sha256sum "$req" | cut -c1-12)"
# The mcstore package's inputs: its sources and the .proto files its stubs are generated from.
pkg_hash="$(find python/mcstore python/setup.py python/pyproject.toml proto -type f \
  \( -name '*.py' -o -name '*.proto' -o -name '*.toml' -o -name '*.typed' \) -print0 |
  LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-12)"

if [[ ! -f "$venv/.req-$req_hash" ]]; then
  echo "vs_mooncake: making $venv from $req (PyPI)" >&2
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  log="$(mktemp /tmp/vs_mooncake-pip.XXXXXX)"
  if ! "$py" -m venv "$venv" >"$log" 2>&1 ||
    ! timeout 900 "$venv/bin/pip" install --disable-pip-version-check -r "$req" >>"$log" 2>&1; then
    echo "vs_mooncake: could not install the Mooncake wheel (mooncake-transfer-engine-non-cuda," \
      "pinned in bench/requirements-mooncake.txt; PyPI must be reachable and have a wheel for this" \
      "platform and $("$py" -V 2>&1)). pip's output:" >&2
    tail -30 "$log" >&2
    rm -rf "$venv"
    exit 1
  fi
  if ! "$venv/bin/python" -c 'from mooncake.store import MooncakeDistributedStore' >>"$log" 2>&1 ||
    [[ ! -x "$venv/bin/mooncake_master" ]]; then
    echo "vs_mooncake: the Mooncake wheel installed but does not load (or ships no mooncake_master):" >&2
    tail -30 "$log" >&2
    exit 1
  fi
  rm -f "$log"
  touch "$venv/.req-$req_hash"
fi

if [[ ! -f "$venv/.mcstore-$pkg_hash" ]]; then
  echo "vs_mooncake: installing this checkout's mcstore package (python/) into $venv" >&2
  log="$(mktemp /tmp/vs_mooncake-pip.XXXXXX)"
  if ! timeout 600 "$venv/bin/pip" install --disable-pip-version-check --force-reinstall --no-deps \
    ./python >"$log" 2>&1; then
    echo "vs_mooncake: pip install ./python failed:" >&2
    tail -30 "$log" >&2
    exit 1
  fi
  rm -f "$log" "$venv"/.mcstore-*
  touch "$venv/.mcstore-$pkg_hash"
fi

exec "$venv/bin/python" "$repo/bench/vs_mooncake.py" "$@"
