#!/usr/bin/env bash
# The rdma transport beside perftest on the same device: ib_read_bw / ib_write_bw, then
# mc-rdma-bench (two engines of one process, READ/WRITE of registered memory, 8 requests per
# batch) for 1 MiB and 4 MiB values. Without a NIC it runs itself inside one boot of the
# Soft-RoCE VM (../shared/tools/run-in-rxe-vm.sh); with MC_RDMA_DEVICE set (a real RoCE/IB
# device, MC_RDMA_GID_INDEX its GID) it runs here. Prints figures; never asserts on time.
#   bench/rdma.sh [build-dir]      env: SECONDS_EACH (default 3), SIZES ("1048576 4194304")
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-build}"
bench="$PWD/$dir/bench/mc-rdma-bench"
[[ -x "$bench" ]] || { echo "build $bench first (./deploy/build.sh release mc-rdma-bench)"; exit 2; }
if [[ "${MC_RDMA_BENCH_INSIDE:-0}" != 1 && -z "${MC_RDMA_DEVICE:-}" ]]; then
  vm="$(cd .. && pwd)/shared/tools/run-in-rxe-vm.sh"
  [[ -x "$vm" ]] || { echo "no RDMA device given and no $vm"; exit 2; }
  exec env MC_RDMA_BENCH_INSIDE=1 MC_RDMA_DEVICE=rxe0 MC_RDMA_GID_INDEX=1 \
    RXE_VM_TIMEOUT="${RXE_VM_TIMEOUT:-600}" "$vm" "$0" "$@"
fi
dev="$MC_RDMA_DEVICE"
gid="${MC_RDMA_GID_INDEX:-1}"
secs="${SECONDS_EACH:-3}"
sizes="${SIZES:-1048576 4194304}"
echo "device $dev gid $gid, ${secs}s each"
for size in $sizes; do
  for op in read write; do
    tool="ib_${op}_bw"
    if command -v "$tool" >/dev/null; then
      "$tool" -d "$dev" -x "$gid" -s "$size" -D "$secs" -F >/dev/null 2>&1 &
      srv=$!
      sleep 1
      line=$("$tool" -d "$dev" -x "$gid" -s "$size" -D "$secs" -F 127.0.0.1 2>/dev/null |
             awk '$1 == '"$size"' {print $4}' | tail -1)
      wait "$srv" 2>/dev/null || true
      echo "perftest $tool size=$size: ${line:-?} MB/s (BW average)"
    fi
    "$bench" "$op" "$size" "$secs" 8 2>/dev/null | grep mc-rdma-bench
  done
done
