#!/usr/bin/env bash
# mcstore against its peers on this machine, for the same gets: values of 1, 4 and 16 MiB, 16 per
# request, all keys preloaded, every figure the median of RUNS runs.
#   mcstore   mc-bench BatchGet into shm slices: local (through the daemon holding the data) and
#             cross (through the other daemon, TCP data plane)
#   memcached mc-bench-memcached: text-protocol `get` of 16 keys per request over loopback TCP,
#             values received straight into destination slots (memcached -I 32m: a 16 MiB value
#             plus its item header does not fit -I 16m)
#   redis     redis-benchmark -t get -P 16 -c 1 over loopback TCP; GB/s = requests/s x value size
#   limits    mc-bench --baseline: memcpy of non-cache-resident blocks, loopback TCP stream
# A second table gives each system's CPU seconds per GB moved (its client and servers together,
# user + system: getrusage and /proc/PID/stat), steadier than GB/s on a shared machine.
# Starts mcstore (deploy/local-cluster.sh), redis-server and memcached on free loopback ports and
# stops all of them on exit. Environment: see bench/lib.sh; SIZES overrides the value sizes.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
SIZES="${SIZES:-1048576 4194304 16777216}"

for bin in redis-server redis-cli redis-benchmark memcached "$tools/mc-bench-memcached"; do
  command -v "$bin" >/dev/null || { echo "compare: $bin missing (./deploy/install-deps.sh --bench; build mc-bench-memcached)" >&2; exit 1; }
done

start_mcstore
mkdir -p "$MC_RUN_DIR"
redis_port="$(free_port)"
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no --maxmemory 6gb \
  --protected-mode no --daemonize no --dir "$MC_RUN_DIR" >"$MC_RUN_DIR/redis.log" 2>&1 &
redis_pid=$!
started_pids+=("$redis_pid")
memcached_port="$(free_port)"
memcached_user=()
[[ $(id -u) -eq 0 ]] && memcached_user=(-u root)
memcached "${memcached_user[@]}" -I 32m -m 4096 -l 127.0.0.1 -p "$memcached_port" -U 0 \
  >"$MC_RUN_DIR/memcached.log" 2>&1 &
memcached_pid=$!
started_pids+=("$memcached_pid")
for _ in $(seq 1 50); do
  redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break
  sleep 0.1
done
for _ in $(seq 1 50); do
  (exec 3<>"/dev/tcp/127.0.0.1/$memcached_port") 2>/dev/null && break
  sleep 0.1
done
echo "compare: mcstore $CLIENT1/$CLIENT2, redis :$redis_port, memcached :$memcached_port; RUNS=$RUNS" >&2

baseline

redis_get() {  # redis_get SIZE KEYS: median GB/s, p50/p99 ms (per request) and CPU s/GB of RUNS runs
  local size="$1" keys="$2" n rps all=() p50s=() p99s=() cpus=() line c0 c1 t
  local TIMEFORMAT='%3U %3S'
  redis-cli -p "$redis_port" flushall >/dev/null
  head -c "$size" /dev/urandom >"$MC_RUN_DIR/value.bin"
  for k in $(seq 0 $((keys - 1))); do
    redis-cli -p "$redis_port" -x set "$(printf 'key:%012d' "$k")" <"$MC_RUN_DIR/value.bin" >/dev/null
  done
  n=$(( (2 << 30) / size )); (( n < 320 )) && n=320
  for _ in $(seq 1 "$RUNS"); do
    c0="$(proc_cpu "$redis_pid")"
    { time redis-benchmark -h 127.0.0.1 -p "$redis_port" -c 1 -P 16 -n "$n" -r "$keys" -t get --csv \
        >"$MC_RUN_DIR/redis.out" 2>/dev/null; } 2>"$MC_RUN_DIR/redis.time"
    c1="$(proc_cpu "$redis_pid")"
    line="$(grep '^"GET' "$MC_RUN_DIR/redis.out")"
    # CPU per GB moved: the server's and redis-benchmark's (user + system), together.
    t="$(cat "$MC_RUN_DIR/redis.time")"
    cpus+=("$(awk -v a="$c0" -v b="$c1" -v t="$t" -v n="$n" -v s="$size" 'BEGIN { split(t, u, " "); printf "%.3f", (b - a + u[1] + u[2]) / (n * s / 1e9) }')")
    echo "redis run size=$size $line" >>"$MC_RUN_DIR/bench.log"
    rps="$(cut -d, -f2 <<<"$line" | tr -d '"')"
    all+=("$(awk -v r="$rps" -v s="$size" 'BEGIN { printf "%.3f", r * s / 1e9 }')")
    p50s+=("$(cut -d, -f5 <<<"$line" | tr -d '"')")
    p99s+=("$(cut -d, -f7 <<<"$line" | tr -d '"')")
  done
  redis-cli -p "$redis_port" flushall >/dev/null
  echo "$(printf '%s\n' "${all[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}') \
$(printf '%s\n' "${p50s[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}') \
$(printf '%s\n' "${p99s[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}') \
$(printf '%s\n' "${cpus[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')"
}

rows=()
cpu_rows=()
for size in $SIZES; do
  keys="$(keys_for "$size")"
  iters=$(( size >= 16777216 ? 8 : 20 ))
  common=(--value_size "$size" --batch 16 --keys "$keys" --iterations "$iters" --runs "$RUNS" --dest shm)
  local_line="$(mcbench --client "$CLIENT1" --mode get "${common[@]}")"
  cross_line="$(mcbench --put_client "$CLIENT1" --client "$CLIENT2" --mode get "${common[@]}")"
  lget="$(field "$local_line" GB/s)"
  cget="$(field "$cross_line" GB/s)"
  mc_out="$("$tools/mc-bench-memcached" --server "127.0.0.1:$memcached_port" --value_size "$size" \
    --batch 16 --keys "$keys" --iterations "$iters" --runs "$RUNS" --key_prefix "s$size" --cpu_pids "$memcached_pid" 2>&1 || true)"
  printf '%s\n' "$mc_out" >>"$MC_RUN_DIR/bench.log"
  mcd_line="$(grep '^memcached summary' <<<"$mc_out" || true)"
  mcd="$(field "$mcd_line" GB/s)"
  [[ -n "$mcd" ]] || { echo "compare: memcached run failed: $(tail -2 <<<"$mc_out")" >&2; mcd="-"; }
  read -r rds rds_p50 rds_p99 rds_cpu <<<"$(redis_get "$size" "$keys")"
  # CPU s per GB moved, each system's client and servers together (mcstore: mc-bench, the master
  # and both daemons; memcached: its client and server; redis: redis-benchmark and the server).
  lcpu="$(plus "$(field "$local_line" cpu_s/GB)" "$(field "$local_line" daemons_cpu_s/GB)")"
  ccpu="$(plus "$(field "$cross_line" cpu_s/GB)" "$(field "$cross_line" daemons_cpu_s/GB)")"
  mcpu="$(plus "$(field "$mcd_line" cpu_s/GB)" "$(field "$mcd_line" server_cpu_s/GB)")"
  cpu_rows+=("$(printf '%-7s %8s %8s %9s %7s | %8s %8s' "$(mib "$size")" "$lcpu" "$ccpu" "$mcpu" \
    "${rds_cpu:--}" "$(ratio "$ccpu" "$mcpu")" "$(ratio "$lcpu" "$mcpu")")")
  mcp="$(memcpy_for "$size")"
  rows+=("$(printf '%-7s %8s %8s %9s %7s %7s %6s | %8s %8s %8s %8s %8s %8s' "$(mib "$size")" \
    "$lget" "$cget" "$mcd" "$rds" "$mcp" "$TCP_GBPS" \
    "$(ratio "$lget" "$mcd")" "$(ratio "$cget" "$mcd")" "$(ratio "$lget" "$rds")" \
    "$(ratio "$cget" "$rds")" "$(ratio "$lget" "$mcp")" "$(ratio "$cget" "$TCP_GBPS")")")
  echo "compare: $(mib "$size") done (redis p50/p99 per request: $rds_p50/$rds_p99 ms)" >&2
done

echo
echo "mcstore vs peers, GET GB/s, batch/pipeline 16, $(date -u +%F), $(nproc) cores, medians of $RUNS runs"
printf '%-7s %8s %8s %9s %7s %7s %6s | %8s %8s %8s %8s %8s %8s\n' value mc_local mc_cross memcached redis memcpy tcp \
  L/mcd X/mcd L/redis X/redis L/memcpy X/tcp
printf '%s\n' "${rows[@]}"
echo "(L = mcstore local path, X = mcstore cross-daemon TCP path, mcd = memcached)"
echo
echo "CPU s per GB moved (user + system of each system's client and servers, medians of $RUNS runs)"
printf '%-7s %8s %8s %9s %7s | %8s %8s\n' value mc_local mc_cross memcached redis X/mcd L/mcd
printf '%s\n' "${cpu_rows[@]}"
echo "(mcstore: mc-bench, the master and both daemons, every byte hashed and checked; memcached and"
echo " redis: no checksum. Lower is cheaper: X/mcd < 1 means the cross path costs less CPU per GB.)"
