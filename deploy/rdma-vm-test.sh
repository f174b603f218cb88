#!/usr/bin/env bash
# Runs the tests that need Debian's stock kernel inside one boot of the Soft-RoCE VM
# (../shared/tools/run-in-rxe-vm.sh: qemu, Debian's kernel, rdma_rxe device rxe0): the real-verbs
# tests (ctest label `rdma`) and the tc netem fault cases (label `netem`; the host kernel has no
# sch_netem).
#   ./deploy/rdma-vm-test.sh [build-dir]      (default build/)
# Prints "SKIPPED" and exits 0 when the VM cannot run here (no script, no qemu, no kernel);
# set MC_REQUIRE_RDMA_VM=1 to make that a failure. Bounded: one boot, RXE_VM_TIMEOUT (480 s).
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-build}"
vm="${MC_RXE_VM:-$(cd .. && pwd)/shared/tools/run-in-rxe-vm.sh}"
skip() {
  echo "=== rdma VM tests SKIPPED: $*"
  [[ "${MC_REQUIRE_RDMA_VM:-0}" == 1 ]] && exit 1
  exit 0
}
[[ -x "$vm" ]] || skip "no $vm"
if ! "$vm" --setup >/dev/null 2>&1; then skip "the VM could not be prepared ($vm --setup failed)"; fi
command -v qemu-system-x86_64 >/dev/null || skip "no qemu-system-x86_64"
start=$(date +%s)
echo "=== rdma VM tests (ctest -L 'rdma|netem' inside the rxe VM)"
set +e
RXE_VM_TIMEOUT="${RXE_VM_TIMEOUT:-480}" "$vm" bash -c \
  "cd '$dir' && MC_REQUIRE_RDMA=1 MC_REQUIRE_NETEM=1 ctest --output-on-failure -L 'rdma|netem' --timeout 240"
rc=$?
set -e
if [[ $rc -eq 125 ]]; then skip "the VM failed to boot (exit 125)"; fi
echo "=== rdma VM tests finished in $(( $(date +%s) - start )) s (exit $rc)"
exit $rc
