#!/usr/bin/env bash
# The rdma transport beside perftest on the same device: ib_read_bw / ib_write_bw, then
# mc-rdma-bench (two engines of one process, READ/WRITE of registered memory, 8 requests per
# batch) for 1 MiB and 4 MiB values, then end to end: a local cluster (mc-master, two
# mc-clients with --transport=rdma) and mc-bench getting values put through client1 from
# client2 into shm slices (each byte crosses as an RDMA READ into a registered application
# buffer), with the rdma bytes from client2's /metrics. Without a NIC it runs itself inside one boot of the
# Soft-RoCE VM (deploy/rxe-vm.sh); with MC_RDMA_DEVICE set (a real RoCE/IB
# device, MC_RDMA_GID_INDEX its GID) it runs here. Prints figures; never asserts on time.
#   bench/rdma.sh [build-dir]      env: SECONDS_EACH (default 3), SIZES ("1048576 4194304"),
#                                  PERFTEST_ITERS (perftest iterations per size, default 16)
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-build}"
bench="$PWD/$dir/bench/mc-rdma-bench"
[[ -x "$bench" ]] || { echo "build $bench first (./deploy/build.sh release mc-rdma-bench)"; exit 2; }
if [[ "${MC_RDMA_BENCH_INSIDE:-0}" != 1 && -z "${MC_RDMA_DEVICE:-}" ]]; then
  vm="$PWD/deploy/rxe-vm.sh"
  exec env MC_RDMA_BENCH_INSIDE=1 MC_RDMA_DEVICE=rxe0 MC_RDMA_GID_INDEX=1 \
    RXE_VM_TIMEOUT="${RXE_VM_TIMEOUT:-600}" "$vm" "$0" "$@"
fi
dev="$MC_RDMA_DEVICE"
gid="${MC_RDMA_GID_INDEX:-1}"
secs="${SECONDS_EACH:-3}"
sizes="${SIZES:-1048576 4194304}"
iters="${PERFTEST_ITERS:-16}"
echo "device $dev gid $gid, ${secs}s each"
for size in $sizes; do
  for op in read write; do
    tool="ib_${op}_bw"
    if command -v "$tool" >/dev/null; then
      # A fixed number of iterations, not -D: in duration mode perftest printed 0.00 for 1 MiB
      # under rxe (too few completions in the measured window).
      "$tool" -d "$dev" -x "$gid" -s "$size" -n "$iters" -F >/dev/null 2>&1 &
      srv=$!
      sleep 1
      line=$("$tool" -d "$dev" -x "$gid" -s "$size" -n "$iters" -F 127.0.0.1 2>/dev/null |
             awk '$1 == '"$size"' {print $4}' | tail -1)
      wait "$srv" 2>/dev/null || true
      echo "perftest $tool size=$size: ${line:-?} MB/s (BW average)"
    fi
    "$bench" "$op" "$size" "$secs" 8 2>/dev/null | grep mc-rdma-bench
  done
done

# End to end through the daemons (needs mc-bench, mc-master, mc-client in the build).
if [[ -x "$dir/tools/mc-bench" && -x "$dir/client/mc-client" ]]; then
  export MC_RUN_DIR="${TMPDIR:-/tmp}/mc-rdma-bench-$$" MC_BUILD_DIR="$PWD/$dir"
  MC_SEGMENT_SIZE=$((256 << 20)) \
    MC_CLIENT_ARGS="--transport=rdma --rdma_device=$dev --rdma_gid_index=$gid" \
    ./deploy/local-cluster.sh start 2 >/dev/null
  trap './deploy/local-cluster.sh stop >/dev/null 2>&1 || true' EXIT
  field() { /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }
  http2="$(field "$MC_RUN_DIR/client2.json" http)"
  rdma_bytes() {
    curl -fsS "http://$http2/metrics" |
      awk '/^mc_transfer_bytes_total\{.*transport="rdma"/ {s += $2} END {printf "%.0f", s}'
  }
  for size in $sizes; do
    before="$(rdma_bytes)"
    line="$("$dir/tools/mc-bench" --put_client "unix:$MC_RUN_DIR/client1.sock" \
      --put_fd_socket "$MC_RUN_DIR/client1.sock.fd" --client "unix:$MC_RUN_DIR/client2.sock" \
      --fd_socket "$MC_RUN_DIR/client2.sock.fd" --mode get --dest shm --value_size "$size" \
      --keys 16 --batch 8 --seconds "$secs" --runs 1 2>&1 | grep '^mc-bench summary' || true)"
    moved=$(( $(rdma_bytes) - before ))
    gbps="$(tr ' ' '\n' <<<"$line" | sed -n 's/^GB\/s=//p')"
    echo "mc-bench get (client2 <- client1 over rdma, shm dest) size=$size:" \
      "$(awk -v g="${gbps:-0}" 'BEGIN { printf "%.1f", g * 1000 }') MB/s," \
      "rdma bytes on client2 $moved"
  done
fi

