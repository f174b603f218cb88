#!/usr/bin/env bash
# Configures and builds one flavour of mcstore.
#   ./deploy/build.sh [release|asan|clang|fuzz|tsan] [ninja targets...]
# Build directories: build/ (release), build-asan/ (ASan+UBSan), build-clang/ (clang-14 with
# -Wthread-safety), build-fuzz/ (clang-14 libFuzzer targets with ASan+UBSan; default target
# mc_fuzzers), build-tsan/ (clang-14 ThreadSanitizer). Set MC_JOBS to limit parallelism
# (default: nproc).
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
  fuzz)    dir=build-fuzz;  args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14
                                  -DMC_SANITIZE=address,undefined -DMC_FUZZ=ON -DMC_BUILD_BENCH=OFF)
           [[ $# -gt 0 ]] || set -- mc_fuzzers ;;
  tsan)    dir=build-tsan;  args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14
                                  -DMC_SANITIZE=thread -DMC_BUILD_BENCH=OFF) ;;
  *) echo "unknown flavour '$flavour' (release|asan|clang|fuzz|tsan)" >&2; exit 2 ;;
esac
if [[ ! -f "$dir/build.ninja" ]]; then
  cmake -S . -B "$dir" -G Ninja "${args[@]}" >/dev/null
fi
cmake --build "$dir" -j "$jobs" ${1:+--target "$@"}
