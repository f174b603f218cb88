#!/usr/bin/env bash
# Runs the tests that need Debian's stock kernel inside one boot of the Soft-RoCE VM
# (deploy/rxe-vm.sh: qemu, Debian's kernel, rdma_rxe device rxe0): the real-verbs tests (ctest
# label `rdma`) and the tc netem fault cases (label `netem`; our host kernels have no sch_netem).
#   ./deploy/rdma-vm-test.sh [build-dir]      (default build/)
# Fails when the VM cannot run here (missing packages, no kernel package, qemu failing to boot):
# a suite that silently did not run is no pass. MC_REQUIRE_RDMA_VM=0 (deploy/test.sh --quick)
# turns that into "SKIPPED: why" and exit 0. Bounded: one boot, RXE_VM_TIMEOUT (480 s).
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-build}"
vm="$PWD/deploy/rxe-vm.sh"
unavailable() {
  if [[ "${MC_REQUIRE_RDMA_VM:-1}" == 0 ]]; then
    echo "=== rdma VM tests SKIPPED: $* (MC_REQUIRE_RDMA_VM=0)"
    exit 0
  fi
  echo "=== rdma VM tests FAILED: $* (deploy/install-deps.sh installs what the VM needs)" >&2
  exit 1
}
[[ -d "$dir" ]] || { echo "no build directory $dir (./deploy/build.sh release)" >&2; exit 2; }
start=$(date +%s)
"$vm" --setup || unavailable "the VM image could not be prepared (deploy/rxe-vm.sh --setup failed)"
echo "=== rdma VM tests (ctest -L 'rdma|netem' inside the rxe VM)"
set +e
RXE_VM_TIMEOUT="${RXE_VM_TIMEOUT:-480}" "$vm" bash -c \
  "cd '$dir' && MC_REQUIRE_RDMA=1 MC_REQUIRE_NETEM=1 ctest --output-on-failure -L 'rdma|netem' --timeout 240"
rc=$?
set -e
[[ $rc -ne 125 ]] || unavailable "the VM failed before the tests ended (exit 125)"
echo "=== rdma VM tests finished in $(( $(date +%s) - start )) s (exit $rc)"
exit $rc
