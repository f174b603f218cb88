#!/usr/bin/env bash
# Installs the dependencies, builds mcstore and runs every test:
#   1. release build (g++): all unit, integration and fault tests;
#   2. sanitizer build (ASan+UBSan): the same tests;
#   3. clang-14 build with -Wthread-safety -Werror: the same tests.
# The tests labelled `rdma` run once more inside a Soft-RoCE VM (deploy/rdma-vm-test.sh), where a
# verbs device exists. The tests labelled `vllm` (real vLLM engines on the CPU, minutes) run
# once, after the release build's other tests, not in every flavour.
# ./deploy/test.sh --quick runs only the first. Exit status is non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
./deploy/install-deps.sh
quick=0
[[ "${1:-}" == "--quick" ]] && quick=1
jobs="${MC_JOBS:-$(nproc)}"
# Tests start daemons; two at a time keeps a 2-core machine responsive.
test_jobs="${MC_TEST_JOBS:-2}"

run_flavour() {
  local flavour="$1" dir="$2"
  echo "=== [$flavour] build"
  ./deploy/build.sh "$flavour"
  echo "=== [$flavour] tests"
  (cd "$dir" && ctest --output-on-failure -j "$test_jobs" --timeout 900 -LE vllm)
}

# The venv is built by install-deps above: a test that cannot find it fails instead of skipping.
export MC_REQUIRE_VENV=1
start=$(date +%s)
run_flavour release build
vstart=$(date +%s)
echo "=== [release] vLLM tests (label vllm)"
(cd build && ctest --output-on-failure -L vllm --timeout 1800)
echo "=== [release] vLLM tests passed in $(( $(date +%s) - vstart )) s"
# Real verbs (label rdma) in one boot of the Soft-RoCE VM; says SKIPPED when qemu cannot run.
./deploy/rdma-vm-test.sh build
if [[ $quick -eq 0 ]]; then
  # Leak checks stay on for our own code; gRPC keeps process-lifetime singletons.
  ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:${ASAN_OPTIONS:-}" \
  LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:${LSAN_OPTIONS:-}" \
  UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}" \
    run_flavour asan build-asan
  run_flavour clang build-clang
fi
echo "=== all tests passed in $(( $(date +%s) - start )) s"
