#!/usr/bin/env bash
# Configures and builds one flavour of mcstore.
#   ./deploy/build.sh [release|asan|clang] [ninja targets...]
# Build directories: build/ (release), build-asan/ (ASan+UBSan), build-clang/ (clang-14 with
# -Wthread-safety). Set MC_JOBS to limit parallelism (default: nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
flavour="${1:-release}"
shift || true
jobs="${MC_JOBS:-$(nproc)}"
# ccache keys on paths relative to the checkout, so a fresh clone elsewhere (CI) reuses the cache
# that earlier builds of any clone filled; debug info keeps relative paths too.
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1 CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-20G}"
case "$flavour" in
  release) dir=build;       args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo) ;;
  asan)    dir=build-asan;  args=(-DCMAKE_BUILD_TYPE=Debug -DMC_SANITIZE=address,undefined -DMC_BUILD_BENCH=OFF) ;;
  clang)   dir=build-clang; args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14) ;;
  *) echo "unknown flavour '$flavour' (release|asan|clang)" >&2; exit 2 ;;
esac
if [[ ! -f "$dir/build.ninja" ]]; then
  cmake -S . -B "$dir" -G Ninja "${args[@]}" >/dev/null
fi
cmake --build "$dir" -j "$jobs" ${1:+--target "$@"}
