#!/usr/bin/env bash
# What the owner-side object index costs puts (docs/architecture.md "Restart and return"): the
# same cluster (master + 2 mc-clients on loopback) started alternately with `--object_index`
# on (the default) and off, REPS times each. client1 has no memory (--segment_size 0), so its
# puts land in client2's segments and each batch costs one INDEX frame to client2; client2's own
# puts update its index directly. Per run: put GB/s and batch p50 of 4 KiB and 1 MiB values in
# batches of 16, remote (through client1) and local (through client2), and the CPU time both
# mc-clients spent
# per put (utime+stime from /proc, which a busy shared machine disturbs far less than GB/s).
# Prints every run and the medians with the ratio on/off (1.00 = free). Figures, never assertions.
#   ./bench/index_cost.sh              REPS=5 ./bench/index_cost.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
REPS="${REPS:-3}"

declare -A res cpu lat
cpu_ticks() {  # utime+stime of both mc-clients, in clock ticks
  local t=0 pid f
  for f in "$MC_RUN_DIR"/client1.pid "$MC_RUN_DIR"/client2.pid; do
    pid="$(cat "$f")"
    t=$(( t + $(awk '{print $14 + $15}' "/proc/$pid/stat") ))
  done
  echo "$t"
}
hz="$(getconf CLK_TCK)"
cases=(remote_4KiB local_4KiB remote_1MiB local_1MiB)
for ((rep = 1; rep <= REPS; rep++)); do
  for idx in true false; do
    MC_CLIENT_ARGS="--object_index=$idx" MC_CLIENT1_ARGS="--segment_size 0" start_mcstore
    c1="unix:$MC_RUN_DIR/client1.sock"
    c2="unix:$MC_RUN_DIR/client2.sock"
    line="rep=$rep object_index=$idx"
    for c in "${cases[@]}"; do
      where="${c%_*}" size="${c#*_}"
      client="$c2"; [[ "$where" == remote ]] && client="$c1"
      keys=512; [[ "$size" == 1MiB ]] && keys=128
      before="$(cpu_ticks)"
      out="$(mcbench --client "$client" --mode put --value_size "$size" --keys "$keys" \
        --batch 16 --runs 5)"
      us="$(awk -v t=$(( $(cpu_ticks) - before )) -v hz="$hz" -v n=$(( keys * 5 )) \
        'BEGIN { printf "%.1f", t / hz * 1e6 / n }')"
      g="$(field "$out" GB/s)"
      p50="$(field "$out" p50_ms)"
      res[$c,$idx]+="$g "
      cpu[$c,$idx]+="$us "
      lat[$c,$idx]+="$p50 "
      line+=" put_${c}_GB/s=$g p50_ms=$p50 cpu_us/put=$us"
    done
    ./deploy/local-cluster.sh stop >/dev/null
    echo "$line"
  done
done

median() { tr ' ' '\n' <<<"$1" | grep -v '^$' | sort -g | awk '{a[NR]=$1} END { if (NR) print a[int((NR+1)/2)]; else print "-" }'; }
echo "medians over $REPS runs (object index on / off = ratio):"
for c in "${cases[@]}"; do
  on="$(median "${res[$c,true]}")" off="$(median "${res[$c,false]}")"
  printf '  put %-12s GB/s: %s / %s = %s\n' "$c" "$on" "$off" "$(ratio "$on" "$off")"
  on="$(median "${lat[$c,true]}")" off="$(median "${lat[$c,false]}")"
  printf '  put %-12s batch p50 ms: %s / %s = %s\n' "$c" "$on" "$off" "$(ratio "$on" "$off")"
  on="$(median "${cpu[$c,true]}")" off="$(median "${cpu[$c,false]}")"
  printf '  put %-12s mc-client CPU us per put (incl. its remove): %s / %s = %s\n' "$c" "$on" \
    "$off" "$(ratio "$on" "$off")"
done
