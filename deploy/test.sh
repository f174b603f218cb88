#!/usr/bin/env bash
# Installs the dependencies, builds mcstore and runs every test, printing each stage's time:
#   0. format: .clang-format on the lines changed since the merge base with $MC_FORMAT_BASE
#      (default main; old code is not reformatted);
#   1. release build (g++): all unit, integration and fault tests;
#   2. sanitizer build (ASan+UBSan): the same tests;
#   3. clang-14 build with -Wthread-safety -Werror: the same tests;
#   4. ThreadSanitizer build (clang-14): the unit tests (tests/tsan.supp);
#   5. fuzz build (clang-14 libFuzzer, ASan+UBSan): each fuzzer for $MC_FUZZ_SECONDS (default
#      20) s from its seed corpus in tests/fuzz/corpus (new inputs go to a temporary directory).
# The release stage also runs, once each, the deployment checks (label `deploy`: systemd units,
# Kubernetes manifests, Prometheus rules, the dashboard, flag files, the status page; timed), the
# tests labelled `vllm` (real vLLM engines on the CPU, minutes), `sglang` (the SGLang storage
# backend in its own venv, ~20 s) and `wheel` (the package built with python -m build and
# installed in a clean venv, from PyPI, ~30 s), and the real-verbs and netem tests (labels
# `rdma`, `netem`) in one boot of the Soft-RoCE VM (deploy/rxe-vm.sh): a VM that cannot run fails
# the full run; --quick skips it then, saying so.
# The default runs all six stages; MC_TEST_STAGES="release fuzz" (for example) picks some;
# ./deploy/test.sh --quick runs only stages 0 and 1. Exit status is non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
./deploy/install-deps.sh
quick=0
[[ "${1:-}" == "--quick" ]] && quick=1
# The full run fails when the Soft-RoCE VM cannot run; --quick skips that suite then, saying so.
[[ $quick -eq 1 ]] && export MC_REQUIRE_RDMA_VM="${MC_REQUIRE_RDMA_VM:-0}"
jobs="${MC_JOBS:-$(nproc)}"
# Tests start daemons; two at a time keeps a 2-core machine responsive.
test_jobs="${MC_TEST_JOBS:-2}"
fuzz_seconds="${MC_FUZZ_SECONDS:-20}"
if [[ $quick -eq 1 ]]; then
  stages="${MC_TEST_STAGES:-format release}"
else
  stages="${MC_TEST_STAGES:-format release asan clang tsan fuzz}"
fi

run_flavour() {
  local flavour="$1" dir="$2"
  shift 2
  echo "=== [$flavour] build"
  ./deploy/build.sh "$flavour"
  echo "=== [$flavour] tests"
  (cd "$dir" && ctest --output-on-failure -j "$test_jobs" --timeout 900 -LE 'vllm|deploy|sglang|wheel' "$@")
}

format_check() {
  local base
  base=$(git merge-base "${MC_FORMAT_BASE:-main}" HEAD 2>/dev/null) || {
    echo "=== [format] no merge base with ${MC_FORMAT_BASE:-main}: skipped"
    return 0
  }
  local out
  out=$(git clang-format-14 --binary clang-format-14 --diff --extensions cc,h "$base" -- . 2>&1 || true)
  if [[ -n "$out" && "$out" != *"no modified files to format"* &&
        "$out" != *"did not modify any files"* ]]; then
    echo "$out"
    echo "=== [format] lines changed since $base do not follow .clang-format; fix with:" >&2
    echo "    git clang-format-14 $base" >&2
    return 1
  fi
  echo "=== [format] ok (lines changed since $base)"
}

fuzz_run() {
  echo "=== [fuzz] build"
  ./deploy/build.sh fuzz
  local f work
  for f in frame_fuzz packed_lookups_fuzz record_fuzz master_requests_fuzz http_admin_fuzz \
    store_requests_fuzz index_notice_fuzz credentials_fuzz fast_channel_fuzz master_lane_fuzz; do
    work=$(mktemp -d)
    echo "=== [fuzz] $f for ${fuzz_seconds} s"
    # Leak checks off: the fixtures are process-lifetime singletons.
    if ! ASAN_OPTIONS="detect_leaks=0:${ASAN_OPTIONS:-}" \
         UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}" \
         "build-fuzz/tests/fuzz/$f" -max_total_time="$fuzz_seconds" -timeout=10 -rss_limit_mb=2048 \
           -artifact_prefix="$work/" -print_final_stats=1 "$work" "tests/fuzz/corpus/$f" \
           >"$work/log" 2>&1; then
      tail -60 "$work/log"
      echo "=== [fuzz] $f FAILED; the crashing input is in $work (add it as a unit test)" >&2
      return 1
    fi
    grep -E "stat::number_of_executed_units|stat::new_units_added" "$work/log" | tr '\n' ' '
    echo
    rm -rf "$work"
  done
}

# The venv is built by install-deps above: a test that cannot find it fails instead of skipping.
export MC_REQUIRE_VENV=1
# Likewise Chromium for the status page's test (label deploy).
export MC_REQUIRE_DEPLOY_TOOLS=1
start=$(date +%s)
for stage in $stages; do
  t0=$(date +%s)
  case "$stage" in
    format) format_check ;;
    release)
      run_flavour release build
      echo "=== [release] deployment checks (label deploy: units, manifests, rules, dashboard,"
      echo "    flag files, metrics against live daemons, the status page in Chromium)"
      t1=$(date +%s)
      (cd build && ctest --output-on-failure -L deploy --timeout 600)
      echo "=== [release] deployment checks took $(( $(date +%s) - t1 )) s"
      echo "=== [release] vLLM tests (label vllm)"
      (cd build && ctest --output-on-failure -L vllm --timeout 1800)
      t1=$(date +%s)
      echo "=== [release] SGLang storage backend tests (label sglang)"
      (cd build && ctest --output-on-failure -L sglang --timeout 900)
      echo "=== [release] SGLang tests took $(( $(date +%s) - t1 )) s"
      t1=$(date +%s)
      echo "=== [release] wheel from python -m build in a clean venv (label wheel; needs PyPI)"
      (cd build && ctest --output-on-failure -L wheel --timeout 900)
      echo "=== [release] wheel test took $(( $(date +%s) - t1 )) s"
      echo "=== [release] real-verbs tests in the Soft-RoCE VM (label rdma)"
      ./deploy/rdma-vm-test.sh build ;;
    asan)
      # Leak checks stay on for our own code; gRPC keeps process-lifetime singletons.
      ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:${ASAN_OPTIONS:-}" \
      LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:${LSAN_OPTIONS:-}" \
      UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}" \
        run_flavour asan build-asan ;;
    clang) run_flavour clang build-clang ;;
    tsan)
      echo "=== [tsan] build (unit tests)"
      ./deploy/build.sh tsan mc_unit_tests
      echo "=== [tsan] tests"
      # GrpcMasterClientTest, PackedReleases, AuthenticatedMasterClientTest, MasterFailoverTest,
      # GpuBufferServiceAuth, MasterLaneTest and MasterLaneClientTest run gRPC servers
      # in-process (the lane's tests start a whole MasterServer, gRPC listener included):
      # Debian's gRPC is not instrumented, so TSan cannot see its internal synchronisation and
      # reports races inside it that are not ours; those tests run in every other stage. The
      # lane's two ends run here without a gRPC listener: LaneThreadsTest (client_test).
      (cd build-tsan &&
        LD_PRELOAD="$PWD/tests/libmc_absl_tsan.so" \
        GTEST_FILTER='-GrpcMasterClientTest.*:PackedReleases.*:AuthenticatedMasterClientTest.*:MasterFailoverTest.*:GpuBufferServiceAuth.*:MasterLaneTest.*:MasterLaneClientTest.*' \
        TSAN_OPTIONS="suppressions=$PWD/../tests/tsan.supp:halt_on_error=1:second_deadlock_stack=1:${TSAN_OPTIONS:-}" \
        ctest --output-on-failure -j "$test_jobs" --timeout 900 -L unit) ;;
    fuzz) fuzz_run ;;
    *) echo "unknown stage '$stage'" >&2; exit 2 ;;
  esac
  echo "=== [$stage] stage took $(( $(date +%s) - t0 )) s"
done
echo "=== all tests passed in $(( $(date +%s) - start )) s"
