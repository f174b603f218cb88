#!/usr/bin/env bash
# The GPU check (docs/gpu.md), for a machine with an NVIDIA GPU (H100/H200: sm_90)
# and a driver for CUDA 13; no network. About 3-5 minutes, most of it the build:
#   1. builds, with MC_WITH_CUDA=ON, the CUDA unit tests and mc-gpu-check (build-gpu/);
#   2. runs the fake-device tests (cuda_transport_test, gpu_buffers_test) and cuda_device_test
#      with MC_REQUIRE_GPU=1: the XXH3 kernel against libxxhash for every length class and
#      alignment, and the mover through cudart;
#   3. mc-gpu-check roundtrip: an "engine" process shares two GPU buffers by CUDA IPC; they are
#      registered (GpuBufferRegistry), 4096 x 16 KiB blocks are put from one into a pinned
#      segment and got back into the other through the cuda transport, each get proven by the
#      device XXH3 against the recorded checksum, a corrupted block caught, then the first
#      buffer's blocks staged as GPU put sources (GpuPutStager, each proven by the source's device
#      hash), then the second buffer cleared and filled again from pinned staging memory as a
#      staged get does (GpuGetStager, each block proven by the device hash, the corrupted one
#      caught); the engine compares every byte. (In one process, not through mc-client daemons.)
#   4. mc-gpu-check cluster: a local cluster (deploy/local-cluster.sh: mc-master and two
#      mc-client daemons with --cuda_device=0); 1024 x 16 KiB blocks put from a GPU buffer through
#      client 1 (direct puts: one GPU slice per item, written from GPU memory into its segment and
#      proved; the count of direct and staged-after-all puts is printed from its /metrics), then
#      got into GPU memory through client 2 (its own replicas
#      direct, client 1's over TCP through the pinned staging pool), through client 1, and
#      scattered (two slices per block, staged); every byte compared by this process.
#   5. mc-gpu-check bench: GB/s of batched copies for 16 KiB, 256 KiB and 4 MiB blocks beside one
#      plain cudaMemcpy of the same bytes (goal >= 0.9x from 256 KiB), and with the device hash.
# Any byte or checksum mismatch fails the script (exit status 1) with a FAIL line.
# Environment: MC_GPU_BUILD_DIR (build-gpu), MC_JOBS (nproc), MC_CUDA_ARCHITECTURES (90).
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${MC_GPU_BUILD_DIR:-build-gpu}"
jobs="${MC_JOBS:-$(nproc)}"
start=$SECONDS
echo "== gpu_check: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo 'nvidia-smi not found')"
if [[ ! -f "$dir/build.ninja" ]]; then
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMC_WITH_CUDA=ON \
        -DMC_CUDA_ARCHITECTURES="${MC_CUDA_ARCHITECTURES:-90}" -DMC_BUILD_BENCH=ON >/dev/null
fi
cmake --build "$dir" -j "$jobs" --target cuda_transport_test gpu_buffers_test cuda_device_test \
      gpu_store_test mc-gpu-check mc-master mc-client
echo "== built in $((SECONDS - start)) s"

echo "== unit tests on the fake device (batching, faults, bounds, CPU XXH3 reference)"
"$dir/tests/unit/transfer/cuda_transport_test" --gtest_brief=1
"$dir/tests/unit/client/gpu_buffers_test" --gtest_brief=1
"$dir/tests/unit/client/gpu_store_test" --gtest_brief=1
echo "== the XXH3 kernel and cudart backend on the device"
MC_REQUIRE_GPU=1 "$dir/tests/unit/transfer/cuda_device_test"
echo "== round trip between GPU buffers through the cuda transport"
"$dir/bench/mc-gpu-check" roundtrip
echo "== GPU buffers through two mc-client daemons"
cluster_dir="$PWD/$dir/gpu-cluster"
stop_cluster() { MC_BUILD_DIR="$dir" MC_RUN_DIR="$cluster_dir" ./deploy/local-cluster.sh stop >/dev/null 2>&1 || true; }
trap stop_cluster EXIT
MC_BUILD_DIR="$dir" MC_RUN_DIR="$cluster_dir" MC_CLIENT_ARGS="--cuda_device=0" \
  ./deploy/local-cluster.sh start 2
addr() { /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["grpc"])' "$1"; }
"$dir/bench/mc-gpu-check" cluster "$(addr "$cluster_dir/client1.json")" \
  "$(addr "$cluster_dir/client2.json")" "$cluster_dir/store.token"
/usr/bin/python3 - "$cluster_dir/client1.json" <<'PY' || true
import json, sys, urllib.request
http = json.load(open(sys.argv[1]))["http"]
body = urllib.request.urlopen("http://%s/metrics" % http, timeout=5).read().decode()
print("\n".join(l for l in body.splitlines() if l.startswith(("mc_client_gpu_put_direct", "mc_gpu_direct"))))
PY
stop_cluster
echo "== batched copies vs cudaMemcpy"
"$dir/bench/mc-gpu-check" bench
echo "== gpu_check: all byte and checksum checks passed in $((SECONDS - start)) s"
