#!/usr/bin/env bash
# Gets served by the SSD tier, end to end: one mc-master and one mc-client with a small memory
# segment and an SSD tier on BENCH_DIR. For each value size it puts a set of keys (kept), waits
# until the tier holds them, gets them from memory (RUNS runs), then puts a segment's worth of
# other values twice over so eviction drops the memory copies (persisted objects go first), and
# gets the same keys again, now read from the client's own SSD tier and verified. Prints memory
# and SSD GB/s and their ratio; mc_ssd_reads_total proves where the second gets came from.
# Environment: see bench/lib.sh; BENCH_DIR (default /var/tmp: not tmpfs, the tier uses O_DIRECT).
#   ./bench/ssd_get.sh            RUNS=3 ./bench/ssd_get.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
command -v curl >/dev/null || { echo "ssd_get: curl missing" >&2; exit 1; }
segment=$((256 << 20))
ssd="$(mktemp -d "$(abs_path "${BENCH_DIR:-/var/tmp}")/mc-ssd-bench.XXXXXX")"
trap 'cleanup; rm -rf "$ssd"' EXIT

MC_SEGMENT_SIZE=$segment MC_MASTER_ARGS="--offload_watermark=0" \
  MC_CLIENT_ARGS="--prefault --offload_dir=$ssd --offload_capacity=$((2 << 30))" \
  ./deploy/local-cluster.sh start 1 >&2
client="unix:$MC_RUN_DIR/client1.sock"
http="$(ready_field "$MC_RUN_DIR/client1.json" http)"
metric() {  # metric NAME_WITH_LABELS: its value at mc-client's /metrics (0 when absent)
  curl -fsS "http://$http/metrics" | awk -v n="$1" '$1 == n { v = $2 } END { print v + 0 }'
}
wait_metric_at_least() {  # wait_metric_at_least NAME VALUE: up to 60 s
  local i
  for i in $(seq 600); do
    (( $(metric "$1" | cut -d. -f1) >= $2 )) && return 0
    sleep 0.1
  done
  echo "ssd_get: $1 never reached $2 (at $(metric "$1"))" >&2
  curl -fsS "http://$http/metrics" | grep -E "offloads_total|mc_ssd_" | grep -v "^#" >&2
  return 1
}

rows=()
for size in 1048576 4194304 16777216; do
  keys=$(( (96 << 20) / size ))  # well under the segment, so the puts themselves evict nothing
  (( keys < 4 )) && keys=4
  common=(--client "$client" --value_size "$size" --batch 4 --keys "$keys" --key_prefix "ssd$size")
  offloaded="$(metric 'mc_client_offloads_total{result="ok"}' | cut -d. -f1)"
  mcbench "${common[@]}" --mode put --keep --runs 1 >/dev/null
  echo "ssd_get: $(mib "$size"): $keys keys put; waiting for the tier to hold them" >&2
  wait_metric_at_least 'mc_client_offloads_total{result="ok"}' $((offloaded + keys))
  mem="$(mcbench "${common[@]}" --mode get --stored --iterations 20 --runs "$RUNS")"
  # Two segments' worth of other puts: eviction drops the persisted memory copies first.
  mcbench --client "$client" --value_size "$size" --batch 4 --keys $(( 2 * segment / size )) \
    --mode put --runs 1 --key_prefix "fill$size" >/dev/null
  reads="$(metric mc_ssd_reads_total | cut -d. -f1)"
  disk="$(mcbench "${common[@]}" --mode get --stored --iterations 20 --runs "$RUNS")"
  served=$(( $(metric mc_ssd_reads_total | cut -d. -f1) - reads ))
  rows+=("$(printf '%-7s %5s %9s %9s %9s %9s %11s' "$(mib "$size")" "$keys" "$(field "$mem" GB/s)" \
    "$(field "$disk" GB/s)" "$(ratio "$(field "$disk" GB/s)" "$(field "$mem" GB/s)")" \
    "$(field "$disk" p50_ms)" "$served")")
done

echo
echo "mcstore gets from memory, then from the client's own SSD tier, $(date -u +%F), $(nproc) cores, medians of $RUNS runs, batches of 4"
echo "ssd dir: ${BENCH_DIR:-/var/tmp} ($(df -T "$ssd" | awk 'NR==2{print $2}'))"
printf '%-7s %5s %9s %9s %9s %9s %11s\n' value keys mem_GB/s ssd_GB/s ssd/mem ssd_p50ms ssd_reads
printf '%s\n' "${rows[@]}"
