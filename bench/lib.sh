# Shared helpers of bench/run_local.sh and bench/compare.sh (sourced, not run).
# Environment:
#   MC_BUILD_DIR   build directory holding master/mc-master and client/mc-client (default build)
#   MC_BENCH_TOOLS directory holding mc-bench and mc-bench-memcached (default $MC_BUILD_DIR/tools)
#   MC_SEGMENT_SIZE bytes of memory per mc-client (default 1 GiB)
#   RUNS           runs per measurement; tables show medians (default 5)

caller_dir="$PWD"
abs_path() { case "$1" in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$caller_dir/$1" ;; esac; }
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
# Paths from the environment are relative to the caller's directory; defaults to the repo root.
if [[ -n "${MC_BUILD_DIR:-}" ]]; then MC_BUILD_DIR="$(abs_path "$MC_BUILD_DIR")"; else MC_BUILD_DIR="$repo/build"; fi
export MC_BUILD_DIR
if [[ -n "${MC_BENCH_TOOLS:-}" ]]; then tools="$(abs_path "$MC_BENCH_TOOLS")"; else tools="$MC_BUILD_DIR/tools"; fi
export MC_SEGMENT_SIZE="${MC_SEGMENT_SIZE:-1073741824}"
RUNS="${RUNS:-5}"
# One run directory per invocation, so that concurrent benchmarks do not stop each other's
# daemons (absolute: every script and flag takes it as it is).
export MC_RUN_DIR="$repo/bench/run/$$"
started_pids=()

for bin in "$tools/mc-bench" "$MC_BUILD_DIR/master/mc-master" "$MC_BUILD_DIR/client/mc-client"; do
  [[ -x "$bin" ]] || { echo "bench: $bin missing; build: ./deploy/build.sh release mc-bench mc-master mc-client" >&2; exit 1; }
done

cleanup() {
  local pid
  for pid in "${started_pids[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${started_pids[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  if [[ -d "$MC_RUN_DIR" ]]; then
    ./deploy/local-cluster.sh stop >/dev/null 2>&1 || true
    # Keep the raw output (every run's line) next to the run directories.
    [[ -f "$MC_RUN_DIR/bench.log" ]] && cp "$MC_RUN_DIR/bench.log" "bench/run/last-$(basename "$0" .sh).log"
    rm -rf "$MC_RUN_DIR"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ready_field() {  # ready_field FILE KEY
  /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"
}

free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Starts a master and two clients (--prefault so segment page faults stay out of the figures).
# Sets CLIENT1/CLIENT2 (TCP Store addresses) and CLIENT1_UNIX (unix:PATH).
start_mcstore() {
  MC_CLIENT_ARGS="--prefault ${MC_CLIENT_ARGS:-}" ./deploy/local-cluster.sh start 2 >&2
  CLIENT1="$(ready_field "$MC_RUN_DIR/client1.json" grpc)"
  CLIENT2="$(ready_field "$MC_RUN_DIR/client2.json" grpc)"
  CLIENT1_UNIX="unix:$MC_RUN_DIR/client1.sock"
  # The TCP Store listeners want the cluster's token.
  export MCSTORE_TOKEN_FILE="$MC_RUN_DIR/store.token"
}

# fd_socket_of ADDRESS: the fd socket (where shm buffers are passed) of a started client.
fd_socket_of() {
  case "$1" in
    "$CLIENT1") echo "$MC_RUN_DIR/client1.sock.fd" ;;
    "$CLIENT2") echo "$MC_RUN_DIR/client2.sock.fd" ;;
    unix:*) echo "${1#unix:}.fd" ;;
    *) echo "" ;;
  esac
}

# field LINE NAME: the value of NAME=... in a key=value line.
field() {
  tr ' ' '\n' <<<"$1" | sed -n "s|^$2=||p" | head -1
}

# ratio A B: A/B with two decimals ("-" when either is missing or B is zero).
ratio() {
  awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || a == "-" || b == "" || b == "-" || b + 0 == 0) print "-"; else printf "%.2f", a / b }'
}

# mcbench ARGS...: runs mc-bench, keeps its full output in $MC_RUN_DIR/bench.log, prints the
# summary line of op=get (or of --mode put), and "FAILED" lines when an item failed.
mcbench() {
  local out rc=0 prev="" a
  local extra=()
  for a in "$@"; do  # each daemon's fd socket, for its shm buffers
    case "$prev" in
      --client) extra+=(--fd_socket "$(fd_socket_of "$a")") ;;
      --put_client) extra+=(--put_fd_socket "$(fd_socket_of "$a")") ;;
    esac
    prev="$a"
  done
  # The local cluster's daemons (master and clients): their CPU per GB moved is printed too.
  local pids=() f
  for f in "$MC_RUN_DIR"/*.pid; do [[ -e "$f" ]] && pids+=("$(cat "$f")"); done
  if [[ ${#pids[@]} -gt 0 ]]; then extra+=(--cpu_pids "$(IFS=,; echo "${pids[*]}")"); fi
  out="$("$tools/mc-bench" "$@" "${extra[@]}" 2>&1)" || rc=$?
  printf '%s\n' "$out" >>"$MC_RUN_DIR/bench.log"
  if [[ $rc -ne 0 ]]; then
    printf '%s\n' "$out" | grep -E 'error|failed' | head -5 >&2
    echo "bench: mc-bench $* exited $rc" >&2
  fi
  printf '%s\n' "$out" | grep '^mc-bench summary' || true
}

baseline() {  # sets MEMCPY_1M MEMCPY_4M MEMCPY_16M TCP_GBPS
  local out
  out="$("$tools/mc-bench" --baseline --runs "$RUNS")"
  printf '%s\n' "$out" >>"$MC_RUN_DIR/bench.log"
  MEMCPY_1M="$(field "$(grep 'baseline memcpy block=1048576 ' <<<"$out")" GB/s)"
  MEMCPY_4M="$(field "$(grep 'baseline memcpy block=4194304 ' <<<"$out")" GB/s)"
  MEMCPY_16M="$(field "$(grep 'baseline memcpy block=16777216 ' <<<"$out")" GB/s)"
  TCP_GBPS="$(field "$(grep 'baseline tcp ' <<<"$out")" GB/s)"
}

memcpy_for() {  # memcpy_for VALUE_SIZE
  case "$1" in
    1048576) echo "$MEMCPY_1M" ;;
    4194304) echo "$MEMCPY_4M" ;;
    16777216) echo "$MEMCPY_16M" ;;
    *) echo "-" ;;
  esac
}

keys_for() {  # keys_for VALUE_SIZE: distinct keys, at most 512 MiB of data per run
  local k=$(( (512 << 20) / $1 ))
  (( k > 64 )) && k=64
  (( k < 16 )) && k=16
  echo "$k"
}

proc_cpu() {  # proc_cpu PID...: their summed CPU seconds (user + system) from /proc
  local tck pid
  tck="$(getconf CLK_TCK)"
  for pid in "$@"; do cat "/proc/$pid/stat"; done |
    awk -v t="$tck" '{ sub(/^.*\) /, ""); s += $12 + $13 } END { printf "%.2f", s / t }'
}

# plus A B: A+B with three decimals ("-" when either is missing or negative: not measured).
plus() {
  awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || a == "-" || b == "" || b == "-" || a < 0 || b < 0) print "-"; else printf "%.3f", a + b }'
}

mib() { awk -v b="$1" 'BEGIN { if (b >= 1048576) printf "%g MiB", b / 1048576; else printf "%g KiB", b / 1024 }'; }
