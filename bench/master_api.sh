#!/usr/bin/env bash
# A/B of two master (and daemon) configurations through a local cluster, interleaved (e.g. the
# sync master of bench/README.md, "Where the daemon's master calls spend their time", was
# A_MASTER_ARGS=--grpc_server=callback B_MASTER_ARGS=--grpc_server=sync). Each round starts a fresh
# cluster (master + 2 mc-clients, MC_AUTH=0 as the other benches) per variant and runs mc-bench
# --mode both over client1's fast channel: local puts then gets of 16 x VALUE_SIZE (64 KiB).
# Per variant and round: get and put p50/p99 ms, and per get batch (the gets' GetReplicas
# dominate: ITERATIONS x RUNS get batches against KEYS/16 x RUNS put batches) the master's CPU
# us and context switches (all its threads) and client1's context switches; the load average.
#   B_MASTER_ARGS="--flag=x" ROUNDS=3 ITERATIONS=1000 ./bench/master_api.sh
#   A_MASTER_ARGS/B_MASTER_ARGS, A_CLIENT_ARGS/B_CLIENT_ARGS: the two variants' extra flags
#   (at least one set; A's default to none).
set -euo pipefail
export MC_AUTH="${MC_AUTH:-0}"
source "$(dirname "$0")/lib.sh"
ROUNDS="${ROUNDS:-3}"
ITERATIONS="${ITERATIONS:-1000}"
# RUNS: lib.sh (default 5).
KEYS="${KEYS:-512}"
VALUE_SIZE="${VALUE_SIZE:-65536}"
A_MASTER_ARGS="${A_MASTER_ARGS:-}"
B_MASTER_ARGS="${B_MASTER_ARGS:-}"
A_CLIENT_ARGS="${A_CLIENT_ARGS:-}"
B_CLIENT_ARGS="${B_CLIENT_ARGS:-}"
if [[ "$A_MASTER_ARGS|$A_CLIENT_ARGS" == "$B_MASTER_ARGS|$B_CLIENT_ARGS" ]]; then
  echo "bench: A and B are the same; set B_MASTER_ARGS and/or B_CLIENT_ARGS (see the header)" >&2
  exit 2
fi

cpu_ticks() {  # utime + stime of a process, clock ticks
  awk '{ print $14 + $15 }' "/proc/$1/stat"
}
switches() {  # voluntary + involuntary context switches of every thread of a process
  cat /proc/"$1"/task/*/status 2>/dev/null |
    awk '/^(voluntary|nonvoluntary)_ctxt_switches/ { s += $2 } END { print s + 0 }'
}
hz="$(getconf CLK_TCK)"
echo "A: master [$A_MASTER_ARGS] client [$A_CLIENT_ARGS]; B: master [$B_MASTER_ARGS]" \
  "client [$B_CLIENT_ARGS]; ROUNDS=$ROUNDS ITERATIONS=$ITERATIONS RUNS=$RUNS" >&2
for ((round = 1; round <= ROUNDS; round++)); do
  for v in A B; do
    margs="${v}_MASTER_ARGS"
    cargs="${v}_CLIENT_ARGS"
    MC_MASTER_ARGS="${!margs}" MC_CLIENT_ARGS="${!cargs} ${MC_CLIENT_ARGS:-}" start_mcstore
    master="$(cat "$MC_RUN_DIR/master.pid")"
    client="$(cat "$MC_RUN_DIR/client1.pid")"
    load="$(cut -d' ' -f1 /proc/loadavg)"
    t0="$(cpu_ticks "$master")" m0="$(switches "$master")" c0="$(switches "$client")"
    out="$(mcbench --client "$CLIENT1_UNIX" --mode both --value_size "$VALUE_SIZE" --batch 16 \
      --keys "$KEYS" --iterations "$ITERATIONS" --runs "$RUNS" --dest shm)"
    t1="$(cpu_ticks "$master")" m1="$(switches "$master")" c1="$(switches "$client")"
    gets=$(((ITERATIONS + 1) * RUNS))  # + each run's warm-up get
    get="$(grep 'summary op=get ' <<<"$out" || true)"
    put="$(grep 'summary op=put ' <<<"$out" || true)"
    awk -v r="$round" -v v="$v" -v l="$load" -v gp50="$(field "$get" p50_ms)" \
      -v gp99="$(field "$get" p99_ms)" -v pp50="$(field "$put" p50_ms)" \
      -v pp99="$(field "$put" p99_ms)" -v cpu="$(((t1 - t0)))" -v hz="$hz" -v n="$gets" \
      -v ms="$((m1 - m0))" -v cs="$((c1 - c0))" 'BEGIN {
        printf "round %d %s load %s get p50 %s p99 %s put p50 %s p99 %s master_cpu_us/get %.0f " \
               "master_cs/get %.2f client1_cs/get %.2f\n", r, v, l, gp50, gp99, pp50, pp99,
               cpu * 1e6 / hz / n, ms / n, cs / n }'
    ./deploy/local-cluster.sh stop >/dev/null
  done
done
